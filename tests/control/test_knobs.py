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
    controller = Controller(pipe.observe, MoreThreads(), knobs=[knob])
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
    controller = Controller(lambda: current, NOOP_POLICY, knobs=[knob])
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
        Controller(pipe.observe, NOOP_POLICY, knobs=knobs)


def test_a_policy_runs_without_its_situational_knobs_and_needs_the_pool_ones() -> None:
    class SplitPolicy:
        knobs = ("workers", "prefetch", "split")

        def decide(self, state: State) -> Action:
            return Action(workers=1, split=-1)

    class Fake:
        workers: list[int] = []

        def resize(self, workers: int) -> None:
            self.workers.append(workers)

        def set_prefetch(self, depth: int) -> None: ...
        def batch_bytes(self) -> int:
            return 0

    fake = Fake()
    controller = Controller(lambda: state(workers=1), SplitPolicy(), fake, Bounds(1, 2, 4))
    tick = controller.step()  # no split here: that move is dropped, the rest applies
    assert fake.workers == [2] and "split" not in tick.applied
    pipe = Pipeline()
    with pytest.raises(
        ValueError,
        match=r"trained for the knobs .*'workers'.* \(missing: \['workers', 'prefetch'\]\)",
    ):
        Controller(
            pipe.observe,
            SplitPolicy(),
            knobs=[ThreadsKnob(pipe.set_threads, low=1, high=2)],
        )


def test_a_policy_file_names_its_knobs_and_other_knobs_are_refused(tmp_path: Path) -> None:
    policy = MlpPolicy.shipped()
    assert policy.knobs == ("workers", "prefetch")
    path = tmp_path / "p.npz"
    policy.save(path)
    with np.load(path) as data:
        arrays: dict[str, Any] = dict(data)
    header = json.loads(str(arrays["header"]))
    assert header["knobs"] == ["workers", "prefetch"]
    header["knobs"] = ["workers", "prefetch", "threads"]
    arrays["header"] = np.asarray(json.dumps(header))
    np.savez(path, **arrays)
    with pytest.raises(
        ValueError, match=r"p\.npz: trained on knobs \['workers', 'prefetch', 'threads'\]"
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
    controller = Controller(lambda: s, Grow(), knobs=[knob], on_tick=rows.append, interval=0.1)
    tick = controller.step()
    assert tick.workers == 3 and tick.notes == {"workers": knob.limited_by}
    row = TraceRow(0.0, s, tick.action, dict(tick.applied), 0.0, notes=tick.notes)
    assert TraceRow.from_json(json.loads(json.dumps(row.to_json()))) == row


def test_a_codec_step_moves_by_entry_size_and_never_turns_the_cache_off() -> None:
    from drapps.control.knobs import CodecKnob

    applied: list[str] = []
    knob = CodecKnob(applied.append, choices=("zstd", "raw", "lz4", "off"))
    unprofiled = state(codec="raw")
    assert knob.propose(unprofiled, 1, {}) == "raw"  # no sizes yet: a step holds
    profile = {"zstd": [900.0, 4.0, 0.8], "raw": [3000.0, 0.0, 0.1], "lz4": [1500.0, 1.0, 0.3]}
    sized = state(codec="raw", cache_profile=profile)
    assert knob.by_size(sized) == ["raw", "lz4", "zstd"]
    assert knob.propose(sized, 1, {}) == "lz4" and knob.propose(sized, -1, {}) == "raw"
    smallest = state(codec="zstd", cache_profile=profile)
    assert knob.propose(smallest, 1, {}) == "zstd"  # not "off"
    assert knob.propose(state(codec="off", cache_profile=profile), -1, {}) == "off"
    assert knob.propose(sized, "off", {}) == "off"  # a name still sets it (the rule's way)
    held = CodecKnob(applied.append, choices=("raw", "lz4"), adjustable=False)
    assert held.propose(sized, 1, {}) == "raw"


def test_a_policy_trained_on_the_priority_moves_it_and_its_rule_rests() -> None:
    from drapps.control.knobs import PriorityKnob

    class Lower:
        knobs = ("priority",)

        def __init__(self, move: int) -> None:
            self.move = move

        def decide(self, state: State) -> Action:
            return Action.of_steps({"priority": self.move})

    busy = state(workers=2, prefetch=4, main_cpu=1.0, cpu_util=1.0)
    ruled, steered = [], []
    rule = PriorityKnob(ruled.append, window=2)
    controller = Controller(lambda: busy, _Noop(), knobs=[rule])
    assert [controller.step().applied["priority"] for _ in range(3)] == ["normal", "low", "low"]
    knob = PriorityKnob(steered.append, window=2)
    controller = Controller(lambda: busy, Lower(0), knobs=[knob])
    assert knob.steered  # the Controller handed it to the policy
    assert [controller.step().applied["priority"] for _ in range(4)] == ["normal"] * 4
    controller.policy = Lower(-1)
    assert controller.step().applied["priority"] == "low" and steered == ["low"]
    controller.policy = Lower(1)
    tick = controller.step()
    assert tick.applied["priority"] == "low" and "cannot be lowered again" in tick.notes["priority"]
