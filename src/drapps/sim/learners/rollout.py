"""Rollout policy iteration: every action tried from the same simulated moment.

PPO and DDQN read an action's worth from the one trajectory that followed it, through the
noise of everything else that happened there: a worker shed while the loop is fed gains a few
hundredths of reward a tick, less than a tick's throughput moves by itself, and neither
learner tells the two apart. The simulator can do what a real machine cannot: copy a moment
(:meth:`PipelineEnv.branch`). Here each labelled State is copied once per action; every copy
takes its action, then follows the same policy for ``horizon`` ticks with the same random
draws (common random numbers), so two actions' returns differ by what the actions did. A
network is fitted to the followed policy's scores plus those returns over a temperature (the
policy ``pi(a|s) * exp(advantage / temperature)``, which keeps the followed policy's ranking
except where the returns say otherwise), and the next round's copies follow it: approximate
policy iteration, as in Lagoudakis and Parr's "Reinforcement learning as classification"
(2003), with a KL-regularised improvement step. The first round follows ``start``, the
heuristic by default, or a policy file (``drapps train-policy --learner rollout --from``):
a policy that takes the best action against a policy's returns is at least as good as that
policy (the policy improvement theorem), as far as the returns are measured and fitted well.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np
import torch
from torch import nn

from drapps.control.action import Action
from drapps.control.policy import Policy, make_policy
from drapps.control.rl import MlpPolicy
from drapps.sim.env import PipelineEnv
from drapps.sim.learners._base import Learner, export_mlp, register_learner, tanh_mlp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutConfig:
    """Hyperparameters of :class:`RolloutPolicyIteration`."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the network (the shipped policy's shape)."""
    gamma: float = 0.95
    """Discount per controller tick."""
    horizon: int = 20
    """Ticks each copy runs: its action, then ``horizon - 1`` of the followed policy's."""
    every: int = 5
    """Ticks between labelled States along an episode."""
    explore: float = 0.2
    """Share of an episode's ticks that take a random action, so that the labelled States
    include ones the policy would not reach by itself."""
    iterations: int = 3
    """Rounds of labelling and fitting; each round's copies follow the last round's network."""
    start: str = "heuristic"
    """The policy the first round follows: a policy name or a policy file (``.npz``)."""
    temperature: float = 0.3
    """Return per unit of score. An action's target score is the followed policy's score
    for it plus its return over the State's mean divided by this: the policy that follows
    from ``pi(a|s) * exp(advantage / temperature)``, the best trade of return against
    distance (KL) from the followed policy. Small: the returns decide; large: the followed
    policy's ranking stays except where returns differ by more."""
    keep: float = 0.0
    """The score of the followed policy's own action where that policy has no scores of
    its own (the heuristic; a policy file's scores are used as they are)."""
    aggregate: bool = True
    """Fit each round on every round's States so far (False: on its own)."""
    lr: float = 1e-3
    fit_steps: int = 20_000
    """Gradient steps per fit (minibatches of ``batch`` States)."""
    batch: int = 256
    passes: float | None = None
    """At most this many passes over the labelled States per fit, where that is fewer than
    ``fit_steps`` (None: ``fit_steps`` however few the States)."""
    processes: int = 0
    """Processes that label episodes (0: one per core)."""

    def __post_init__(self) -> None:
        for name in ("horizon", "every", "iterations", "fit_steps", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.explore <= 1:
            raise ValueError(f"RolloutConfig.explore must be in [0, 1], got {self.explore!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"RolloutConfig.gamma must be in (0, 1], got {self.gamma!r}")
        if not self.temperature > 0:
            raise ValueError(f"RolloutConfig.temperature must be > 0, got {self.temperature!r}")
        if self.keep < 0:
            raise ValueError(f"RolloutConfig.keep must be >= 0, got {self.keep!r}")
        if self.passes is not None and not self.passes > 0:
            raise ValueError(f"RolloutConfig.passes must be > 0, got {self.passes!r}")
        if self.processes < 0:
            raise ValueError(f"RolloutConfig.processes must be >= 0, got {self.processes!r}")


def branch_return(
    env: PipelineEnv, policy: Policy, first: Action, horizon: int, gamma: float
) -> tuple[float, int]:
    """The discounted reward of taking ``first`` now, then ``policy``'s actions, over
    ``horizon`` ticks, on a copy of ``env`` (which is left as it was); and the steps run.
    ``policy`` is copied too and sees the copied tick as it would have, so a policy that
    keeps windows (the heuristic) carries on from its own history."""
    env = env.branch()
    policy = copy.deepcopy(policy)
    state = env.state
    assert state is not None  # branch() refuses an episode that was not reset
    policy.decide(state)  # what it would have done: its windows see this tick
    total, discount, action = 0.0, 1.0, first
    for _ in range(horizon):
        _, reward, _, _, _ = env.apply(action)
        total += discount * reward
        discount *= gamma
        state = env.state
        assert state is not None
        action = policy.decide(state)
    return total, horizon


@dataclass
class Labels:
    """Labelled States: what :func:`label_episode` returns, and what a fit reads."""

    features: np.ndarray
    """The States' feature vectors (one row per State)."""
    returns: np.ndarray
    """Each action's return from the State (one column per action of the environment)."""
    own: np.ndarray
    """The index of the action the followed policy took itself there."""
    prior: np.ndarray | None = None
    """The followed policy's scores there, less their mean (None: it has none)."""
    steps: int = 0
    """Environment steps run to label them."""

    def scores(self, keep: float) -> np.ndarray:
        """The followed policy's scores, or ``keep`` for its own action where it has none."""
        if self.prior is not None:
            return self.prior
        return keep * np.eye(self.returns.shape[1], dtype=np.float32)[self.own]

    @classmethod
    def concat(cls, parts: Sequence[Labels], keep: float = 0.0) -> Labels:
        """One set of labels; where only some parts have scores, the others' stand in as
        ``keep`` for the own action (:meth:`scores`)."""
        scored = any(p.prior is not None for p in parts)
        return cls(
            np.concatenate([p.features for p in parts]),
            np.concatenate([p.returns for p in parts]),
            np.concatenate([p.own for p in parts]),
            np.concatenate([p.scores(keep) for p in parts]) if scored else None,
            sum(p.steps for p in parts),
        )


def nearest(action: Action, actions: Sequence[Action], knobs: Sequence[str]) -> int:
    """The index in ``actions`` (an ``Action.space(knobs)``) of the action that steps
    ``knobs`` as ``action`` does (its reason, and its moves of other knobs, aside)."""
    return actions.index(Action.of_steps({k: action.step(k) for k in knobs}))


def label_episode(
    env: PipelineEnv, policy: Policy, config: RolloutConfig, seed: int, *, branch: bool = True
) -> Labels:
    """One episode driven by ``policy`` (a share ``config.explore`` of its ticks random):
    every ``config.every`` ticks, the return of each of the environment's actions
    (:func:`branch_return`). ``branch=False`` records the States alone, every action's
    return 0: a fit then keeps ``policy``'s own scores there (an anchor)."""
    rng = np.random.default_rng(seed)
    policy = copy.deepcopy(policy)
    env.reset(seed=seed)
    ticks = round(env.duration / env.interval)
    features, returns, own, prior, steps = [], [], [], [], 0
    # A discrete policy over the environment's actions has a score for each of them.
    scorer = None
    if isinstance(policy, MlpPolicy) and not policy.continuous and policy.actions == env.actions:
        scorer = policy
    for tick in range(ticks):
        state = env.state
        assert state is not None
        labelled = tick % config.every == 0
        if labelled:
            row = [0.0] * len(env.actions)
            for k, action in enumerate(env.actions if branch else ()):
                row[k], ran = branch_return(env, policy, action, config.horizon, config.gamma)
                steps += ran
            features.append(state.vector(env.knobs))
            returns.append(row)
        chosen = policy.decide(state)
        if labelled:
            own.append(nearest(chosen, env.actions, env.knobs))
            if scorer is not None:
                scores = scorer.scores(state.vector(features=scorer.features))
                prior.append(scores - scores.mean())
        if rng.random() < config.explore:
            chosen = env.actions[int(rng.integers(len(env.actions)))]
        env.apply(chosen)
        steps += 1
    return Labels(
        np.asarray(features, np.float32),
        np.asarray(returns, np.float32),
        np.asarray(own),
        np.asarray(prior, np.float32) if scorer is not None else None,
        steps,
    )


def episode_steps(env: PipelineEnv, config: RolloutConfig) -> int:
    """Environment steps one labelled episode of ``env`` runs: its ticks, and every action's
    copy of ``config.horizon`` ticks at every ``config.every``-th."""
    ticks = round(env.duration / env.interval)
    return ticks + -(-ticks // config.every) * len(env.actions) * config.horizon


def _label_episodes(
    env: PipelineEnv,
    policy: Policy,
    config: RolloutConfig,
    seeds: Sequence[int],
    branch: bool = True,
) -> Labels:
    """:func:`label_episode` for each seed, stacked."""
    return Labels.concat(
        [label_episode(env, policy, config, seed, branch=branch) for seed in seeds]
    )


def fit(
    labels: Labels, config: RolloutConfig, seed: int, start: MlpPolicy | None = None
) -> nn.Sequential:
    """A network scoring each action by the followed policy's score for it plus its return
    over the State's mean, over ``config.temperature`` (Huber loss, so that a few States
    where one action is a disaster do not drown the rest). ``start``: begin from that
    policy's weights (its layers must have the network's shape) instead of at random."""
    torch.manual_seed(seed)
    features, returns = labels.features, labels.returns
    steps = config.fit_steps
    if config.passes is not None:
        steps = min(steps, max(1, math.ceil(config.passes * len(features) / config.batch)))
    net = tanh_mlp([features.shape[1], *config.hidden, returns.shape[1]])
    if start is not None:
        linears = [m for m in net if isinstance(m, nn.Linear)]
        shapes = [tuple(w.shape) for w, _ in start.layers]
        if shapes != [(m.in_features, m.out_features) for m in linears]:
            raise ValueError(f"the start policy's layers {shapes} do not fit this network")
        with torch.no_grad():
            for linear, (weight, bias) in zip(linears, start.layers, strict=True):
                linear.weight.copy_(torch.as_tensor(weight.T))
                linear.bias.copy_(torch.as_tensor(bias))
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    advantage = returns - returns.mean(axis=1, keepdims=True)
    target = labels.scores(config.keep) + advantage / config.temperature
    x, y = torch.as_tensor(features), torch.as_tensor(target)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(len(x), (config.batch,), generator=generator)
        loss = nn.functional.smooth_l1_loss(net(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return net


def regret(scores: np.ndarray, returns: np.ndarray) -> float:
    """Mean return given up by taking each row's highest-scored action instead of its best."""
    chosen = returns[np.arange(len(returns)), scores.argmax(axis=1)]
    return float(np.mean(returns.max(axis=1) - chosen))


@register_learner("rollout")
class RolloutPolicyIteration(Learner):
    """Approximate policy iteration from copies of the simulator (common random numbers)."""

    def __init__(self, config: RolloutConfig | None = None) -> None:
        self.config = config or RolloutConfig()
        self.history: list[dict[str, Any]] = []
        """Per round: States labelled, steps run, and the mean return given up on them by the
        fitted policy's choices and by the followed policy's own."""
        self.labels: Labels | None = None
        """The States the last fit read, with their returns (to fit again without labelling)."""

    def _start(self) -> Policy:
        start = self.config.start
        return MlpPolicy.load(start) if start.endswith(".npz") else make_policy(start)

    def _processes(self) -> int:
        return self.config.processes or os.cpu_count() or 1

    def _pool(self) -> ProcessPoolExecutor | None:
        processes = self._processes()
        # Processes are spawned, not forked: this process has torch's threads running.
        return ProcessPoolExecutor(processes, get_context("spawn")) if processes > 1 else None

    def _label(
        self,
        pool: ProcessPoolExecutor | None,
        env: PipelineEnv,
        policy: Policy,
        seeds: Sequence[int],
        branch: bool = True,
    ) -> Labels:
        """:func:`label_episode` for every seed, on ``pool``'s processes where there is one."""
        c = self.config
        processes = self._processes() if pool is not None else 1
        size = max(1, len(seeds) // (8 * processes))  # small jobs even out the load
        chunks = [seeds[k : k + size] for k in range(0, len(seeds), size)]
        if pool is None:
            parts = [_label_episodes(env, policy, c, chunk, branch) for chunk in chunks]
        else:
            jobs = [pool.submit(_label_episodes, env, policy, c, ch, branch) for ch in chunks]
            parts = [job.result() for job in jobs]
        return Labels.concat(parts, c.keep)

    def finetune(
        self,
        target: PipelineEnv,
        anchor: PipelineEnv,
        episodes: int,
        anchor_episodes: int,
        seed: int,
    ) -> MlpPolicy:
        """One round from the policy file ``config.start``, improved where ``target``'s
        scenarios go (a :class:`~drapps.sim.calibration.TraceFamily` of real runs) and held
        where ``anchor``'s go (the training families).

        ``episodes`` of ``target`` are labelled with every action's return (as a round of
        :meth:`train`); ``anchor_episodes`` of ``anchor`` only record the States the policy
        reaches, whose target is its own scores. The network starts from the policy's
        weights. So the policy changes where the real runs' States say an action pays, and
        stays as it was over the simulator's families, which its held-out record rests on.

        Raises:
            ValueError: ``config.start`` is not a policy file for ``target``'s actions.
        """
        c = self.config
        start = self._start()
        if not isinstance(start, MlpPolicy) or start.continuous or start.actions != target.actions:
            raise ValueError(
                f"finetune starts from a discrete policy file over the environment's actions "
                f"({c.start!r} is not one)"
            )
        if anchor.actions != target.actions:
            raise ValueError("the anchor and target environments must have the same actions")
        pool = self._pool()
        try:
            improved = self._label(
                pool, target, start, [seed * 1_000_003 + e for e in range(episodes)]
            )
            held = self._label(
                pool,
                anchor,
                start,
                [seed * 1_000_003 + 500_009 + e for e in range(anchor_episodes)],
                branch=False,
            )
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        labels = Labels.concat([improved, held], c.keep)
        self.labels = labels
        net = fit(labels, c, seed, start=start)
        policy = export_mlp(
            [m for m in net if isinstance(m, nn.Linear)], dict(start.meta), target.knobs
        )
        n = len(improved.features)
        scores = policy.scores(improved.features)
        before = start.scores(improved.features)
        anchored = policy.scores(held.features).argmax(axis=1) == start.scores(
            held.features
        ).argmax(axis=1)
        self.history.append(
            {
                "states": n,
                "anchor_states": len(held.features),
                "steps": improved.steps + held.steps,
                "regret": round(regret(scores, improved.returns), 4),
                "followed_regret": round(regret(before, improved.returns), 4),
                "anchor_agreement": round(float(anchored.mean()), 4),
            }
        )
        logger.info("rollout finetune: %s", self.history[-1])
        policy.meta["finetune"] = {
            "learner": "rollout",
            "start": c.start,
            "seed": seed,
            "temperature": c.temperature,
            "horizon": c.horizon,
            **self.history[-1],
        }
        return policy

    def train(self, env: PipelineEnv, steps: int, seed: int) -> MlpPolicy:
        c = self.config
        episodes = max(1, steps // (c.iterations * episode_steps(env, c)))
        policy: Policy = self._start()
        rounds: list[Labels] = []
        pool = self._pool()
        try:
            for round_ in range(c.iterations):
                seeds = [seed * 1_000_003 + round_ * 100_003 + e for e in range(episodes)]
                rounds.append(self._label(pool, env, policy, seeds))
                labels = Labels.concat(rounds, c.keep) if c.aggregate else rounds[-1]
                self.labels = labels
                net = fit(labels, c, seed + round_)
                policy = export_mlp([m for m in net if isinstance(m, nn.Linear)], {}, env.knobs)
                scores = policy.scores(labels.features)
                followed = np.eye(len(env.actions))[labels.own]  # its own choices
                self.history.append(
                    {
                        "round": round_,
                        "states": len(labels.features),
                        "steps": sum(r.steps for r in rounds),
                        "regret": round(regret(scores, labels.returns), 4),
                        "followed_regret": round(regret(followed, labels.returns), 4),
                    }
                )
                logger.info("rollout round %d: %s", round_, self.history[-1])
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        assert isinstance(policy, MlpPolicy)
        policy.meta.update(
            {
                "learner": "rollout",
                "steps": self.history[-1]["steps"],
                "seed": seed,
                "start": c.start,
                "horizon": c.horizon,
                "rounds": self.history,
            }
        )
        return policy
