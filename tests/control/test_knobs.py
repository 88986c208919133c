"""The knob seam: a new knob plugs into the Controller, State, Action and trace unedited."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import state

from drapps.control import NOOP, Action, Bounds, Controller, State
from drapps.control.knobs import ChoiceKnob, StepKnob
from drapps.control.rl import MlpPolicy
from drapps.telemetry.trace import TraceRow


class ThreadsKnob(StepKnob):
    """A fake knob: intra-op threads of each worker, 1..4."""

    name = "threads"


class Pipeline:
    """What a fake knob turns, and what the controller observes of it."""

    def __init__(self) -> None:
        self.threads = 1
        self.applied: list[int] = []

    def set_threads(self, value: int) -> None:
        self.applied.append(value)
        self.threads = value

    def observe(self) -> State:
        return replace(state(workers=2, prefetch=4), extra={"threads": self.threads})


class MoreThreads:
    def decide(self, state: State) -> Action:
        return Action(other={"threads": 1}, reason="more threads")


def test_a_new_knob_is_observed_moved_clipped_and_recorded() -> None:
    pipe = Pipeline()
    knob = ThreadsKnob(pipe.set_threads, low=1, high=3)
    controller = Controller(pipe.observe, MoreThreads(), None, None, knobs=[knob])
    ticks = [controller.step() for _ in range(4)]
    assert pipe.applied == [2, 3]  # clipped at its bound, applied only when it changes
    assert [t.applied["threads"] for t in ticks] == [2, 3, 3, 3]
    assert ticks[0].state.knob("threads") == 1
    row = TraceRow(0.0, ticks[-1].state, ticks[-1].action, ticks[-1].applied, 0.0)
    back = TraceRow.from_json(row.to_json())
    assert back.applied == {"threads": 3} and back.action.moves() == {"threads": 1}
    assert back.state.extra == {"threads": 3}


def test_a_new_knob_sits_beside_the_default_ones() -> None:
    class Fake:
        calls: list[tuple[str, int]] = []

        def resize(self, workers: int) -> None:
            self.calls.append(("resize", workers))

        def set_prefetch(self, depth: int) -> None:
            self.calls.append(("prefetch", depth))

        def batch_bytes(self) -> int:
            return 0

    pipe = Pipeline()
    policy = type("P", (), {"decide": lambda self, s: Action(workers=1, other={"threads": 1})})
    controller = Controller(
        pipe.observe, policy(), Fake(), Bounds(1, 4, 16),
        knobs=[ThreadsKnob(pipe.set_threads, low=1, high=4)],
    )  # fmt: skip
    tick = controller.step()
    assert tick.applied == {"workers": 3, "prefetch": 6, "threads": 2}
    assert Fake.calls == [("resize", 3), ("prefetch", 6)] and pipe.applied == [2]


def test_a_choice_knob_takes_only_its_choices() -> None:
    class CodecKnob(ChoiceKnob):
        name = "codec"

    chosen: list[str] = []
    knob = CodecKnob(chosen.append, choices=("none", "lz4"))
    current = replace(state(), codec="none")
    controller = Controller(lambda: current, NOOP_POLICY, None, None, knobs=[knob])
    assert controller.act(current, Action(codec="lz4")) == {"codec": "lz4"}
    assert chosen == ["lz4"]
    with pytest.raises(ValueError, match=r"codec must be one of \['none', 'lz4'\], got 'zip'"):
        controller.act(current, Action(codec="zip"))


class _Noop:
    def decide(self, state: State) -> Action:
        return NOOP


NOOP_POLICY = _Noop()


def test_a_state_without_a_knob_says_so() -> None:
    assert state().split is None and state().codec is None
    with pytest.raises(ValueError, match="no knob named 'split'"):
        state().knob("split")


def test_knob_names_are_unique() -> None:
    pipe = Pipeline()
    knobs = [ThreadsKnob(pipe.set_threads, low=1, high=2) for _ in range(2)]
    with pytest.raises(ValueError, match="knob names must be unique"):
        Controller(pipe.observe, NOOP_POLICY, None, None, knobs=knobs)


def test_a_policy_for_other_knobs_is_refused() -> None:
    class SplitPolicy:
        knobs = ("workers", "prefetch", "split")

        def decide(self, state: State) -> Action:
            return NOOP

    class Fake:
        def resize(self, workers: int) -> None: ...
        def set_prefetch(self, depth: int) -> None: ...
        def batch_bytes(self) -> int:
            return 0

    with pytest.raises(
        ValueError, match=r"trained for the knobs .*'split'.* \(missing: \['split'\]\)"
    ):
        Controller(state, SplitPolicy(), Fake(), Bounds(1, 2, 4))


def test_a_policy_file_names_its_knobs_and_other_knobs_are_refused(tmp_path: Path) -> None:
    policy = MlpPolicy.shipped()
    assert policy.knobs == ("workers", "prefetch")
    path = tmp_path / "p.npz"
    policy.save(path)
    with np.load(path) as data:
        arrays: dict[str, Any] = dict(data)
    header = json.loads(str(arrays["header"]))
    assert header["knobs"] == ["workers", "prefetch"]
    header["knobs"] = ["workers", "prefetch", "codec"]
    arrays["header"] = np.asarray(json.dumps(header))
    np.savez(path, **arrays)
    with pytest.raises(
        ValueError, match=r"p\.npz: trained on knobs \['workers', 'prefetch', 'codec'\]"
    ):
        MlpPolicy.load(path)


def test_a_clipped_worker_count_says_what_held_it() -> None:
    from drapps.control.knobs import WorkersKnob

    applied: list[int] = []
    knob = WorkersKnob(applied.append, low=1, high=6, grant=lambda wanted, floor: min(wanted, 3))
    s = state(workers=4)
    assert knob.propose(s, 1, {}) == 3
    assert knob.limited_by == "held to 3 by this loader's share of the host's cores"
    assert knob.propose(state(workers=2), 1, {}) == 3 and knob.limited_by is None
    top = WorkersKnob(applied.append, low=1, high=4)
    assert top.propose(state(workers=4), 1, {}) == 4
    assert top.limited_by == "held to 4 by max_workers"

    class Grow:
        def decide(self, state: State) -> Action:
            return Action(workers=1, reason="grow")

    rows: list[Any] = []
    controller = Controller(
        lambda: s, Grow(), None, None, knobs=[knob], on_tick=rows.append, interval=0.1
    )
    tick = controller.step()
    assert tick.workers == 3 and tick.notes == {"workers": knob.limited_by}
    row = TraceRow(0.0, s, tick.action, dict(tick.applied), 0.0, notes=tick.notes)
    assert TraceRow.from_json(json.loads(json.dumps(row.to_json()))) == row
