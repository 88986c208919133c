"""The offload share in the simulator: it moves a movable op's cost between the workers and the
device per sample, the controller moves it live, and the held-out ``gpu-decode`` family has it."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.sim import Simulator, simulate
from drapps.sim.families import draw, family_names
from drapps.sim.scenario import PipelineModel, Scenario

DECODE = ((0.08, 0.01),)  # (worker CPU s, device s) per batch


def gpu_pipeline(share: float) -> PipelineModel:
    return PipelineModel(
        cores=2, cpu_s=0.02, step_s=0.01, gpu=True, device_ops=DECODE, split=0, offload=share
    )


def run(share: float) -> Simulator:
    sim = Simulator(Scenario(gpu_pipeline(share)), workers=2, seed=0)
    sim.run_until(20.0)
    return sim


def test_the_share_moves_the_op_between_workers_and_device() -> None:
    states = {share: run(share).observe() for share in (0.0, 0.5, 1.0)}
    # The workers' CPU per sample falls with the share, the device stage's time grows.
    cpu = {s: st.workers_cpu / st.throughput for s, st in states.items()}
    assert cpu[0.0] > cpu[0.5] > cpu[1.0]
    assert states[0.0].device_stage_share == 0.0
    assert 0 < states[0.5].device_stage_share < states[1.0].device_stage_share
    assert states[0.5].offload == 0.5
    # Workers short of two cores: offloading the decode to the idle device pays.
    assert states[1.0].throughput > 1.5 * states[0.0].throughput


def test_a_pipeline_without_a_share_reports_none() -> None:
    sim = Simulator(Scenario(gpu_pipeline(0.5).replace(offload=None)), workers=2, seed=0)
    sim.run_until(2.0)
    assert sim.observe().offload is None


@pytest.mark.parametrize("share", [-0.1, 1.5, "half"])
def test_a_bad_share_is_named(share: object) -> None:
    with pytest.raises(ValueError, match=r"PipelineModel\.offload must be"):
        gpu_pipeline(share)  # type: ignore[arg-type]
    sim = Simulator(Scenario(gpu_pipeline(0.5)), workers=2, seed=0)
    if isinstance(share, float):
        with pytest.raises(ValueError, match="offload must be in"):
            sim.set_offload(share)


def test_the_heuristic_moves_the_share_toward_the_device_when_workers_starve() -> None:
    scenario = Scenario(gpu_pipeline(0.0))
    live = simulate(scenario, "heuristic", duration=30.0, seed=0, move_split=False)
    held = simulate(
        scenario, "heuristic", duration=30.0, seed=0, move_split=False, move_offload=False
    )
    shares = [tick.applied["offload"] for tick in live.ticks]
    assert shares[-1] > 0.5 and all(s == 0.0 for s in (t.applied["offload"] for t in held.ticks))
    assert live.throughput > 1.3 * held.throughput


def test_gpu_decode_is_a_held_out_family_with_a_share() -> None:
    assert "gpu-decode" in family_names(held_out=True)
    scenario = draw("gpu-decode", np.random.default_rng(3), 60.0)
    p = scenario.pipeline
    assert p.gpu and p.split == 0 and p.offload == 0.5 and len(p.device_ops) == 1
    # A competitor for the cores and a heavier model step, each for a while.
    assert any(c.outside_load for c in scenario.changes)
    assert any(c.step_factor and c.step_factor > 1 for c in scenario.changes)


def test_the_learned_policy_may_move_the_share() -> None:
    from drapps.control import Action, State
    from drapps.sim.env import PipelineEnv

    knobs = ("workers", "prefetch", "offload")
    assert len(Action.space(knobs)) == 27
    assert Action.space(("offload",)) == (
        Action(other={"offload": -1}),
        Action(),
        Action(other={"offload": 1}),
    )
    assert Action(other={"offload": 1}).describe(knobs) == "workers+0 prefetch+0 offload+1"
    env = PipelineEnv(["gpu-decode"], duration=10.0, knobs=knobs)
    observation, _ = env.reset(seed=0)
    assert observation.shape == (len(State.features(knobs)),) == (len(State.FEATURES) + 3,)
    up = Action.space(knobs).index(Action(other={"offload": 1}))
    shares = []
    for _ in range(3):
        _, _, _, _, info = env.step(up)
        shares.append(info["offload"])
    assert shares == [0.75, 1.0, 1.0]  # from 0.5, a quarter a step, held at 1
