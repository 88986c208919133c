"""The bench's budget: the window and the repeats planned from what runs cost, with a fake clock
and made-up costs (no test here times anything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_runs import FakeMachine

from drapps.bench.budget import MARGIN, RESERVE_S, CostModel, Plan, RepeatPlanner
from drapps.bench.report import brief
from drapps.bench.runner import QUICK_BUDGET_S, BenchConfig, run_benchmark
from drapps.bench.verdict import verdict

EVERY = [("a", "x"), ("b", "x"), ("c", "y"), ("d", "y")]
"""A repeat of four runs of two systems, x and y."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def planner(clock: Clock, budget_s: float | None = 100.0, **overrides: int) -> RepeatPlanner:
    settings = {"repeats": 3, "max_repeats": None, "window": 80, "shortest_window": 30}
    settings.update(overrides)
    return RepeatPlanner(budget_s, 0.0, clock=clock, **settings)  # type: ignore[arg-type]


def pilot(plan: RepeatPlanner, clock: Clock, fixed_s: float, per_batch_s: float) -> None:
    """Run the first repeat's first runs (one per system) at the current window."""
    assert plan.start_repeat(0, EVERY, settled=False)
    for levels in (EVERY[0], EVERY[2]):
        wall = fixed_s + per_batch_s * plan.window
        clock.now += wall
        plan.record(levels, wall, per_batch_s * plan.window, plan.window)


def test_the_cost_model_predicts_another_window_and_unseen_runs_from_their_system() -> None:
    model = CostModel()
    assert model.predict(("a", "x"), batches=80) is None  # nothing measured yet
    model.record(("a", "x"), wall_s=6.0, timed_s=4.0, batches=80)  # 2 s fixed, 50 ms a batch
    assert model.predict(("a", "x"), batches=40) == pytest.approx(4.0)
    assert model.predict(("b", "x"), batches=80) == pytest.approx(6.0)  # its system's
    model.record(("c", "y"), wall_s=12.0, timed_s=4.0, batches=80)
    assert model.predict(("e", "z"), batches=80) == pytest.approx(12.0)  # the costliest seen
    assert model.predict(("a", "x"), batches=80, measure_s=10.0) == pytest.approx(12.0)
    with pytest.raises(ValueError, match="wall_s, timed_s and batches must be >= 0"):
        model.record(("a",), wall_s=-1.0, timed_s=0.0, batches=1)


def test_the_cost_model_follows_a_machine_that_gets_slower() -> None:
    model = CostModel()
    model.record(("a",), wall_s=6.0, timed_s=4.0, batches=80)
    model.record(("b",), wall_s=6.0, timed_s=4.0, batches=80)
    assert model.pace == 1.0
    model.record(("a",), wall_s=12.0, timed_s=8.0, batches=80)  # the same run, twice as long
    assert model.pace == pytest.approx(2.0)
    assert model.predict(("b",), batches=80) == pytest.approx(12.0)  # b's last run, scaled


def test_an_idle_machine_keeps_the_repeats_and_the_window_asked() -> None:
    clock = Clock()
    plan = planner(clock)
    pilot(plan, clock, fixed_s=2.0, per_batch_s=0.01)  # 2.8 s a run, 11.2 s a repeat
    assert not plan.choose_window(rest=EVERY[1::2], redo=EVERY[::2], every=EVERY)
    assert (plan.planned, plan.window) == (3, 80)


def test_a_slow_machine_gets_a_shorter_window_before_fewer_repeats() -> None:
    clock = Clock()
    plan = planner(clock)
    pilot(plan, clock, fixed_s=1.0, per_batch_s=0.1)  # 9 s a run at 80 batches: 36 s a repeat
    assert plan.choose_window(rest=EVERY[1::2], redo=EVERY[::2], every=EVERY)
    assert plan.planned == 3 and 30 <= plan.window < 80
    # What was chosen fits: the first repeat's other two runs, its first two again, 2 more.
    per_run = 1.0 + 0.1 * plan.window
    assert (4 * per_run + 2 * 4 * per_run) * (1 + MARGIN) <= 100.0 - RESERVE_S - clock.now
    # One batch more would not.
    longer = 1.0 + 0.1 * (plan.window + 1)
    assert (12 * longer) * (1 + MARGIN) > 100.0 - RESERVE_S - clock.now


def test_a_very_slow_machine_gets_fewer_repeats_and_then_the_shortest_window() -> None:
    clock = Clock()
    plan = planner(clock)
    # 9 s a run at 80 batches, 6.5 s at 30: 3 repeats do not fit even at 30, 2 do at 80.
    pilot(plan, clock, fixed_s=5.0, per_batch_s=0.05)
    assert not plan.choose_window(rest=EVERY[1::2], redo=EVERY[::2], every=EVERY)
    assert (plan.planned, plan.window) == (2, 80)
    clock = Clock()
    plan = planner(clock)
    pilot(plan, clock, fixed_s=30.0, per_batch_s=0.1)  # nothing fits: the quickest end
    assert plan.choose_window(rest=EVERY[1::2], redo=[], every=EVERY)
    assert (plan.planned, plan.window) == (1, 30)
    clock = Clock()
    plan = planner(clock)
    pilot(plan, clock, fixed_s=30.0, per_batch_s=0.1)  # ... which may be not to time them again
    assert not plan.choose_window(rest=EVERY[1::2], redo=EVERY[::2], every=EVERY)
    assert (plan.planned, plan.window) == (1, 80)


def test_a_further_repeat_starts_only_where_it_fits_and_the_verdict_is_open() -> None:
    clock = Clock()
    plan = planner(clock, max_repeats=5)
    pilot(plan, clock, fixed_s=2.0, per_batch_s=0.01)
    plan.choose_window(rest=EVERY[1::2], redo=EVERY[::2], every=EVERY)
    for levels in EVERY[1::2]:
        clock.now += 2.8
        plan.record(levels, 2.8, 0.8, 80)
    plan.end_repeat()
    assert plan.start_repeat(1, EVERY, settled=True)  # within the repeats asked: settled or not
    plan.end_repeat()
    assert plan.start_repeat(2, EVERY, settled=True)
    plan.end_repeat()
    assert not plan.start_repeat(3, EVERY, settled=True)  # past them only while unsettled
    assert plan.start_repeat(3, EVERY, settled=False)
    plan.end_repeat()
    clock.now = 100.0 - RESERVE_S - 11.2  # a repeat of 11.2 s would just fit, not with margin
    assert not plan.start_repeat(4, EVERY, settled=False)
    assert plan.plan().repeats == 4 and not plan.plan().cut


def test_no_budget_runs_exactly_the_repeats_asked() -> None:
    clock = Clock()
    plan = planner(clock, budget_s=None)
    pilot(plan, clock, fixed_s=1000.0, per_batch_s=1.0)
    assert not plan.choose_window(rest=[], redo=EVERY[::2], every=EVERY)
    for repeat in range(1, 3):
        plan.end_repeat()
        assert plan.keep_going(repeat, EVERY) and plan.start_repeat(repeat, EVERY, settled=False)
    plan.end_repeat()
    assert not plan.start_repeat(3, EVERY, settled=False)
    assert plan.plan().describe("the machine was slow") == []


def test_a_repeat_that_no_longer_fits_is_stopped_and_said() -> None:
    clock = Clock()
    plan = planner(clock)
    pilot(plan, clock, fixed_s=2.0, per_batch_s=0.01)
    plan.choose_window(rest=[], redo=EVERY[::2], every=EVERY)
    plan.end_repeat()
    assert plan.start_repeat(1, EVERY, settled=False)
    assert plan.keep_going(1, EVERY)
    clock.now = 100.0 - RESERVE_S - 5.0  # the machine stalled: 4 runs of 2.8 s no longer fit
    assert not plan.keep_going(1, EVERY)
    assert plan.keep_going(0, EVERY)  # the first repeat always runs to its end
    plan.drop_repeat()
    said = plan.plan().describe("the machine was busy")
    assert said[0].startswith("1 repeat instead of 3 to end within the 100 s budget")
    assert "no interval can be given from one repeat" in said[0]
    assert said[1].startswith("1 further repeat was stopped partway")


def test_the_plan_says_what_was_cut_and_round_trips_through_the_json() -> None:
    plan = Plan(
        budget_s=160.0,
        repeats_asked=3,
        repeats=2,
        window_asked=80,
        window=40,
        dropped=0,
        repeat_s=71.4,
        elapsed_s=158.0,
    )
    assert Plan.from_dict(plan.as_dict()) == plan
    (said,) = plan.describe("the machine was busy")
    assert said == (
        "2 repeats instead of 3 and 40 timed batches a run instead of 80 to end within the "
        "160 s budget: the machine was busy; a repeat took 71 s; intervals are wider."
    )
    late = Plan(160.0, 3, 1, 80, 30, 0, 190.0, 200.0)
    assert late.over_budget
    assert late.describe("x")[-1].startswith("the run took 200 s, past its 160 s budget")


def _bench(machine: FakeMachine, tmp_path: Path, **overrides: object) -> dict[str, object]:
    config = BenchConfig.quick(
        workloads=("synthetic",),
        systems=("dataloader", "drapps-heuristic"),
        workers=(1, 2),
        data_dir=tmp_path,
        **overrides,
    )
    return run_benchmark(config, progress=False, run=machine.run, clock=machine.clock, started=0.0)


def _check_one_window_and_paired_repeats(results: dict[str, object], window: int) -> None:
    runs = results["runs"]
    assert isinstance(runs, list) and runs
    assert {len(run["timeline"]) for run in runs} == {window}
    repeats = {(r["scenario"], r["case"]): set() for r in runs}
    for run in runs:
        repeats[run["scenario"], run["case"]].add(run["repeat"])
    assert len({frozenset(r) for r in repeats.values()}) == 1  # every case, the same repeats


def test_on_an_idle_machine_the_quick_bench_runs_what_it_asks(tmp_path: Path) -> None:
    machine = FakeMachine({"*": 2.0, "limit": 1.5}, per_batch_s=0.02)
    results = _bench(machine, tmp_path)
    plan = Plan.from_dict(results["plan"])  # type: ignore[arg-type]
    assert (plan.repeats, plan.window, plan.budget_s) == (3, 80, QUICK_BUDGET_S)
    assert not plan.cut and plan.elapsed_s <= QUICK_BUDGET_S
    _check_one_window_and_paired_repeats(results, 80)
    assert results["config"]["measure_batches"] == 80  # type: ignore[index]
    assert "instead of" not in "\n".join(verdict(results))  # type: ignore[arg-type]


def test_on_a_busy_machine_the_quick_bench_ends_within_its_budget_and_says_so(
    tmp_path: Path,
) -> None:
    # 6 cases and a limit a repeat; a case takes 4 s + 0.1 s a batch: 12 s at 80 batches,
    # 74 s a repeat, 3 repeats well past the 160 s budget, even at 30 batches.
    machine = FakeMachine({"*": 4.0, "limit": 2.0}, per_batch_s=0.1)
    results = _bench(machine, tmp_path)
    plan = Plan.from_dict(results["plan"])  # type: ignore[arg-type]
    assert plan.cut and plan.elapsed_s <= QUICK_BUDGET_S
    assert plan.repeats == 2 and 30 <= plan.window < 80
    _check_one_window_and_paired_repeats(results, plan.window)
    said = "\n".join(verdict(results))  # type: ignore[arg-type]
    assert f"{plan.repeats} repeat" in said and "to end within the 160 s budget" in said
    assert "instead of" in brief(results)  # type: ignore[arg-type]


def test_a_machine_that_slows_down_midway_loses_a_repeat_not_the_budget(tmp_path: Path) -> None:
    # Fast enough for 3 repeats of 80 batches (43.5 s each), until the 17th run of the 21,
    # in the third repeat, from which every run takes 4x as long.
    machine = FakeMachine(
        {"*": 3.0, "limit": 1.5}, per_batch_s=0.05, slow_after=16, slowness_later=4.0
    )
    results = _bench(machine, tmp_path)
    plan = Plan.from_dict(results["plan"])  # type: ignore[arg-type]
    assert plan.elapsed_s <= QUICK_BUDGET_S
    assert (plan.repeats, plan.dropped, plan.window) == (2, 1, 80)
    _check_one_window_and_paired_repeats(results, 80)
    assert {run["repeat"] for run in results["runs"]} == {0, 1}  # type: ignore[attr-defined]
    assert len(results["outside_load"]) == 2  # type: ignore[arg-type]
    assert "1 further repeat was stopped partway" in "\n".join(verdict(results))  # type: ignore[arg-type]


def test_a_machine_too_slow_for_one_repeat_runs_one_at_the_shortest_window_and_says_so(
    tmp_path: Path,
) -> None:
    # 40 s a case at 30 batches, 65 s at 80: the first repeat's other cases alone pass the
    # budget, so it ends as soon as it can: at 30 batches, its first cases timed again.
    machine = FakeMachine({"*": 25.0, "limit": 10.0}, per_batch_s=0.5)
    results = _bench(machine, tmp_path)
    plan = Plan.from_dict(results["plan"])  # type: ignore[arg-type]
    assert (plan.repeats, plan.window) == (1, 30) and plan.over_budget
    _check_one_window_and_paired_repeats(results, 30)
    said = "\n".join(verdict(results))  # type: ignore[arg-type]
    assert "past its 160 s budget" in said and "1 repeat instead of 3" in said
