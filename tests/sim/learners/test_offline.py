"""Offline fine-tuning: traces of real runs become transitions, and CQL learns from them."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import BusyDataset

import drapps
from drapps.cli import main
from drapps.control.action import Action
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import MlpPolicy
from drapps.control.state import State
from drapps.telemetry import read_trace

pytest.importorskip("d3rlpy")

from drapps.sim.learners.offline import Transitions, _score_scale, finetune, transitions


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run under the learned policy, a tick every 50 ms."""
    path = tmp_path_factory.mktemp("offline") / "run.jsonl"
    with drapps.Loader(
        BusyDataset(10**6, 0.001), batch_size=8, workers="auto", policy="rl",
        control_interval=0.05, trace=path,
    ) as loader:  # fmt: skip
        start = time.monotonic()
        for _ in loader:
            if len(read_trace(path).rows) >= 12 or time.monotonic() - start > 30:
                break
    return path


def test_a_trace_becomes_the_transitions_that_happened(trace: Path) -> None:
    rows = read_trace(trace).rows
    data = transitions([trace, trace])
    per_trace = len(data) // 2
    assert len(data) == 2 * per_trace and per_trace >= 8
    assert data.timeouts.tolist() == ([0.0] * (per_trace - 1) + [1.0]) * 2
    space = Action.space(("workers", "prefetch"))
    for k in range(per_trace):
        before, after = rows[k], rows[k + 1]
        took = space[data.actions[k]]
        # the step each knob took, as applied (a clipped move counts as what happened)
        assert took.workers == np.sign(before.applied["workers"] - before.state.workers)
        assert took.prefetch == np.sign(before.applied["prefetch"] - before.state.prefetch)
        assert data.rewards[k] == pytest.approx(reward(after.state), rel=1e-5)
        assert np.array_equal(data.observations[k], before.state.vector())
    # the workers' priority is a knob of a pool of processes: a trace holds its steps too
    knobs = ("workers", "prefetch", "priority")
    steered = transitions([trace], knobs)
    assert len(steered) == per_trace
    for k in range(per_trace):
        before = rows[k]
        assert before.state.priority in ("normal", "low")
        lowered = before.applied["priority"] != before.state.priority
        assert Action.space(knobs)[steered.actions[k]].step("priority") == -lowered
    # rewards are recomputed, so an energy term can be added after the run
    greener = transitions([trace], weights=RewardWeights(energy=1.0))
    assert np.all(greener.rewards <= data.rewards[:per_trace] + 1e-6)
    assert np.any(greener.rewards < data.rewards[:per_trace])


def test_bad_traces_are_named(trace: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"run\.jsonl: its rows have no 'split' knob"):
        transitions([trace], ("workers", "prefetch", "split"))
    junk = tmp_path / "junk.jsonl"
    junk.write_text("hello\n")
    with pytest.raises(ValueError, match=r"junk\.jsonl"):
        transitions([junk])


def bandit(n: int = 600, seed: int = 0) -> Transitions:
    """Every action tried in random states; only 'workers+1 prefetch-1' pays."""
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, 9, size=n)
    features = MlpPolicy.shipped().features
    return Transitions(
        observations=rng.uniform(0, 1, size=(n, len(features))).astype(np.float32),
        actions=actions,
        rewards=np.where(actions == 6, 1.0, 0.0).astype(np.float32),
        timeouts=np.tile([0.0] * 9 + [1.0], n // 10).astype(np.float32),
        knobs=("workers", "prefetch"),
        features=features,
    )


@pytest.mark.slow  # 1,500 gradient steps: its duration is the machine's speed
@pytest.mark.timeout(600)
def test_cql_fine_tuning_moves_the_policy_to_the_action_that_pays() -> None:
    data = bandit()
    assert Action.space()[6] == Action(workers=1, prefetch=-1)
    rng = np.random.default_rng(1)
    sizes = [len(data.features), 64, 64, 9]  # the shipped policy's shape, trained elsewhere
    start = MlpPolicy(
        [(rng.normal(0, 0.3, (a, b)), rng.normal(0, 0.3, b)) for a, b in itertools.pairwise(sizes)],
        {"learner": "ppo"},
        features=data.features,
    )
    before = np.mean(start.scores(data.observations).argmax(axis=1) == 6)
    tuned = finetune(start, data, steps=1500, seed=0)
    after = np.mean(tuned.scores(data.observations).argmax(axis=1) == 6)
    assert before < 0.5 and after > 0.9, (before, after)
    assert tuned.meta["offline"]["transitions"] == len(data) and tuned.knobs == start.knobs
    # The shipped policy's scores stand further apart than one step's rewards: they are cut
    # to the rewards' spread first, so a few hundred transitions can reorder them.
    shipped = MlpPolicy.shipped()
    spread = np.mean(np.std(shipped.scores(data.observations), axis=1))
    assert spread > np.std(data.rewards)  # the premise
    scale = _score_scale(shipped, data)
    assert scale * spread == pytest.approx(np.std(data.rewards), rel=1e-4)
    assert _score_scale(start, replace(data, rewards=np.zeros_like(data.rewards))) == 1.0


def test_fine_tuning_refuses_what_it_cannot_tune() -> None:
    data = bandit(n=20)
    start = MlpPolicy.shipped()
    with pytest.raises(ValueError, match="steps must be >= 1"):
        finetune(start, data, steps=0)
    with pytest.raises(ValueError, match="the policy moves"):
        finetune(start, replace(data, knobs=("workers",)), steps=1)
    with pytest.raises(ValueError, match="the policy reads features"):
        finetune(start, replace(data, features=State.features()[::-1]), steps=1)
    width = len(State.features())
    sac = MlpPolicy([(np.zeros((width, 2)), np.zeros(2))], continuous=True)
    with pytest.raises(ValueError, match="not sac's"):
        finetune(sac, data, steps=1)


def test_train_policy_offline_writes_a_tuned_policy(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tuned.npz"
    assert main(["train-policy", "--offline", str(trace), "--steps", "50", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fine-tuning the shipped policy offline (CQL) for 50 steps" in text
    assert "Signatures" not in text and "epoch=" not in text  # none of d3rlpy's log lines
    tuned = MlpPolicy.load(out)
    assert tuned.meta["offline"]["traces"] == ["run.jsonl"] and tuned.meta["offline"]["steps"] == 50
    assert main(["train-policy", "--offline", str(trace), "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    assert main(["train-policy", "--offline", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in capsys.readouterr().err
