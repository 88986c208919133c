"""Learners: prioritized replay, and tiny training runs that must beat a random policy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.learners import learner_names, make_learner
from drapps.sim.learners.replay import PrioritizedReplay, SumTree


def test_sum_tree_finds_leaves_by_cumulative_priority() -> None:
    tree = SumTree(5)
    for leaf, p in enumerate([1.0, 0.0, 3.0, 2.0, 4.0]):
        tree.update(leaf, p)
    assert tree.total == pytest.approx(10.0)
    assert [tree.find(v) for v in (0.5, 1.5, 3.9, 4.5, 5.9, 6.5, 9.9)] == [0, 2, 2, 3, 3, 4, 4]
    tree.update(2, 0.5)
    assert tree.total == pytest.approx(7.5) and tree.find(1.2) == 2


def test_prioritized_replay_samples_by_priority_with_importance_weights() -> None:
    replay = PrioritizedReplay(100, 2, alpha=1.0)
    for i in range(100):
        replay.add(np.full(2, i, dtype=np.float32), i % 9, float(i), np.zeros(2), False)
    # priority 1.001 for one transition against 0.011 for each of the 99 others: about half
    replay.update(np.arange(100), np.where(np.arange(100) == 7, 1.0, 0.01))
    rng = np.random.default_rng(0)
    indices, weights = replay.sample(64, beta=1.0, rng=rng)
    assert 0.35 < np.mean(indices == 7) < 0.65
    assert weights[indices == 7].max() < weights[indices != 7].min()  # rare ones weigh more
    assert weights.max() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplay(4, 2).sample(1, 0.5, rng)


def _mean_reward(env: PipelineEnv, act, episodes: int = 6) -> float:
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
    return total / episodes


@pytest.mark.slow  # its duration is the machine's speed: run with `make test-slow`
@pytest.mark.timeout(900)
def test_a_tiny_training_run_beats_a_random_policy() -> None:
    env = PipelineEnv(["cpu-bound", "io-latency"], duration=15.0)
    policy = make_learner("ddqn").train(env, 3000, seed=0)
    assert isinstance(policy, MlpPolicy) and policy.meta["learner"] == "ddqn"
    rng = np.random.default_rng(0)
    random = _mean_reward(env, lambda obs: int(rng.integers(9)))
    trained = _mean_reward(env, lambda obs: int(np.argmax(policy.scores(obs))))
    assert trained > random + 0.5, (trained, random)


def test_ppo_exports_the_actor_it_trained() -> None:
    # PPO needs far more steps than a unit test has to beat random (docs/sim.md); here the
    # exported NumPy policy must act exactly as stable-baselines3's deterministic actor.
    pytest.importorskip("stable_baselines3")
    env = PipelineEnv(["cpu-bound"], duration=10.0)
    learner = make_learner("ppo")
    policy = learner.train(env, 256, seed=0)
    obs = np.random.default_rng(0).uniform(0, 1, size=(50, 14)).astype(np.float32)
    expected, _ = learner.model.predict(obs, deterministic=True)  # type: ignore[attr-defined]
    assert np.array_equal(np.argmax(policy.scores(obs), axis=1), expected)


def test_unknown_learner_is_named() -> None:
    assert learner_names() == ["ddqn", "ppo"]
    with pytest.raises(ValueError, match=r"learner must be one of \['ddqn', 'ppo'\]"):
        make_learner("dqn")
