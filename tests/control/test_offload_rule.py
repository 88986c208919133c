"""The offload share under the controller: the knob's steps and bounds, the heuristic's rule on
a toy pipeline whose best share is known, memory pressure, and the knob on a real loader."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import state

import drapps
from drapps.control import Action, HeuristicPolicy, State
from drapps.control.knobs import OffloadKnob
from drapps.ops import Pipeline, RandomHorizontalFlip, Spec, ToCHWTensor


def test_the_knob_steps_by_a_quarter_sets_a_float_and_stays_in_bounds() -> None:
    applied: list[float] = []
    knob = OffloadKnob(applied.append)
    at = SimpleNamespace(knob=lambda name: 0.75)
    assert knob.propose(at, +1, {}) == 1.0  # type: ignore[arg-type]
    assert knob.propose(at, +1.0, {}) == 1.0  # type: ignore[arg-type]
    assert knob.propose(at, -1, {}) == 0.5  # type: ignore[arg-type]
    assert knob.propose(at, 0.1, {}) == 0.1  # type: ignore[arg-type]
    assert knob.propose(at, 7.0, {}) == 1.0  # type: ignore[arg-type]
    assert knob.bounds() == (0.0, 1.0)
    held = OffloadKnob(applied.append, adjustable=False)
    assert held.propose(at, +1, {}) == 0.75  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offload step must be in"):
        OffloadKnob(applied.append, step=0.0)


class OffloadWorld:
    """Two saturated CPU workers make ``cpu_rate`` whole samples/s; the device stage finishes
    ``device_rate`` offloaded samples/s; throughput at share r is
    min(consumer, cpu_rate / (1 - r), device_rate / r)."""

    def __init__(self, share: float, cpu_rate: float = 600, device_rate: float = 1200) -> None:
        self.share, self.cpu_rate, self.device_rate = share, cpu_rate, device_rate
        self.consumer = 2000.0
        self.squeezed = 0.0
        self.t = 0.0
        self.history: list[float] = []

    def rate(self, share: float) -> float:
        cpu = self.cpu_rate / (1 - share) if share < 1 else float("inf")
        device = self.device_rate / share if share > 0 else float("inf")
        return min(self.consumer, cpu, device)

    def observe(self) -> State:
        rate, r = self.rate(self.share), self.share
        self.t += 0.5  # a tick
        cpu_util = min(1.0, rate * (1 - r) / self.cpu_rate)
        return state(
            cores=2, cpu_util=cpu_util, idle_cores=2 * (1 - cpu_util), workers=2,
            workers_cpu=2 * cpu_util, wait_fraction=max(0.0, 1 - rate / self.consumer),
            throughput=rate, queue_batches=0, prefetch=4, max_workers=2, split=0,
            offload=self.share, device_stage_share=min(1.0, rate * r / self.device_rate),
            gpu_util=min(1.0, rate * r / self.device_rate),  # a GPU that only runs the stage
            device_squeezed=self.squeezed, t=self.t,
        )  # fmt: skip

    def run(self, policy: HeuristicPolicy, ticks: int) -> list[Action]:
        actions = []
        for _ in range(ticks):
            action = policy.decide(self.observe())
            move = action.other.get("offload")
            if isinstance(move, float):  # a share to set
                self.share = move
            elif move:  # a step
                self.share = min(1.0, max(0.0, self.share + 0.25 * move))
            actions.append(action)
            self.history.append(self.share)
        return actions


def bound() -> HeuristicPolicy:
    policy = HeuristicPolicy()
    policy.bind(("offload",))  # the workers are fixed: only the share moves
    return policy


@pytest.mark.parametrize("start", [0.0, 0.5, 1.0])
def test_the_share_settles_where_workers_and_device_balance(start: float) -> None:
    world = OffloadWorld(start)
    actions = world.run(bound(), ticks=200)
    tail = world.history[-60:]
    # Balance at 2/3 (1,800 samples/s); it stops where both sides read saturated.
    assert all(0.6 <= share <= 0.72 for share in tail)
    assert min(world.rate(share) for share in tail) >= 1550  # 0.5 and 1.0 give 1,200
    moves = [a.reason for a in actions if "offload" in a.other]
    assert moves and "offloading" in moves[0]
    # It got there by halving its step on each reversal: few moves, none after it settled.
    assert len(moves) <= 12


def test_a_device_stage_the_loop_waits_on_gives_samples_back() -> None:
    world = OffloadWorld(1.0, cpu_rate=600, device_rate=700)  # best: 0.5 (1,200/s)
    actions = world.run(bound(), ticks=120)
    first = next(a for a in actions if "offload" in a.other)
    assert first.other["offload"] == 0.75 and "the GPU is saturated" in first.reason
    assert abs(world.history[-1] - 0.5) <= 0.07  # balance: 600/(1-r) = 700/r at r = 0.54


def test_memory_pressure_lowers_the_share_at_once() -> None:
    policy = bound()
    world = OffloadWorld(0.75)
    world.run(policy, ticks=10)
    world.squeezed = 0.5
    before = world.share
    action = policy.decide(world.observe())
    assert action.other["offload"] < before
    assert "short of memory" in action.reason and "of each batch" in action.reason


def test_a_busy_gpu_takes_no_larger_share() -> None:
    class BusyGpu(OffloadWorld):
        def observe(self) -> State:
            import dataclasses

            observed = super().observe()  # the model keeps the GPU busy besides the stage
            return dataclasses.replace(observed, gpu_util=max(0.95, observed.gpu_util or 0))

    world = BusyGpu(0.5)
    world.run(bound(), ticks=100)
    assert max(world.history) <= 0.5  # a saturated GPU has no room for more


def cpu_state(**fields: Any) -> State:
    base = dict(cores=2, workers=2, offload=0.5, split=0, queue_batches=0, prefetch=4,
                max_workers=8, throughput=500.0, t=0.0)  # fmt: skip
    return state(**{**base, **fields})


def decide_after(policy: HeuristicPolicy, observed: State, ticks: int = 8) -> Action:
    for n in range(ticks):
        action = policy.decide(dataclasses.replace(observed, t=0.5 * (n + 1)))
        if "offload" in action.other:
            return action
    return action


def test_on_the_cpu_a_stage_sharing_a_saturated_cpu_gives_samples_back() -> None:
    busy = cpu_state(cpu_util=1.0, idle_cores=0.0, wait_fraction=0.3, device_stage_share=0.4)
    action = decide_after(bound(), busy)
    assert action.other["offload"] == 0.25 and "shares the saturated CPU" in action.reason


def test_on_the_cpu_idle_cores_take_a_share_when_the_workers_cannot() -> None:
    idle = cpu_state(cpu_util=0.5, idle_cores=1.0, wait_fraction=0.3, offload=0.0,
                     device_stage_share=0.0, workers=1)  # fmt: skip
    action = decide_after(bound(), idle)
    assert action.other["offload"] == 0.25 and "cores idle" in action.reason


# -- on a real loader -----------------------------------------------------------------------


class Pictures:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.random.default_rng(i).integers(0, 256, (8, 6, 3), dtype=np.uint8), i


class MoreEachTick:
    """A policy that offloads a quarter more every tick."""

    def decide(self, state: State) -> Action:
        return Action(other={"offload": +1}, reason="test")


def pipeline() -> Pipeline:
    ops = [ToCHWTensor(), RandomHorizontalFlip()]
    return Pipeline(ops, key=0, takes=Spec("array", "uint8", "HWC"))


def test_the_controller_moves_the_share_of_a_real_loader(tmp_path: Any) -> None:
    with drapps.Loader(
        Pictures(), batch_size=4, seed=0, workers=0, transform=pipeline()
    ) as reference:
        expected = list(reference)
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(
        Pictures(), batch_size=4, seed=0, workers=2, transform=pipeline(), split=1,
        offload="auto", policy=MoreEachTick(), control_interval=0.05, trace=trace,
    ) as loader:  # fmt: skip
        assert loader.stats().offload == 0.5  # where "auto" starts
        got = []
        for batch in loader:
            got.append(batch)
            time.sleep(0.02)
        # More epochs until the share has moved all the way and the report has seen enough
        # of the loading (on a loaded machine an epoch may hold fewer ticks than it needs).
        for _ in range(50):
            report = loader.report()
            if loader.stats().offload == 1.0 and not report.startswith(("Only", "A short run")):
                break
            for _batch in loader:
                time.sleep(0.02)
    assert "for 100% of each batch's samples (the share moved between 50% and 100%)" in report
    for left, right in zip(got, expected, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(left, right, strict=True))
    rows = drapps.telemetry.read_trace(trace).rows
    assert {row.applied.get("offload") for row in rows} >= {0.75, 1.0}
    assert all(row.state.offload is not None for row in rows)
