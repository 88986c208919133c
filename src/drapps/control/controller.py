"""The Controller: every tick, observe a State, ask the policy, clip, apply, and record.

It knows the pipeline only through :class:`Actuators` and an ``observe`` function, so the same
loop can drive the real loader or the simulator. A policy that raises is logged and the tick
holds still: a policy can never stop the pipeline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from drapps.control.action import Action
from drapps.control.policy import Policy
from drapps.control.reward import RewardWeights, reward
from drapps.control.state import State

logger = logging.getLogger(__name__)


class Actuators(Protocol):
    """The knobs a controller turns."""

    def resize(self, workers: int) -> None: ...

    def set_prefetch(self, depth: int) -> None: ...

    def batch_bytes(self) -> int:
        """Bytes of the largest batch seen so far (0 before the first)."""
        ...


@dataclass(frozen=True)
class Bounds:
    """Limits every applied action is clipped to."""

    min_workers: int
    max_workers: int
    max_prefetch: int
    """Most batches in flight + ready (the memory budget may lower it further)."""
    adjust_workers: bool = True
    adjust_prefetch: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}"
            )
        if self.max_prefetch < 1:
            raise ValueError(f"max_prefetch must be >= 1, got {self.max_prefetch!r}")


@dataclass(frozen=True)
class Tick:
    """What one tick saw, decided and applied."""

    state: State
    action: Action
    """The policy's action, as it chose it."""
    workers: int
    """Worker count after clipping and applying."""
    prefetch: int
    """Prefetch depth after clipping and applying."""
    reward: float


class Controller:
    """Runs ``observe -> policy.decide -> clip -> apply`` every ``interval`` seconds."""

    def __init__(
        self,
        observe: Callable[[], State],
        policy: Policy,
        actuators: Actuators,
        bounds: Bounds,
        *,
        interval: float = 0.5,
        on_tick: Callable[[Tick], None] | None = None,
        weights: RewardWeights | None = None,
        name: str = "drapps-controller",
        grant: Callable[[int, int], int] | None = None,
    ) -> None:
        """
        Args:
            grant: ``grant(wanted, floor) -> workers``: a share of cores held with other
                loaders (:class:`drapps.runtime.cores.CoreBudget`); the worker count is
                clipped to it every tick, so a loader over its share shrinks.
        """
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.observe, self.policy, self.actuators, self.bounds = observe, policy, actuators, bounds
        self.interval = interval
        self.on_tick = on_tick
        self.weights = weights or RewardWeights()
        self.grant = grant
        self._extra_prefetch = 0  # depth beyond two batches per worker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._name = name

    def clip(self, state: State, action: Action) -> tuple[int, int]:
        """The (workers, prefetch) that ``action`` leads to within the bounds and the budget."""
        b = self.bounds
        workers = state.workers
        if b.adjust_workers:
            workers = min(b.max_workers, max(b.min_workers, state.workers + action.workers))
            if self.grant is not None:
                workers = self.grant(workers, b.min_workers)
        if not b.adjust_prefetch:
            return workers, state.prefetch
        extra = self._extra_prefetch + action.prefetch
        depth = min(b.max_prefetch, max(1, 2 * workers + extra))
        batch_bytes = self.actuators.batch_bytes()
        if batch_bytes > 0:
            depth = min(depth, max(1, state.memory_budget // batch_bytes))
        self._extra_prefetch = depth - 2 * workers
        return workers, depth

    def step(self) -> Tick:
        """One tick (the thread calls this; tests may call it directly)."""
        state = self.observe()
        try:
            action = self.policy.decide(state)
        except Exception as exc:
            logger.exception("policy %r failed; holding the knobs", type(self.policy).__name__)
            action = Action(reason=f"policy failed ({type(exc).__name__}: {exc}); holding")
        workers, prefetch = self.clip(state, action)
        if workers != state.workers:
            self.actuators.resize(workers)
        if prefetch != state.prefetch:
            self.actuators.set_prefetch(prefetch)
        tick = Tick(state, action, workers, prefetch, reward(state, self.weights))
        if self.on_tick is not None:
            try:
                self.on_tick(tick)
            except Exception:
                logger.exception("controller tick callback failed")
        return tick

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:
                # Observing or actuating failed (e.g. the loader is closing): stop quietly.
                logger.debug("controller stopped after a failed tick", exc_info=True)
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop ticking; joins the thread. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout_s)
