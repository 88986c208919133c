"""The Controller: every tick, observe a State, ask the policy, clip, apply, and record.

It knows the pipeline only through its :class:`~drapps.control.knobs.Knob` list and an
``observe`` function, so the same loop drives the real loader and the simulator. A policy that
raises is logged and the tick holds still: a policy can never stop the pipeline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from drapps.control.action import Action
from drapps.control.knobs import Knob, PrefetchKnob, Value, WorkersKnob
from drapps.control.policy import Policy
from drapps.control.reward import RewardWeights, reward
from drapps.control.state import State

logger = logging.getLogger(__name__)


class Actuators(Protocol):
    """The pipeline's worker count and prefetch depth, as the default knobs turn them."""

    def resize(self, workers: int) -> None: ...

    def set_prefetch(self, depth: int) -> None: ...

    def batch_bytes(self) -> int:
        """Bytes of the largest batch seen so far (0 before the first)."""
        ...


@dataclass(frozen=True)
class Bounds:
    """Limits of the worker and prefetch knobs."""

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


def default_knobs(
    actuators: Actuators,
    bounds: Bounds,
    grant: Callable[[int, int], int] | None = None,
    held_by: str | None = None,
) -> list[Knob]:
    """The workers and prefetch knobs over ``actuators`` within ``bounds`` (``held_by``: why
    the worker count is held, where it is)."""
    return [
        WorkersKnob(
            actuators.resize,
            low=bounds.min_workers,
            high=bounds.max_workers,
            adjustable=bounds.adjust_workers,
            grant=grant,
            held_by=held_by,
        ),
        PrefetchKnob(
            actuators.set_prefetch,
            high=bounds.max_prefetch,
            batch_bytes=actuators.batch_bytes,
            adjustable=bounds.adjust_prefetch,
        ),
    ]


@dataclass(frozen=True)
class Tick:
    """What one tick saw, decided and applied."""

    state: State
    action: Action
    """The policy's action, as it chose it."""
    applied: dict[str, Value]
    """Every knob's value after clipping and applying, by knob name."""
    reward: float
    notes: dict[str, str] = field(default_factory=dict)
    """Per knob, why its value differs from what the action asked (``limited_by``)."""

    @property
    def workers(self) -> int:
        """Worker count after clipping and applying."""
        return int(self.applied.get("workers", self.state.workers))

    @property
    def prefetch(self) -> int:
        """Prefetch depth after clipping and applying."""
        return int(self.applied.get("prefetch", self.state.prefetch))


class Controller:
    """Runs ``observe -> policy.decide -> clip -> apply`` every ``interval`` seconds."""

    def __init__(
        self,
        observe: Callable[[], State],
        policy: Policy,
        actuators: Actuators | None = None,
        bounds: Bounds | None = None,
        *,
        interval: float = 0.5,
        on_tick: Callable[[Tick], None] | None = None,
        weights: RewardWeights | None = None,
        name: str = "drapps-controller",
        grant: Callable[[int, int], int] | None = None,
        knobs: Sequence[Knob] = (),
    ) -> None:
        """
        Args:
            actuators, bounds: the workers and prefetch knobs (:func:`default_knobs`); left
                out for a pipeline whose knobs all come from ``knobs``.
            grant: ``grant(wanted, floor) -> workers``, see :class:`WorkersKnob`.
            knobs: further knobs (``split``, ``codec``, or a new one), asked after the
                default ones, in this order.

        Raises:
            ValueError: a bad interval, two knobs with one name, or a policy trained for
                knobs this pipeline does not have.
        """
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.observe, self.policy = observe, policy
        self.interval = interval
        self.on_tick = on_tick
        self.weights = weights or RewardWeights()
        self.knobs: list[Knob] = []
        if actuators is not None and bounds is not None:
            self.knobs += default_knobs(actuators, bounds, grant)
        self.knobs += list(knobs)
        names = [knob.name for knob in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"knob names must be unique, got {names}")
        check_policy_knobs(policy, names)
        self.steer(getattr(policy, "knobs", None) or ())
        bind = getattr(policy, "bind", None)
        if callable(bind):
            bind(tuple(knob.name for knob in self.knobs if knob.adjustable))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._name = name

    def __getstate__(self) -> dict[str, Any]:
        """A Controller that is not ticking on its thread copies and pickles (a simulated
        episode branches with its Controller); a running one refuses."""
        if self._thread is not None and self._thread.is_alive():
            raise TypeError("a running Controller cannot be copied; stop() it first")
        state = self.__dict__.copy()
        state["_stop"], state["_thread"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stop = threading.Event()

    def steer(self, names: Sequence[str]) -> None:
        """Hand the knobs named ``names`` to the policy's moves (:meth:`Knob.steer`): done
        for the knobs a policy was trained on, and by an environment whose agent moves them."""
        for knob in self.knobs:
            if knob.name in names:
                knob.steer()

    def propose(self, state: State, action: Action) -> dict[str, Value]:
        """Each knob's value that ``action`` leads to within its bounds (nothing applied)."""
        moves = action.moves()
        chosen: dict[str, Value] = {}
        for knob in self.knobs:
            chosen[knob.name] = knob.propose(state, moves.get(knob.name), chosen)
        return chosen

    def act(self, state: State, action: Action) -> dict[str, Value]:
        """Clip ``action`` and apply every knob whose value changes; returns the values."""
        chosen = self.propose(state, action)
        for knob in self.knobs:
            if chosen[knob.name] != knob.current(state):
                knob.apply(chosen[knob.name])
        return chosen

    def step(self) -> Tick:
        """One tick (the thread calls this; tests may call it directly)."""
        state = self.observe()
        try:
            action = self.policy.decide(state)
        except Exception as exc:
            logger.exception("policy %r failed; holding the knobs", type(self.policy).__name__)
            action = Action(reason=f"policy failed ({type(exc).__name__}: {exc}); holding")
        applied = self.act(state, action)
        notes = {knob.name: knob.limited_by for knob in self.knobs if knob.limited_by is not None}
        tick = Tick(state, action, applied, reward(state, self.weights), notes)
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


REQUIRED_KNOBS = ("workers", "prefetch")
"""Knobs a policy trained on them needs the pipeline to have. The others are situational (a
``split`` needs movable ops, a ``codec`` a sample cache, ``priority`` worker processes): a
policy trained on one runs on a pipeline without it, and its moves of it are dropped, as the
simulator trained it on pipelines without it."""


def check_policy_knobs(policy: Policy, names: Sequence[str]) -> None:
    """Refuse a policy that declares (``policy.knobs``) a :data:`REQUIRED_KNOBS` knob the
    pipeline lacks.

    Raises:
        ValueError: naming the policy's knobs and the pipeline's.
    """
    wanted = getattr(policy, "knobs", None)
    if wanted is None:
        return
    missing = [name for name in wanted if name not in names and name in REQUIRED_KNOBS]
    if missing:
        raise ValueError(
            f"policy {type(policy).__name__} was trained for the knobs {list(wanted)} but this "
            f"pipeline has {list(names)} (missing: {missing})"
        )
