"""A gymnasium environment over the simulator: the real State, Action and Reward.

Observation: ``State.vector(knobs)``. Action: an index into ``Action.space(knobs)`` (workers and
prefetch steps by default; with ``split`` also the split of a pipeline with movable ops), or
with ``continuous=True`` one value per knob; clipped by the same Controller code as the real
loader. Reward: the shared
``drapps.control.reward``. Each episode draws a scenario from the given families.
Needs the ``rl`` extra (gymnasium).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from drapps._optional import require
from drapps.control.action import Action
from drapps.control.controller import Bounds, Controller
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import KNOBS, continuous_action
from drapps.control.state import State
from drapps.control.static import StaticPolicy
from drapps.sim.engine import Simulator
from drapps.sim.families import Family, check_sources, draw, family_names
from drapps.sim.run import (
    codec_knobs,
    executor_knobs,
    lookahead_knobs,
    offload_knobs,
    priority_knobs,
    split_knobs,
)
from drapps.sim.scenario import Scenario

gym = require("gymnasium")


class PipelineEnv(gym.Env):  # type: ignore[name-defined]
    """One episode: one scenario from ``families``, ``duration`` simulated seconds, one step
    per controller ``interval``.

    Args:
        families: scenario families to draw from, by name or as generators (a
            :class:`~drapps.sim.calibration.TraceFamily` of real runs); default: the training
            families.
        duration: simulated seconds per episode.
        interval: seconds between decisions (the Loader's ``control_interval``).
        random_start: start each episode at a random worker count (training explores more);
            False starts at one per core, as ``Loader(workers="auto")``.
        weights: reward weights.
        knobs: the step knobs the agent moves (``("workers", "prefetch", "split")`` to learn
            the split: scenarios with ``device_ops``, such as the ``device-offload`` family,
            give the split room to move).
        continuous: actions are one value in [-1, 1] per knob (a Box, for SAC), read by
            :func:`~drapps.control.rl.continuous_action`; False: an index into
            ``Action.space(knobs)`` (PPO, DDQN).

    ``reset(options={"scenario": s})`` runs a given :class:`Scenario` instead of drawing one.
    A step's ``info`` holds the throughput, the workers, the other knobs moved, and the
    hedged copies of overdue parts the simulator sent and won during the step (``hedges``,
    ``hedges_won``: their cost is in the dynamics and the reward, not in the observation).

    Example:
        >>> from drapps.sim.env import PipelineEnv
        >>> env = PipelineEnv(duration=5.0)
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape
        (15,)
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        families: Sequence[str | Family] | None = None,
        *,
        duration: float = 60.0,
        interval: float = 0.5,
        random_start: bool = True,
        weights: RewardWeights | None = None,
        knobs: Sequence[str] = KNOBS,
        continuous: bool = False,
    ) -> None:
        super().__init__()
        self.knobs = tuple(knobs)
        self.continuous = continuous
        self.actions = Action.space(self.knobs)
        self.families = check_sources(
            families if families is not None else family_names(held_out=False)
        )
        if not self.families:
            raise ValueError("families must name at least one scenario family")
        if not duration >= interval > 0:
            raise ValueError(f"need duration >= interval > 0, got {duration!r}, {interval!r}")
        self.duration, self.interval = duration, interval
        self.random_start = random_start
        self.weights = weights or RewardWeights()
        width = len(State.features(self.knobs))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (width,), np.float32)
        if continuous:  # one output per knob in [-1, 1], read by continuous_action
            self.action_space = gym.spaces.Box(-1.0, 1.0, (len(self.knobs),), np.float32)
        else:
            self.action_space = gym.spaces.Discrete(len(self.actions))
        self.scenario: Scenario | None = None
        self._sim: Simulator | None = None
        self._controller: Controller | None = None
        self._state: State | None = None
        self._steps = 0
        self._hedges = (0, 0)  # the simulator's copies sent and won at the last step

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        scenario = (options or {}).get("scenario")
        if scenario is None:
            family = self.families[int(rng.integers(len(self.families)))]
            scenario = draw(family, rng, self.duration)
        elif not isinstance(scenario, Scenario):
            raise ValueError(f"options['scenario'] must be a Scenario, got {scenario!r}")
        p = scenario.pipeline
        limit = p.worker_limit
        start = int(rng.integers(1, limit + 1)) if self.random_start else min(p.cores, limit)
        self.scenario = scenario
        self._sim = Simulator(scenario, workers=start, seed=int(rng.integers(2**31)))
        self._controller = Controller(
            self._sim.observe,
            StaticPolicy(),
            self._sim,
            Bounds(min_workers=1, max_workers=limit, max_prefetch=4 * limit),
            interval=self.interval,
            knobs=[
                *split_knobs(self._sim, adjustable="split" in self.knobs),
                *offload_knobs(self._sim, adjustable="offload" in self.knobs),
                *lookahead_knobs(self._sim, adjustable="lookahead" in self.knobs),
                *codec_knobs(self._sim, adjustable="codec" in self.knobs),
                *priority_knobs(self._sim, adjustable=True),
                *executor_knobs(self._sim, adjustable="executor" in self.knobs),
            ],
        )
        self._controller.steer(self.knobs)  # the agent moves them, not the knobs' rules
        self._steps = 1
        self._hedges = (0, 0)
        self._sim.run_until(self.interval)
        self._state = self._sim.observe()
        return self._state.vector(self.knobs), {"scenario": scenario.name, "workers": start}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self.apply(self._action(action))

    def apply(self, action: Action) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """:meth:`step` with an :class:`Action` instead of the agent's output: how a policy
        that is not the agent (the heuristic, a policy file) drives an episode or a branch
        of it. Knobs outside the agent's stay as the environment has them (held, or moved by
        their own rules) whatever the action asks."""
        if self._sim is None or self._controller is None or self._state is None:
            raise RuntimeError("call reset() before step()")
        applied = self._controller.act(self._state, action)
        workers = int(applied["workers"])
        self._steps += 1
        self._sim.run_until(self._steps * self.interval)
        self._state = self._sim.observe()
        value = reward(self._state, self.weights)
        truncated = self._steps * self.interval >= self.duration - 1e-9
        totals = self._sim.totals
        sent, won = self._hedges
        self._hedges = (totals.hedges, totals.hedges_won)
        info: dict[str, Any] = {
            "throughput": self._state.throughput,
            "workers": workers,
            "hedges": totals.hedges - sent,
            "hedges_won": totals.hedges_won - won,
        }
        if "split" in applied:
            info["split"] = int(applied["split"])
        if "offload" in applied:
            info["offload"] = float(applied["offload"])
        if "lookahead" in applied:
            info["lookahead"] = int(applied["lookahead"])
        for name in ("codec", "priority"):
            if name in applied:
                info[name] = str(applied[name])
        if "executor" in applied:
            info["executor"] = int(applied["executor"])
        return self._state.vector(self.knobs), value, False, truncated, info

    def _action(self, action: Any) -> Action:
        """The Action an agent's output stands for (an index, or one value per knob)."""
        if not self.continuous:
            if not self.action_space.contains(action):
                raise ValueError(
                    f"action must be an int in [0, {len(self.actions)}), got {action!r}"
                )
            return self.actions[int(action)]
        values = np.asarray(action, dtype=np.float32)
        if values.shape != (len(self.knobs),) or not np.all(np.isfinite(values)):
            raise ValueError(
                f"action must be {len(self.knobs)} finite values in [-1, 1] (one per knob "
                f"{list(self.knobs)}), got {action!r}"
            )
        return continuous_action(values, self.knobs)

    def branch(self) -> PipelineEnv:
        """An independent copy of the episode at this tick (the simulator with its pending
        events and random draws, the knobs, the State): the same actions on two branches
        give the same ticks (common random numbers), so they compare actions exactly."""
        if self._sim is None:
            raise RuntimeError("call reset() before branch()")
        return copy.deepcopy(self)

    @property
    def state(self) -> State | None:
        """The last State observed."""
        return self._state
