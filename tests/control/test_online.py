"""Online fine-tuning: off by default, learns in the right direction, stays bounded."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import state

from drapps.control.action import Action
from drapps.control.online import OnlineConfig, OnlineTuner
from drapps.control.policy import make_policy
from drapps.control.rl import ACTIONS, MlpPolicy
from drapps.control.state import State
from drapps.sim import Pipeline, Scenario
from drapps.sim.run import simulate

TARGET = ACTIONS.index(Action(1, 0))


def _small_policy(seed: int = 0) -> MlpPolicy:
    rng = np.random.default_rng(seed)
    sizes = [len(State.FEATURES), 16, len(ACTIONS)]
    return MlpPolicy(
        [(rng.normal(size=(a, b)) * 0.5, np.zeros(b)) for a, b in itertools.pairwise(sizes)]
    )


def _probability(policy: MlpPolicy, s: State, temperature: float) -> float:
    scores = policy.scores(s.vector()) / temperature
    p = np.exp(scores - scores.max())
    return float(p[TARGET] / p.sum())


def test_off_by_default_and_on_by_request() -> None:
    assert isinstance(make_policy("rl"), MlpPolicy)
    assert isinstance(make_policy("rl", online=True), OnlineTuner)
    tuned = make_policy("rl", online=OnlineConfig(max_updates=5))
    assert isinstance(tuned, OnlineTuner) and tuned.config.max_updates == 5
    with pytest.raises(ValueError, match="online must be a bool or an OnlineConfig"):
        make_policy("rl", online="yes")
    with pytest.raises(ValueError, match=r"OnlineConfig\.lr must be > 0"):
        OnlineConfig(lr=0)


def test_it_learns_which_action_pays() -> None:
    # A bandit on a live-like loop: the state after the target action shows 4x throughput.
    # Generous time budgets in these tests: a GC pause on a busy machine must not switch tuning
    # off mid-test (the budget itself is tested below).
    config = OnlineConfig(lr=0.05, max_drift=5.0, budget_s=1.0)
    tuner = OnlineTuner(_small_policy(), config, seed=1)
    s = state(wait_fraction=0.2)
    before = _probability(tuner.policy, s, tuner.config.temperature)
    action = tuner.decide(s)
    for _ in range(600):
        paid = action.workers == 1 and action.prefetch == 0
        action = tuner.decide(state(wait_fraction=0.2, throughput=4000.0 if paid else 1000.0))
    after = _probability(tuner.policy, s, tuner.config.temperature)
    assert after > before + 0.3, (before, after)
    assert tuner.updates == 600


def test_it_stays_bounded_and_can_be_switched_off() -> None:
    policy = _small_policy()
    shipped = [w.copy() for layer in policy.layers for w in layer]
    config = OnlineConfig(lr=1.0, max_drift=0.1, max_updates=50, budget_s=1.0)
    tuner = OnlineTuner(policy, config, seed=0)
    for k in range(200):
        tuner.decide(state(throughput=float(1000 + 900 * (k % 2)), wait_fraction=0.1))
        assert tuner.drift <= 0.1 + 1e-5
    assert tuner.updates == 50  # then it stops learning and decides greedily
    assert np.array_equal(policy.layers[0][0], shipped[0])  # only the output layer moves
    frozen = [w.copy() for w in policy.layers[-1]]
    tuner.enabled = False
    for _ in range(20):
        assert tuner.decide(state()) == policy.decide(state())
    assert all(np.array_equal(a, b) for a, b in zip(frozen, policy.layers[-1], strict=True))


def test_a_slow_update_switches_it_off() -> None:
    tuner = OnlineTuner(_small_policy(), OnlineConfig(budget_s=1e-12))
    tuner.decide(state())
    tuner.decide(state())
    assert tuner.updates == 1 and not tuner.enabled


def test_it_tunes_inside_a_simulated_run() -> None:
    # a generous budget: a GC pause on a busy CI machine must not switch tuning off here
    tuner = OnlineTuner(MlpPolicy.shipped(), OnlineConfig(max_updates=100, budget_s=1.0))
    run = simulate(Scenario(Pipeline(cores=4, cpu_s=0.1, step_s=0.04)), tuner, duration=30.0)
    assert run.samples > 0 and tuner.updates == 59  # every tick after the first
    assert 0 < tuner.drift <= tuner.config.max_drift + 1e-5
