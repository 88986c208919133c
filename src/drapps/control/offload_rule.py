"""The heuristic's offload rule: move the share of each batch finished in the device stage
toward the point where the workers and the device are equally short.

The share trades the workers' CPU for the device's time, so which side to move to is seen
directly, without a trial: a loop that waits while the workers' cores are saturated and the
device has time to spare wants more of each batch on the device; a saturated device (a GPU
over ``device_busy``, or the stage's thread busy ``stage_full`` of the time) beside workers
with cores to spare wants less; both saturated, or neither, is a balance to keep. So the rule
acts on each clear reading, as a bisection does: it moves a quarter at first, halves its step
on every reversal (down to 1/32) and doubles it again on two moves the same way, so it
settles between two steps and still follows a phase change (a competitor taking cores, a
heavier model step) within a few moves. After a move it holds at least ``hold`` ticks, and
until the batches in flight and ready when it moved have reached the loop (they were made
with the old share, so until then the readings say nothing of the new one). Under device
memory pressure (batches staged in pieces) it moves down at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from drapps.control.knobs import OFFLOAD_STEP

MIN_STEP = 1 / 32


@dataclass
class OffloadRule:
    """The offload choice (state kept between ticks: the step, the last move)."""

    wait_high: float = 0.05
    wait_low: float = 0.02
    cpu_busy: float = 0.9
    device_busy: float = 0.9
    stage_full: float = 0.8
    hold: int = 3
    step: float = OFFLOAD_STEP
    last_direction: int = 0
    last_change: int = -(10**9)
    until: float = -math.inf
    """State time before which the batches made with the last share are not all in yet."""

    def choose(
        self,
        tick: int,
        share: float,
        *,
        wait: float,
        cpu_util: float,
        idle_cores: float,
        gpu_util: float | None,
        stage_share: float,
        squeezed: float,
        now: float = 0.0,
        turnover_s: float = 0.0,
    ) -> tuple[float, str] | None:
        """``(share, reason)`` to move to, or None to hold (readings: means over the
        recent ticks; ``now``: the State's time; ``turnover_s``: how long until a batch
        dispatched now reaches the loop, past the ready ones)."""
        if squeezed > 0 and share > 0:
            why = f"the device is short of memory ({squeezed:.0%} of batches staged in pieces)"
            return self._move(tick, share, -1, why, now + turnover_s)
        if tick - self.last_change < self.hold or now < self.until:
            return None
        stage_full = stage_share >= self.stage_full
        cpu_full = cpu_util >= self.cpu_busy
        waits = wait > self.wait_high
        if gpu_util is None:
            direction, why = self._on_the_cpu(share, waits, cpu_full, stage_full, idle_cores)
        else:
            direction, why = self._on_the_gpu(
                share,
                wait,
                cpu_util,
                gpu_util,
                stage_share,
                cpu_full=cpu_full,
                stage_full=stage_full,
            )
        if direction == 0:
            return None
        return self._move(tick, share, direction, why, now + turnover_s)

    def _on_the_gpu(
        self,
        share: float,
        wait: float,
        cpu_util: float,
        gpu_util: float,
        stage_share: float,
        *,
        cpu_full: bool,
        stage_full: bool,
    ) -> tuple[int, str]:
        """The rule beside a GPU: it takes samples while the workers' CPU is the bottleneck
        and gives them back while the GPU is."""
        gpu_full = stage_full or gpu_util >= self.device_busy
        if wait > self.wait_high and cpu_full and not gpu_full and share < 1:
            return +1, (
                f"training loop waited {wait:.0%} on saturated workers (CPU {cpu_util:.0%}) "
                f"beside a GPU {gpu_util:.0%} busy"
            )
        if gpu_full and not cpu_full and share > 0 and stage_share > 0.01:
            return -1, (
                f"the GPU is saturated ({gpu_util:.0%} busy, the stage {stage_share:.0%} of "
                f"the time) while the workers' CPU is not ({cpu_util:.0%})"
            )
        return 0, ""

    def _on_the_cpu(
        self, share: float, waits: bool, cpu_full: bool, stage_full: bool, idle_cores: float
    ) -> tuple[int, str]:
        """The rule when the device stage runs on the training process's CPU: it helps only
        with cores the workers leave idle, and a stage sharing a saturated CPU with them only
        adds its own overhead."""
        if waits and not cpu_full and idle_cores >= 0.5 and not stage_full and share < 1:
            return +1, (
                f"training loop waited with {idle_cores:.1f} cores idle beside the workers: "
                "the device stage on the CPU takes some of their work"
            )
        if share > 0 and ((waits and cpu_full) or (stage_full and not cpu_full)):
            where = "shares the saturated CPU" if cpu_full else "is saturated"
            return -1, f"the device stage on the CPU {where}"
        return 0, ""

    def _move(
        self, tick: int, share: float, direction: int, why: str, until: float
    ) -> tuple[float, str]:
        if self.last_direction == -direction:
            self.step = max(MIN_STEP, self.step / 2)
        elif self.last_direction == direction:
            self.step = min(OFFLOAD_STEP, self.step * 2)
        self.last_direction, self.last_change, self.until = direction, tick, until
        target = min(1.0, max(0.0, share + direction * self.step))
        return target, f"{why}: offloading {target:.0%} of each batch"
