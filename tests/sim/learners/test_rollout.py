"""Rollout policy iteration: actions compared on copies of one simulated moment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")

from drapps.control.action import Action
from drapps.control.policy import make_policy
from drapps.control.rl import MlpPolicy
from drapps.control.state import State
from drapps.sim import PipelineModel, Scenario
from drapps.sim.env import PipelineEnv
from drapps.sim.learners import make_learner
from drapps.sim.learners.rollout import (
    Labels,
    RolloutConfig,
    RolloutPolicyIteration,
    branch_return,
    fit,
    label_episode,
    nearest,
    regret,
)

# Reads wait 0.2 s on storage and cost little CPU: on 2 cores, more workers keep more reads
# in flight and the loop, stepping 10 ms, waits less.
READS = Scenario(PipelineModel(cores=2, cpu_s=0.01, read_s=0.2, step_s=0.01))


def _started(scenario: Scenario, ticks: int) -> PipelineEnv:
    env = PipelineEnv(random_start=False, duration=30.0)
    env.reset(seed=0, options={"scenario": scenario})
    for _ in range(ticks):
        env.step(4)
    return env


def test_a_branch_return_tells_actions_apart_and_leaves_the_episode_alone() -> None:
    env = _started(READS, 4)
    here = env.state
    heuristic = make_policy("heuristic")
    grow, _ = branch_return(env, heuristic, Action(workers=1), 10, 0.95)
    again, _ = branch_return(env, heuristic, Action(workers=1), 10, 0.95)
    shed, steps = branch_return(env, heuristic, Action(workers=-1), 10, 0.95)
    assert grow == again  # the same draws after the same action
    assert grow > shed + 0.1 and steps == 10
    assert env.state is here


def test_an_episode_is_labelled_every_few_ticks_with_one_return_per_action() -> None:
    env = PipelineEnv(["io-latency"], duration=10.0)
    config = RolloutConfig(horizon=4, every=5)
    labels = label_episode(env, make_policy("heuristic"), config, seed=3)
    assert labels.features.shape == (4, len(env.observation_space.low))
    assert labels.returns.shape == (4, len(env.actions)) and labels.own.shape == (4,)
    assert labels.steps == 20 + 4 * len(env.actions) * 4
    again = label_episode(env, make_policy("heuristic"), config, seed=3)
    assert np.array_equal(labels.returns, again.returns)  # seeded: the same labels


def test_a_policy_file_followed_gives_its_scores_and_the_heuristic_none() -> None:
    env = PipelineEnv(["cpu-bound"], duration=5.0)
    config = RolloutConfig(horizon=2, every=5)
    shipped = MlpPolicy.shipped()
    labels = label_episode(env, shipped, config, seed=0)
    assert labels.prior is not None and labels.prior.shape == labels.returns.shape
    assert np.allclose(labels.prior.sum(axis=1), 0.0, atol=1e-4)  # less their mean
    scores = shipped.scores(
        labels.features[:, [State.features().index(f) for f in shipped.features]]
    )
    assert np.allclose(labels.prior, scores - scores.mean(axis=1, keepdims=True), atol=1e-5)
    assert label_episode(env, make_policy("heuristic"), config, seed=0).prior is None


def test_the_followed_policys_action_is_found_by_its_steps_of_the_agents_knobs() -> None:
    actions, knobs = Action.space(), ("workers", "prefetch")
    moved = Action(workers=1, prefetch=-1, codec="lz4", reason="the heuristic's")
    assert actions[nearest(moved, actions, knobs)] == Action(workers=1, prefetch=-1)
    assert actions[nearest(Action(reason="hold"), actions, knobs)] == Action()


def _labels(keep_best: float) -> Labels:
    """States whose best action is to grow above the middle of feature 0 and to shed below,
    the followed policy holding, which is worse by ``keep_best``."""
    rng = np.random.default_rng(0)
    features = rng.uniform(size=(2000, 5)).astype(np.float32)
    returns = rng.normal(0, 0.01, size=(2000, 9)).astype(np.float32)
    best = np.where(features[:, 0] > 0.5, 7, 1)
    returns[np.arange(2000), best] += 1.0
    returns[:, 4] += 1.0 - keep_best
    return Labels(features, returns, np.full(2000, 4))


def test_the_fitted_network_scores_the_best_action_highest_unless_kept() -> None:
    labels = _labels(keep_best=0.3)
    net = fit(labels, RolloutConfig(fit_steps=1500), seed=0)
    scores = net(torch.as_tensor(labels.features)).detach().numpy()
    assert regret(scores, labels.returns) < 0.03
    assert regret(np.tile(np.eye(9)[4], (2000, 1)), labels.returns) > 0.25  # always holding
    kept = fit(labels, RolloutConfig(fit_steps=3000, temperature=1.0, keep=0.5), seed=0)
    assert np.all(kept(torch.as_tensor(labels.features)).detach().numpy().argmax(axis=1) == 4)


def test_a_followed_policys_scores_hold_where_returns_differ_by_less_than_the_temperature() -> None:
    labels = _labels(keep_best=0.3)
    prior = np.zeros_like(labels.returns)
    prior[:, 4] = 2.0  # the followed policy holds, by 2 in score
    scored = Labels(labels.features, labels.returns, labels.own, prior)
    x = torch.as_tensor(labels.features)
    for temperature, chosen in ((0.05, "best"), (1.0, "held")):
        net = fit(scored, RolloutConfig(fit_steps=1500, temperature=temperature), seed=0)
        picks = net(x).detach().numpy().argmax(axis=1)
        # 0.3 of return is 6 in score at 0.05, more than the 2 held; 0.3 at 1.0, less
        held = np.mean(picks == 4)
        assert held > 0.99 if chosen == "held" else held < 0.1


def _episode_reward(env: PipelineEnv, act: Callable[[np.ndarray], int]) -> float:
    total = 0.0
    for episode in range(6):
        obs, _ = env.reset(seed=1000 + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
    return total / 6


@pytest.mark.timeout(300)  # a minute with both cores busy
def test_a_small_training_run_beats_holding_and_random_actions() -> None:
    env = PipelineEnv(["io-latency"], duration=10.0)
    # Rollouts continue with the heuristic, which itself grows a starving pool of slow reads
    # in a try or two: 10 ticks after a branch tell the actions apart, 6 hardly.
    config = RolloutConfig(horizon=10, every=4, iterations=2, processes=1, fit_steps=1500)
    policy = RolloutPolicyIteration(config).train(env, 12_000, seed=0)
    assert isinstance(policy, MlpPolicy) and policy.meta["learner"] == "rollout"
    assert [r["round"] for r in policy.meta["rounds"]] == [0, 1]
    assert policy.meta["rounds"][1]["states"] > policy.meta["rounds"][0]["states"]
    rng = np.random.default_rng(0)
    trained = _episode_reward(env, lambda obs: int(np.argmax(policy.scores(obs))))
    held = _episode_reward(env, lambda obs: 4)
    random = _episode_reward(env, lambda obs: int(rng.integers(9)))
    assert trained > max(held, random) + 2.0, (trained, held, random)  # 120, 114, 108


def test_the_learner_is_registered_and_bad_settings_are_named() -> None:
    assert isinstance(make_learner("rollout"), RolloutPolicyIteration)
    with pytest.raises(ValueError, match="horizon must be >= 1"):
        RolloutConfig(horizon=0)
    with pytest.raises(ValueError, match="explore must be in"):
        RolloutConfig(explore=1.5)
    with pytest.raises(ValueError, match="keep must be >= 0"):
        RolloutConfig(keep=-0.1)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        RolloutConfig(temperature=0)


class _Reads:
    """A family of one scenario, given as a generator (as a TraceFamily is)."""

    name = "reads"

    def __call__(self, rng: np.random.Generator, duration: float) -> Scenario:
        return READS


def test_an_episode_unbranched_records_states_with_no_returns() -> None:
    env = PipelineEnv(["io-latency"], duration=10.0)
    config = RolloutConfig(horizon=4, every=5)
    labels = label_episode(env, MlpPolicy.shipped(), config, seed=3, branch=False)
    assert labels.features.shape == (4, len(env.observation_space.low))
    assert not labels.returns.any() and labels.steps == 20  # no copies run
    assert labels.prior is not None


def test_finetune_moves_the_policy_where_the_target_pays_and_holds_it_elsewhere(
    tmp_path: Path,
) -> None:
    """From a policy that always holds: on the reads scenario growing pays, and the fine-tuned
    policy grows there; over the anchor's States it still holds."""
    env = PipelineEnv(duration=10.0)
    width, actions = len(env.observation_space.low), len(env.actions)
    rng = np.random.default_rng(0)
    bias = np.zeros(actions)
    bias[env.actions.index(Action())] = 1.0  # holds, by about 1 in score, whatever it reads
    holding = MlpPolicy(
        [(rng.normal(0, 0.3, (width, 64)), np.zeros(64)),
         (rng.normal(0, 0.2, (64, 64)), np.zeros(64)),
         (rng.normal(0, 0.01, (64, actions)), bias)],
        {"learner": "test"},
    )  # fmt: skip
    start = tmp_path / "hold.npz"
    holding.save(start)
    target = PipelineEnv([_Reads()], duration=10.0, random_start=False)
    anchor = PipelineEnv(["cpu-bound"], duration=10.0)
    config = RolloutConfig(
        start=str(start), horizon=6, every=4, processes=1, fit_steps=1500, temperature=0.05
    )
    learner = RolloutPolicyIteration(config)
    tuned = learner.finetune(target, anchor, episodes=2, anchor_episodes=4, seed=0)
    done = learner.history[-1]
    assert done["states"] == 2 * 5 and done["anchor_states"] == 4 * 5
    assert done["regret"] < done["followed_regret"]
    assert done["anchor_agreement"] > 0.9
    assert tuned.meta["finetune"]["start"] == str(start) and tuned.meta["learner"] == "test"
    obs, _ = target.reset(seed=5)
    assert env.actions[int(np.argmax(tuned.scores(obs)))].step("workers") == 1
    with pytest.raises(ValueError, match="discrete policy file over the environment's actions"):
        RolloutPolicyIteration(RolloutConfig(start="heuristic")).finetune(
            target, anchor, 1, 1, seed=0
        )


def test_a_fit_makes_at_most_the_passes_asked_for() -> None:
    labels = _labels(keep_best=0.3)
    with pytest.raises(ValueError, match="passes must be > 0"):
        RolloutConfig(passes=0)
    steps: list[int] = []
    original = torch.optim.Adam.step

    def count(self: torch.optim.Adam, *args: object, **kwargs: object) -> object:
        steps.append(1)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.Adam, "step", count)
        fit(labels, RolloutConfig(fit_steps=1500, passes=10, batch=200), seed=0)
        assert len(steps) == 100  # 10 passes over 2,000 States, 200 at a time
        steps.clear()
        fit(labels, RolloutConfig(fit_steps=50, passes=10, batch=200), seed=0)
        assert len(steps) == 50
