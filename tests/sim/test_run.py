"""Runs through the real Controller, baselines, metrics, and the evaluation table."""

from __future__ import annotations

import pytest

from drapps.control.action import Action
from drapps.control.state import State
from drapps.sim import Change, PipelineModel, Scenario
from drapps.sim.evaluate import evaluate
from drapps.sim.run import oracle_static, simulate

# 2 cores, workers need ~1.5 cores to feed the step: 1 worker starves the loop.
PIPE = PipelineModel(cores=2, cpu_s=0.06, step_s=0.04, cost_cv=0.1)


def test_heuristic_grows_a_starved_pool_like_the_real_loader() -> None:
    run = simulate(Scenario(PIPE), "heuristic", duration=30.0, workers="auto")
    assert run.policy == "heuristic" and len(run.ticks) == 60
    assert run.ticks[0].state.workers == 2  # auto starts at one per core
    static1 = simulate(Scenario(PIPE), duration=30.0, workers=1)
    assert static1.policy == "static-1" and static1.final_workers == 1
    assert run.throughput > 1.3 * static1.throughput
    assert run.wait_fraction < static1.wait_fraction


def test_oracle_static_is_the_best_fixed_count() -> None:
    scenario = Scenario(PIPE)
    oracle = oracle_static(scenario, duration=20.0)
    for n in (1, 2, 3, 4):
        assert oracle.throughput >= simulate(scenario, duration=20.0, workers=n).throughput


def test_dataloader_default_makes_batches_in_the_loop() -> None:
    inline = simulate(Scenario(PIPE), duration=20.0, workers=0)
    # each batch costs make (0.06) + step (0.04) in turn
    assert inline.throughput == pytest.approx(32 / 0.1, rel=0.08)
    assert inline.wait_fraction == pytest.approx(0.6, abs=0.06)


def test_replay_applies_a_recorded_schedule() -> None:
    schedule = [(1, 2)] * 20 + [(3, 6)] * 20
    run = simulate(Scenario(PIPE), duration=20.0, workers=1, schedule=schedule)
    assert run.policy == "replay"
    # applied after tick 20, so seen from tick 21 on
    assert [t.state.workers for t in run.ticks][19:22] == [1, 1, 3]
    with pytest.raises(ValueError, match="first worker count"):
        simulate(Scenario(PIPE), workers="auto", schedule=schedule)


def test_a_policy_that_raises_never_stops_the_simulated_pipeline() -> None:
    class Broken:
        def decide(self, state: State) -> Action:
            raise RuntimeError("boom")

    run = simulate(Scenario(PIPE), Broken(), duration=5.0)
    assert run.samples > 0 and all(t.workers == 2 for t in run.ticks)


def test_convergence_after_a_change() -> None:
    shift = Scenario(PIPE.replace(cpu_s=0.02), (Change(at=20.0, step_factor=2.0),))
    run = simulate(shift, duration=40.0, workers=2)
    start, after = run.convergence_s()
    assert start <= 4.0 and after <= 6.0  # a static pool settles as soon as the step does


def test_evaluation_table_compares_policies_on_the_same_scenarios() -> None:
    result = evaluate({"heuristic": "heuristic"}, ["cpu-bound"], episodes=2, duration=20.0)
    table = result.table()["cpu-bound"]
    assert set(table) == {"oracle-static", "dataloader", "heuristic"}
    assert table["oracle-static"]["relative"] == pytest.approx(1.0)
    assert table["dataloader"]["relative"] < table["heuristic"]["relative"]
    assert "| cpu-bound |" in result.markdown()
    with pytest.raises(ValueError, match="baselines must be among"):
        evaluate({}, ["cpu-bound"], baselines=["best"])
