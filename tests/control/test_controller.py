"""The Controller loop with fake actuators: clipping, coupling of prefetch, safety."""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import pytest
from helpers import state

from drapps.control import NOOP, Action, Bounds, Controller, State, Tick


class Knobs:
    def __init__(self, batch_bytes: int = 0) -> None:
        self.calls: list[tuple[str, int]] = []
        self._batch_bytes = batch_bytes

    def resize(self, workers: int) -> None:
        self.calls.append(("resize", workers))

    def set_prefetch(self, depth: int) -> None:
        self.calls.append(("prefetch", depth))

    def batch_bytes(self) -> int:
        return self._batch_bytes


class Scripted:
    def __init__(self, *actions: Action) -> None:
        self.actions = list(actions)

    def decide(self, state: State) -> Action:
        return self.actions.pop(0) if self.actions else NOOP


def controller(policy: object, knobs: Knobs, current: State, **bounds: object) -> Controller:
    limits = {"min_workers": 1, "max_workers": 4, "max_prefetch": 16, **bounds}
    return Controller(lambda: current, policy, knobs, Bounds(**limits))  # type: ignore[arg-type]


def test_actions_are_clipped_to_the_worker_bounds() -> None:
    knobs = Knobs()
    at_max = state(workers=4, prefetch=8)
    tick = controller(Scripted(Action(workers=1)), knobs, at_max).step()
    assert tick.workers == 4 and knobs.calls == []
    at_min = state(workers=1, prefetch=2)
    tick = controller(Scripted(Action(workers=-1)), knobs, at_min).step()
    assert tick.workers == 1 and knobs.calls == []


def test_prefetch_follows_workers_and_the_memory_budget() -> None:
    knobs = Knobs(batch_bytes=2**20)
    current = state(workers=2, prefetch=4, memory_budget=5 * 2**20)
    tick = controller(Scripted(Action(workers=1, prefetch=1)), knobs, current).step()
    # 2 per worker + 1 extra would be 7, but only 5 batches fit the budget.
    assert (tick.workers, tick.prefetch) == (3, 5)
    assert knobs.calls == [("resize", 3), ("prefetch", 5)]


def test_fixed_knobs_are_never_touched() -> None:
    knobs = Knobs()
    ctl = controller(
        Scripted(Action(workers=1, prefetch=1)),
        knobs,
        state(),
        adjust_workers=False,
        adjust_prefetch=False,
    )
    tick = ctl.step()
    assert knobs.calls == [] and (tick.workers, tick.prefetch) == (2, 4)


class Broken:
    def decide(self, state: State) -> Action:
        raise ZeroDivisionError("oops")


def test_a_failing_policy_holds_the_knobs() -> None:
    knobs = Knobs()
    tick = controller(Broken(), knobs, state()).step()
    assert knobs.calls == [] and "policy failed (ZeroDivisionError: oops)" in tick.action.reason


def test_the_thread_ticks_and_stops() -> None:
    ticks: list[Tick] = []
    ctl = Controller(
        lambda: state(),
        Scripted(),
        Knobs(),
        Bounds(1, 4, 16),
        interval=0.01,
        on_tick=ticks.append,
    )
    ctl.start()
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    ctl.stop()
    assert len(ticks) >= 3 and all(t.reward == ticks[0].reward for t in ticks)


def test_a_stopped_controller_copies_and_a_running_one_refuses() -> None:
    ticks: list[Tick] = []
    ctl = Controller(
        lambda: state(), Scripted(), Knobs(), Bounds(1, 4, 16), interval=0.01, on_tick=ticks.append
    )
    twin = copy.deepcopy(ctl)
    assert twin.step().applied == ctl.step().applied
    ctl.start()
    with pytest.raises(TypeError, match="running Controller"):
        copy.deepcopy(ctl)
    ctl.stop()
    twin.start()  # the copy has a stop event of its own
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    twin.stop()
    assert not twin._thread.is_alive()  # type: ignore[union-attr]


def test_bad_bounds_and_interval_are_named() -> None:
    with pytest.raises(ValueError, match="need 1 <= min_workers <= max_workers, got 3, 2"):
        Bounds(3, 2, 8)
    with pytest.raises(ValueError, match="interval must be > 0 seconds, got 0"):
        Controller(lambda: state(), Scripted(), Knobs(), Bounds(1, 2, 8), interval=0)
    assert replace(state(), workers=3).workers == 3


def test_the_controller_binds_the_policy_to_its_adjustable_knobs() -> None:
    from drapps.control.knobs import SplitKnob

    class Recorder:
        bound: tuple[str, ...] = ()

        def bind(self, movable: tuple[str, ...]) -> None:
            self.bound = movable

        def decide(self, state: State) -> Action:
            return NOOP

    policy = Recorder()
    bounds = Bounds(min_workers=1, max_workers=4, max_prefetch=8, adjust_prefetch=False)
    Controller(state, policy, Knobs(), bounds, knobs=[SplitKnob(print, low=0, high=3)])
    assert policy.bound == ("workers", "split")
