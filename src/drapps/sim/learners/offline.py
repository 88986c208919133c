"""Offline fine-tuning: real runs' traces become a dataset, and conservative Q-learning (CQL,
from d3rlpy) fine-tunes a simulator-trained policy on it.

A trace row holds the State the controller saw, the knob values after its action was applied,
and the reward of that State. Each pair of successive rows is one transition: the first row's
State, the step each knob actually took (``applied`` minus the State's value, so a clipped or
held move counts as what happened, not what was asked), and the reward of the second row's
State (recomputed with the weights given, so an energy term can be added after the fact).

Why CQL, and why d3rlpy: a trace holds only the actions its policy took. Plain Q-learning
overrates the actions it never saw; CQL pushes their values down, so the tuned policy stays
near what the traces show unless they show something better. d3rlpy's ``DiscreteCQL`` is a
maintained implementation whose Q-network (a tanh MLP encoder and a linear head) is the shape
of drapps' policies, so the simulator-trained weights are its starting point and the result
exports back to an :class:`~drapps.control.rl.MlpPolicy` that runs with NumPy.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from drapps._optional import require
from drapps.control.action import Action
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import MlpPolicy
from drapps.control.state import State
from drapps.telemetry.trace import TraceRow, read_trace, while_loading

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transitions:
    """Transitions from traces, as arrays (one row per transition)."""

    observations: np.ndarray
    """``State.vector(knobs, features)`` of the State each action was taken in."""
    actions: np.ndarray
    """Index of the step each knob took, in ``Action.space(knobs)``."""
    rewards: np.ndarray
    """Reward of the State that followed."""
    timeouts: np.ndarray
    """1.0 on each trace's last transition (a run's end is not a terminal state)."""
    knobs: tuple[str, ...]
    features: tuple[str, ...] = ()
    """The State features of :attr:`observations`, in order."""

    def __len__(self) -> int:
        return len(self.actions)


def _step(row: TraceRow, knob: str) -> int | None:
    """The step ``knob`` took at ``row`` (-1, 0, +1), None where the pipeline lacks it."""
    after, before = row.applied.get(knob), getattr(row.state, knob, None)
    if after is None or before is None:
        return None
    if after == before:
        return 0
    if knob == "codec":  # a step to a smaller entry is +1, as CodecKnob steps
        sizes = row.state.cache_profile
        if after not in sizes or before not in sizes:
            return 0  # "off", or codecs not profiled yet: no step a policy could take
        return 1 if sizes[after][0] < sizes[before][0] else -1
    if knob == "priority":
        return -1 if after == "low" else 1
    return int(np.sign(float(after) - float(before)))


def transitions(
    paths: Sequence[str | os.PathLike[str]],
    knobs: Sequence[str] = ("workers", "prefetch"),
    weights: RewardWeights | None = None,
    features: Sequence[str] | None = None,
) -> Transitions:
    """The transitions of the traces at ``paths`` for a policy moving ``knobs`` and reading
    ``features`` (default: ``State.features(knobs)``).

    Raises:
        ValueError: a file is not a trace (naming it), a trace lacks one of ``knobs`` (a run
            whose pipeline did not have it), or the traces hold no transition at all.
    """
    weights = weights or RewardWeights()
    index = {tuple(a.step(k) for k in knobs): i for i, a in enumerate(Action.space(knobs))}
    obs, actions, rewards, timeouts = [], [], [], []
    for path in paths:
        rows = while_loading(read_trace(path).rows)
        for before, after in itertools.pairwise(rows):
            steps = tuple(_step(before, k) for k in knobs)
            if None in steps:
                missing = knobs[steps.index(None)]
                raise ValueError(
                    f"{path}: its rows have no {missing!r} knob; a policy moving {list(knobs)} "
                    "needs traces of pipelines that have each"
                )
            obs.append(before.state.vector(knobs, features))
            actions.append(index[tuple(int(step or 0) for step in steps)])
            rewards.append(reward(after.state, weights))
            timeouts.append(0.0)
        if len(rows) > 1:
            timeouts[-1] = 1.0
        else:
            logger.warning("%s: fewer than two ticks of loading, nothing to learn from", path)
    if not actions:
        raise ValueError(f"no transitions in {[str(p) for p in paths]}: each trace needs two "
                         "or more ticks of loading")  # fmt: skip
    return Transitions(
        observations=np.asarray(obs, dtype=np.float32),
        actions=np.asarray(actions, dtype=np.int64),
        rewards=np.asarray(rewards, dtype=np.float32),
        timeouts=np.asarray(timeouts, dtype=np.float32),
        knobs=tuple(knobs),
        features=tuple(State.features(knobs) if features is None else features),
    )


@dataclass(frozen=True)
class CqlConfig:
    """Hyperparameters of the offline fine-tuning (d3rlpy's ``DiscreteCQLConfig``)."""

    alpha: float = 1.0
    """Weight of the conservative term (how hard unseen actions are pushed down)."""
    gamma: float = 0.95
    """Discount per controller tick (as in simulator training)."""
    lr: float = 1e-4
    batch: int = 64
    target_every: int = 500
    """Gradient steps between copies of the Q-network into its target."""

    def __post_init__(self) -> None:
        for name in ("alpha", "lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CqlConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.gamma < 1:
            raise ValueError(f"CqlConfig.gamma must be in (0, 1), got {self.gamma!r}")


def _score_scale(policy: MlpPolicy, data: Transitions) -> float:
    """What the policy's scores are multiplied by to start the Q-network: at most 1, and
    small enough that the scores' spread between actions (their standard deviation, averaged
    over the data's States) is no wider than the rewards' own. A policy's scores are logits
    or fitted returns of any scale; one whose actions stand several apart (a rollout policy's
    returns over a temperature) would otherwise take thousands of steps of data to reorder."""
    spread = float(np.mean(np.std(policy.scores(data.observations), axis=1)))
    target = float(np.std(data.rewards))
    if spread <= 0.0 or target <= 0.0:
        return 1.0
    return min(1.0, target / spread)


def finetune(
    policy: MlpPolicy,
    data: Transitions,
    steps: int,
    seed: int = 0,
    config: CqlConfig | None = None,
) -> MlpPolicy:
    """``policy`` fine-tuned by discrete CQL on ``data`` for ``steps`` gradient steps.

    The Q-network starts from the policy's layers, its output shifted by the mean reward's
    discounted sum and its spread between actions cut to at most the rewards' (see
    :func:`_score_scale`), so that its values start near the returns' scale with the policy's
    ranking of actions kept.

    Raises:
        ValueError: a continuous policy, knobs or features that differ from the data's, or
            steps < 1.
    """
    if policy.continuous:
        raise ValueError(
            "offline fine-tuning takes a discrete policy (ppo, ddqn, rollout), not sac's"
        )
    if tuple(policy.knobs) != data.knobs:
        raise ValueError(
            f"the policy moves {list(policy.knobs)} but the transitions are for {list(data.knobs)}"
        )
    if policy.features != data.features:
        raise ValueError(
            f"the policy reads features {list(policy.features)} but the transitions hold "
            f"{list(data.features)}"
        )
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    import torch

    d3rlpy = require("d3rlpy")
    c = config or CqlConfig()
    d3rlpy.seed(seed)
    torch.manual_seed(seed)
    chatter = io.StringIO()  # d3rlpy logs every build and epoch to stdout through structlog
    with contextlib.redirect_stdout(chatter):
        dataset = d3rlpy.dataset.MDPDataset(
            observations=data.observations,
            actions=data.actions,
            rewards=data.rewards,
            terminals=np.zeros_like(data.rewards),
            timeouts=data.timeouts,
            action_space=d3rlpy.ActionSpace.DISCRETE,
            action_size=len(Action.space(policy.knobs)),
        )
    hidden = [int(w.shape[1]) for w, _ in policy.layers[:-1]]
    cql = d3rlpy.algos.DiscreteCQLConfig(
        learning_rate=c.lr,
        batch_size=c.batch,
        gamma=c.gamma,
        alpha=c.alpha,
        target_update_interval=c.target_every,
        encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=hidden, activation="tanh"),
    ).create(device="cpu")
    with contextlib.redirect_stdout(chatter):
        cql.build_with_dataset(dataset)
    q_funcs = cql.impl._modules.q_funcs  # the one critic (n_critics=1)
    shift = float(np.mean(data.rewards)) / (1.0 - c.gamma)
    scale = _score_scale(policy, data)
    with torch.no_grad():
        for q in q_funcs:
            linears = [m for m in q._encoder._layers if isinstance(m, torch.nn.Linear)]
            for linear, (weight, bias) in zip([*linears, q._fc], policy.layers, strict=True):
                linear.weight.copy_(torch.as_tensor(weight.T))
                linear.bias.copy_(torch.as_tensor(bias))
            q._fc.weight.mul_(scale)
            q._fc.bias.mul_(scale).add_(shift)
    cql.impl._modules.targ_q_funcs.load_state_dict(q_funcs.state_dict())
    with contextlib.redirect_stdout(chatter):
        cql.fit(
            dataset,
            n_steps=steps,
            n_steps_per_epoch=min(steps, 1000),
            show_progress=False,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
            save_interval=10**9,
        )
    logger.debug("d3rlpy: %s", chatter.getvalue())
    q = q_funcs[0]
    linears = [m for m in q._encoder._layers if isinstance(m, torch.nn.Linear)]
    layers = [
        (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
        for m in [*linears, q._fc]
    ]
    meta = {
        **policy.meta,
        "offline": {"learner": "cql", "steps": steps, "seed": seed,
                    "transitions": len(data), "alpha": c.alpha},
    }  # fmt: skip
    return MlpPolicy(layers, meta, policy.knobs, features=policy.features)
