"""The reference trainer's parts: one optimizer step, an evaluation, and the run's report."""

from __future__ import annotations

import contextlib
import math
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from drapps.reference.config import TrainConfig, TrainReport
from drapps.reference.recipes import Recipe
from drapps.train.accumulation import AdaptiveAccumulation
from drapps.train.checkpointing import CheckpointedSequential, saved_activations
from drapps.train.precision import MixedPrecision
from drapps.train.schedule import WarmupCosine
from drapps.train.switch import OffSwitch


@dataclass
class Setup:
    """Everything a run trains with, made once by :meth:`Trainer.run`."""

    recipe: Recipe
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: WarmupCosine | None
    amp: MixedPrecision
    accumulation: AdaptiveAccumulation
    switches: dict[str, OffSwitch]
    """Off-switches by piece ("amp", "checkpointing"), each timed on and off once."""
    stack: CheckpointedSequential | None
    device: torch.device
    world: int


@dataclass(frozen=True)
class Step:
    """What one optimizer step did."""

    seconds: float
    """Wall time of the step (the slowest rank's while an off-switch is on trial)."""
    items: int
    """Items (samples or tokens) this rank trained on."""
    loss: float
    activation_bytes: int
    """Most bytes autograd kept for backward on one micro-batch, when asked to count them."""


class StepRunner:
    """Runs optimizer steps over groups of micro-batches, with the off-switches' trials.

    One trial at a time, so that two trials never share their on/off pattern; a piece waiting
    for its trial stays on.
    """

    def __init__(self, setup: Setup) -> None:
        self.setup = setup

    def trial(self) -> OffSwitch | None:
        """The off-switch being timed now, if any."""
        return next((s for s in self.setup.switches.values() if s.decided is None), None)

    def enabled(self, name: str) -> bool:
        switch = self.setup.switches.get(name)
        if switch is None or (switch.decided is None and switch is not self.trial()):
            return True
        return switch.enabled

    def run(self, group: list[Any], *, count_activations: bool = False) -> Step:
        """One optimizer step over ``group``'s micro-batches."""
        s = self.setup
        use_amp = self.enabled("amp")
        if s.stack is not None:
            s.stack.enabled = self.enabled("checkpointing")
        on_trial = self.trial()
        start = time.perf_counter()
        counts = [s.recipe.items(batch) for batch in group]
        total = sum(counts)
        sums, activation_bytes = [], 0
        for batch, count in zip(group, counts, strict=True):
            with s.accumulation.micro_batch(count):
                probe = saved_activations() if count_activations else contextlib.nullcontext()
                autocast = s.amp.autocast() if use_amp else contextlib.nullcontext()
                with probe as counter, autocast:
                    loss_sum = s.recipe.loss_sum(s.model, batch, s.device)
                if counter is not None:
                    activation_bytes = max(activation_bytes, counter.bytes)
                s.amp.backward(loss_sum / total)
            sums.append(float(loss_sum.detach()))
        s.accumulation.step(s.optimizer, s.amp)
        if s.scheduler is not None:
            s.scheduler.step()
        if s.device.type == "cuda" and s.switches:
            torch.cuda.synchronize(s.device)
        seconds = time.perf_counter() - start
        if on_trial is not None:
            if s.world > 1:
                # Every rank must reach the same verdict: they share the slowest rank's time.
                slowest = torch.tensor([seconds], device=s.device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                seconds = float(slowest)
            on_trial.record(seconds, total)
        return Step(seconds, total, sum(sums) / total, activation_bytes)


class Evaluator:
    """Mean quality of a model over (the first ``max_batches``) evaluation batches."""

    def __init__(self, recipe: Recipe, loader: Any, max_batches: int | None) -> None:
        self.recipe, self.loader, self.max_batches = recipe, loader, max_batches

    def __call__(self, model: torch.nn.Module, device: torch.device, amp: MixedPrecision) -> float:
        model.eval()
        loss_sum, correct, items = 0.0, 0, 0
        try:
            with torch.no_grad(), amp.autocast():
                for i, batch in enumerate(self.loader):
                    if self.max_batches is not None and i >= self.max_batches:
                        break
                    batch_loss, batch_correct, batch_items = self.recipe.evaluate_batch(
                        model, batch, device
                    )
                    loss_sum += batch_loss
                    correct += batch_correct
                    items += batch_items
        finally:
            model.train()
        return self.recipe.score(loss_sum, correct, items)


@dataclass
class History:
    """What the run measured so far, step by step."""

    train_seconds: float = 0.0
    items: int = 0
    """Items trained on, all ranks."""
    activation_bytes: int = 0
    losses: list[float] = field(default_factory=list)
    times: list[tuple[float, int]] = field(default_factory=list)
    """(seconds, items of all ranks) per step."""
    evaluations: list[tuple[int, float, float]] = field(default_factory=list)
    time_to_target: float | None = None
    quality: float | None = None

    def add(self, step: Step, world: int) -> None:
        self.train_seconds += step.seconds
        self.items += step.items * world
        self.activation_bytes = max(self.activation_bytes, step.activation_bytes)
        self.losses.append(step.loss)
        self.times.append((step.seconds, step.items * world))

    def evaluated(self, step: int, quality: float, reached: Callable[[float], bool]) -> None:
        self.quality = quality
        self.evaluations.append((step, self.train_seconds, quality))
        if self.time_to_target is None and reached(quality):
            self.time_to_target = self.train_seconds

    def progress_line(
        self, step: int, window: int, setup: Setup, peak_bytes: int, items_unit: str
    ) -> str:
        """The progress line over the last ``window`` steps."""
        recent, times = self.losses[-window:], self.times[-window:]
        seconds = sum(t for t, _ in times)
        items = sum(n for _, n in times)
        noise = setup.accumulation.noise_scale
        error = setup.accumulation.noise_scale_error
        noise_text = ""
        if noise is not None and math.isfinite(noise):
            noise_text = f" B_noise {noise:,.0f}"
            if error is not None and math.isfinite(error):
                noise_text += f" +-{error:.0%}"
        return (
            f"step {step:5d}  loss {sum(recent) / len(recent):.4f}  "
            f"{len(times) / seconds:.2f} steps/s  {items / seconds:,.0f} {items_unit}/s  "
            f"k {setup.accumulation.k}{noise_text}  "
            f"lr {setup.optimizer.param_groups[0]['lr']:.2e}  mem {peak_bytes / 2**20:,.0f} MiB"
        )


def build_report(
    config: TrainConfig, model_name: str, setup: Setup, history: History
) -> TrainReport:
    """The run's :class:`TrainReport`, with what the adaptive pieces decided."""
    peak, kind = peak_memory(setup.device)
    decisions = [s.verdict for s in setup.switches.values()]
    if setup.amp.fell_back:
        decisions.append("amp: fp16 loss scale collapsed; fell back to bf16")
    if not setup.accumulation.measuring and config.accumulate == "gns":
        decisions.append(
            f"accumulation: noise scale measurement switched off at k={setup.accumulation.k} "
            f"({setup.accumulation.switched_off or 'closed'})"
        )
    elif setup.accumulation.measure_every > 1 and config.accumulate == "gns":
        decisions.append(
            f"accumulation: noise scale measured on one step in "
            f"{setup.accumulation.measure_every} ({setup.accumulation.switched_off})"
        )
    settings = {k: v for k, v in asdict(config).items() if k not in ("data", "recipe")}
    recipe = setup.recipe
    return TrainReport(
        recipe=recipe.name,
        model=model_name,
        settings=settings,
        steps=config.max_steps,
        items=history.items,
        train_seconds=history.train_seconds,
        throughput=history.items / history.train_seconds,
        items_unit=recipe.items_unit,
        peak_memory_bytes=peak,
        memory_kind=kind,
        quality_name=recipe.quality,
        final_quality=history.quality,
        time_to_target=history.time_to_target,
        final_k=setup.accumulation.k,
        activation_bytes=history.activation_bytes,
        noise_scale=setup.accumulation.noise_scale,
        noise_scale_error=setup.accumulation.noise_scale_error,
        decisions=decisions,
        evaluations=history.evaluations,
    )


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak memory of the run and what was measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA max allocated"
    # ru_maxrss is KiB on Linux: the training process's peak resident set (workers not included).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "CPU peak RSS"


class Contention:
    """Another process that keeps one core busy during steps ``[start, stop)`` of a run (the
    load a shared machine puts on the loader and the training step). Always stopped by
    :meth:`close`."""

    def __init__(self, steps: tuple[int, int] | None) -> None:
        self.steps = steps
        self._hog: subprocess.Popen[bytes] | None = None

    def at(self, step: int) -> None:
        """Start or stop the busy process as ``step`` begins."""
        if self.steps is None:
            return
        start, stop = self.steps
        if start <= step < stop and self._hog is None:
            self._hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        elif step >= stop:
            self.close()

    def close(self) -> None:
        if self._hog is not None:
            self._hog.kill()
            self._hog.wait()
            self._hog = None
