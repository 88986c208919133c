"""The gymnasium environment: API conformance, determinism, and the shared reward."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env

from drapps.control.action import Action
from drapps.control.reward import reward
from drapps.control.state import State
from drapps.sim import PipelineModel, Scenario
from drapps.sim.env import PipelineEnv


def test_passes_gymnasiums_env_checker() -> None:
    env = PipelineEnv(duration=10.0)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(State.FEATURES),)
    assert env.action_space.n == len(Action.space())


def _rollout(seed: int, actions: list[int]) -> list[tuple[np.ndarray, float]]:
    env = PipelineEnv(duration=10.0)
    obs, _ = env.reset(seed=seed)
    out = [(obs, 0.0)]
    for a in actions:
        obs, r, _, _, _ = env.step(a)
        out.append((obs, r))
    return out


def test_same_seed_same_episode() -> None:
    actions = [int(a) for a in np.random.default_rng(0).integers(9, size=19)]
    a, b, c = _rollout(3, actions), _rollout(3, actions), _rollout(4, actions)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c, strict=True))


def test_a_branch_replays_the_episode_and_leaves_it_as_it_was() -> None:
    env = PipelineEnv(["consumer-shift"], duration=30.0)
    env.reset(seed=2)
    for _ in range(10):
        env.step(7)  # a worker more each tick: batches in flight at the branch
    here = env.state

    def run(branch: PipelineEnv, action: int) -> tuple[list[np.ndarray], list[float]]:
        ticks = [branch.step(action) for _ in range(12)]
        return [t[0] for t in ticks], [t[1] for t in ticks]

    grow, again, shed = run(env.branch(), 7), run(env.branch(), 7), run(env.branch(), 1)
    assert all(np.array_equal(a, b) for a, b in zip(grow[0], again[0], strict=True))
    assert grow[1] == again[1] != shed[1]
    assert env.state is here
    # the original goes on as a fresh branch would: nothing of the copies reached it
    assert run(env, 7)[1] == grow[1]
    with pytest.raises(RuntimeError, match="reset"):
        PipelineEnv().branch()


def test_reward_is_the_shared_reward_and_episodes_truncate() -> None:
    env = PipelineEnv(duration=5.0, interval=0.5)
    env.reset(seed=1)
    steps = 0
    while True:
        obs, r, terminated, truncated, _ = env.step(4)  # the no-op: (0, 0)
        steps += 1
        assert env.state is not None and r == reward(env.state)
        assert np.array_equal(obs, env.state.vector())
        assert not terminated
        if truncated:
            break
    assert steps == 9  # reset observed the first interval


def test_actions_move_the_simulated_pool_within_bounds() -> None:
    env = PipelineEnv(random_start=False)
    scenario = Scenario(PipelineModel(cores=2, cpu_s=0.05, step_s=0.01))
    env.reset(seed=0, options={"scenario": scenario})
    add = Action.space().index(Action(1, 0))
    for _ in range(8):
        _, _, _, _, info = env.step(add)
    assert info["workers"] == 8  # started at one per core, clipped at the loader's bound
    remove = Action.space().index(Action(-1, 0))
    for _ in range(9):
        _, _, _, _, info = env.step(remove)
    assert info["workers"] == 1


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="scenario family must be one of"):
        PipelineEnv(["no-such-family"])
    with pytest.raises(ValueError, match="duration >= interval"):
        PipelineEnv(duration=0.1, interval=0.5)
    env = PipelineEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must be an int in \[0, 9\)"):
        env.step(9)
    with pytest.raises(ValueError, match="must be a Scenario"):
        env.reset(options={"scenario": "cpu-bound"})


def test_the_split_is_an_action_where_the_scenario_has_movable_ops() -> None:
    knobs = ("workers", "prefetch", "split")
    env = PipelineEnv(["device-offload"], duration=10.0, knobs=knobs)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(State.FEATURES) + 1,)
    assert env.action_space.n == 27
    env.reset(seed=0)
    earlier = env.actions.index(Action(split=-1))
    splits = [env.step(earlier)[4]["split"] for _ in range(5)]
    assert splits == [2, 1, 0, 0, 0]  # one op per step, clipped at the first movable op


def test_the_lookahead_is_an_action_that_doubles_and_halves_the_pools() -> None:
    knobs = ("workers", "prefetch", "lookahead")
    env = PipelineEnv(["slow-reads"], duration=10.0, knobs=knobs, random_start=False)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(State.FEATURES) + 2,)
    assert env.action_space.n == 27
    env.reset(seed=0)
    further = env.actions.index(Action(other={"lookahead": 1}))
    nearer = env.actions.index(Action(other={"lookahead": -1}))
    first = env.step(further)[4]["lookahead"]
    assert env.step(further)[4]["lookahead"] == 2 * first
    assert env.step(nearer)[4]["lookahead"] == first
    continuous = PipelineEnv(["slow-reads"], duration=10.0, knobs=knobs, continuous=True)
    continuous.reset(seed=0)
    assert continuous.state is not None and continuous.state.lookahead is not None
    start = continuous.state.lookahead
    assert continuous.step(np.array([0.0, 0.0, 1.0], dtype=np.float32))[4]["lookahead"] == 2 * start


def test_the_codec_steps_through_the_caches_codecs_by_size() -> None:
    knobs = ("workers", "prefetch", "codec")
    env = PipelineEnv(["cached-epochs"], duration=20.0, knobs=knobs, random_start=False)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(State.FEATURES) + len(State.CODEC_FEATURES),)
    env.reset(seed=1)
    assert env.scenario is not None and env.scenario.pipeline.cache is not None
    by_size = [
        c.name for c in sorted(env.scenario.pipeline.cache.codecs, key=lambda c: -c.stored_bytes)
    ]
    smaller = env.actions.index(Action(other={"codec": 1}))
    larger = env.actions.index(Action(other={"codec": -1}))
    codecs = [env.step(smaller)[4]["codec"] for _ in range(3)]
    assert codecs == [by_size[1], by_size[2], by_size[2]]  # one codec a step, then held
    assert env.step(larger)[4]["codec"] == by_size[1]
    obs = env.step(env.actions.index(Action()))[0]
    size_share = obs[len(State.FEATURES) + State.CODEC_FEATURES.index("codec_size_share")]
    sizes = {c.name: c.stored_bytes for c in env.scenario.pipeline.cache.codecs}
    assert size_share == pytest.approx(sizes[by_size[1]] / sizes[by_size[0]], rel=1e-4)


def test_the_workers_priority_is_an_action_that_only_goes_down() -> None:
    knobs = ("workers", "prefetch", "priority")
    env = PipelineEnv(["cpu-consumer"], duration=10.0, knobs=knobs, random_start=False)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    hold = env.actions.index(Action())
    lower = env.actions.index(Action(other={"priority": -1}))
    raise_ = env.actions.index(Action(other={"priority": 1}))
    # Steered by the agent, the knob's own rule rests however busy the loop is.
    assert [env.step(hold)[4]["priority"] for _ in range(12)] == ["normal"] * 12
    obs, _, _, _, info = env.step(lower)
    assert info["priority"] == "low" and obs[-1] == 1.0
    assert env.step(raise_)[4]["priority"] == "low"  # niceness is not lowered again
    assert env.state is not None and env.state.priority == "low"
