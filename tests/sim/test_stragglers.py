"""The simulator's heavy-tailed sample costs: batches cut into parts, the lookahead knob."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.sim import PipelineModel, Scenario, Simulator
from drapps.sim.families import draw


def slow_reads(dispatch: str) -> PipelineModel:
    # 5% of samples wait 60x a typical one on storage; the step takes 30 ms.
    return PipelineModel(
        cores=8, cpu_s=0.0, read_s=0.126, step_s=0.03, slow_share=0.05, slow_factor=60,
        dispatch=dispatch, cost_cv=0.0, transport_s=0.0,
    )  # fmt: skip


def run(model: PipelineModel, workers: int, seconds: float = 120.0) -> tuple[float, float]:
    sim = Simulator(Scenario(model), workers=workers, seed=0)
    sim.run_until(seconds)
    return sim.totals.samples / seconds, sim.totals.wait_s / seconds


def test_the_mean_cost_stays_the_model_s_whatever_the_tail() -> None:
    uniform = run(PipelineModel(cores=8, cpu_s=0.0, read_s=0.126, step_s=0.001, cost_cv=0.0), 4)
    tailed = run(slow_reads("batches").replace(step_s=0.001), 4)
    assert tailed[0] == pytest.approx(uniform[0], rel=0.05)


@pytest.mark.parametrize(("workers", "gain"), [(4, 1.04), (5, 1.0)])
def test_parts_keep_a_straggler_from_holding_its_batch(workers: int, gain: float) -> None:
    # 4 workers are short of the step's pace, 5 just reach it: cut batches gain throughput
    # in the first and leave the loop (almost) no wait in the second.
    whole, parts = run(slow_reads("batches"), workers), run(slow_reads("samples"), workers)
    assert parts[0] > gain * whole[0]
    assert parts[1] < 0.6 * whole[1]


def test_the_lookahead_is_a_knob_of_the_simulator_as_of_the_loader() -> None:
    sim = Simulator(Scenario(slow_reads("samples")), workers=2, seed=0)
    assert sim.lookahead == 2 * sim.prefetch and sim.observe().lookahead == sim.lookahead
    sim.set_lookahead(3)
    sim.run_until(1.0)
    assert sim.observe().lookahead == 3 and sim.observe().sample_tail == 60
    with pytest.raises(ValueError, match="lookahead must be >= 1"):
        sim.set_lookahead(0)


def test_bad_tail_settings_are_named() -> None:
    with pytest.raises(ValueError, match="slow_factor"):
        PipelineModel(cores=2, slow_factor=0.5)
    with pytest.raises(ValueError, match="dispatch"):
        PipelineModel(cores=2, dispatch="parts")


def test_the_stragglers_family_is_held_out_and_cuts_batches() -> None:
    scenario = draw("stragglers", np.random.default_rng(0), 30.0)
    assert scenario.pipeline.cuts and scenario.pipeline.sample_tail >= 10
    sim = Simulator(scenario, workers=2, seed=0)
    sim.run_until(10.0)
    assert sim.totals.samples > 0
