"""Knobs: the named, bounded settings a controller turns.

A knob knows its name, where its value sits in :class:`~drapps.control.state.State` and
:class:`~drapps.control.action.Action`, how far it may go, and how to apply a new value. The
controller asks each knob in turn what the policy's action leads to (:meth:`Knob.propose`, already
clipped to its bounds), applies the values that changed, and records them under the knob's name
in the tick and the trace. The real loader and the simulator build the same knobs over their own
``apply`` functions, so a policy sees one contract in both.

Example:
    >>> from drapps.control.knobs import WorkersKnob
    >>> knob = WorkersKnob(apply=print, low=1, high=4)
    >>> knob.name, knob.bounds()
    ('workers', (1, 4))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from drapps.control.state import State

Value = int | float | str


class Knob(ABC):
    """One setting the controller may change.

    Subclasses set :attr:`name` and implement :meth:`propose`; ``apply`` is given by whoever
    owns the setting (the dispatcher, the simulator, a cache).
    """

    name: str = ""
    """Key of the knob in ``Action.moves()``, ``State.knob()``, ``Tick.applied`` and the trace."""
    limited_by: str | None = None
    """Why the last proposal differs from what was asked, where the knob says (a bound, the
    host's core share); the controller records it in ``Tick.notes``."""

    def __init__(self, apply: Callable[[Any], object], *, adjustable: bool = True) -> None:
        """
        Args:
            apply: sets the knob's new value on the pipeline (what it returns is ignored).
            adjustable: False holds the knob at its value whatever the policy asks.
        """
        if not self.name:
            raise TypeError(f"{type(self).__name__} must set a class attribute `name`")
        self._apply = apply
        self.adjustable = adjustable

    def current(self, state: State) -> Value:
        """The knob's value in ``state``."""
        return state.knob(self.name)

    @abstractmethod
    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        """The value ``move`` (the action's entry for this knob, None when absent) leads to,
        clipped to the knob's bounds. ``chosen`` holds what the knobs before it proposed."""

    def apply(self, value: Value) -> None:
        """Set the knob on the pipeline."""
        self._apply(value)

    def steer(self) -> None:
        """The policy was trained on this knob: from now on its moves, not a rule of the
        knob's own, turn it (the Controller calls this; knobs without a rule ignore it)."""
        return None

    @abstractmethod
    def bounds(self) -> tuple[Any, ...]:
        """(low, high) for a numeric knob, or the allowed values of a choice knob."""


class StepKnob(Knob):
    """An integer knob moved by -1, 0 or +1 per tick within ``[low, high]``."""

    def __init__(
        self, apply: Callable[[int], None], *, low: int, high: int, adjustable: bool = True
    ) -> None:
        super().__init__(apply, adjustable=adjustable)
        if not low <= high:
            raise ValueError(f"{self.name} bounds need low <= high, got {low}, {high}")
        self.low, self.high = low, high

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        value = int(self.current(state))
        if not self.adjustable:
            return value
        return min(self.high, max(self.low, value + int(move or 0)))

    def bounds(self) -> tuple[int, int]:
        return self.low, self.high


class ChoiceKnob(Knob):
    """A knob set to one of a fixed set of values (a codec name, for instance)."""

    def __init__(
        self, apply: Callable[[str], None], *, choices: tuple[str, ...], adjustable: bool = True
    ) -> None:
        super().__init__(apply, adjustable=adjustable)
        if not choices:
            raise ValueError(f"{self.name} needs at least one choice")
        self.choices = tuple(choices)

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        value = self.current(state)
        if not self.adjustable or move is None:
            return value
        if move not in self.choices:
            raise ValueError(f"{self.name} must be one of {list(self.choices)}, got {move!r}")
        return str(move)

    def bounds(self) -> tuple[str, ...]:
        return self.choices


STREAM_COUNT_HELD = (
    "an iterable dataset's workers each stream the shard get_worker_info() gives them, so "
    "their count is fixed from iter()"
)
"""Why a stream's worker count is held (the workers knob's note in the trace and report)."""


class WorkersKnob(StepKnob):
    """Worker processes, within ``[low, high]`` and the host's share of cores (``grant``)."""

    name = "workers"

    def __init__(
        self,
        apply: Callable[[int], None],
        *,
        low: int,
        high: int,
        adjustable: bool = True,
        grant: Callable[[int, int], int] | None = None,
        held_by: str | None = None,
    ) -> None:
        """
        Args:
            grant: ``grant(wanted, floor) -> workers``: a share of cores held with other
                loaders (:class:`drapps.runtime.cores.CoreBudget`); the count is clipped to
                it every tick, so a loader over its share shrinks.
            held_by: why the count is held, where it is not ``adjustable`` for a reason
                worth telling (noted every tick, as :attr:`limited_by`).
        """
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {low}, {high}")
        super().__init__(apply, low=low, high=high, adjustable=adjustable)
        self.grant = grant
        self.held_by = held_by

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        workers = int(super().propose(state, move, chosen))
        self.limited_by = None
        if not self.adjustable:
            self.limited_by = self.held_by
            return workers
        if int(self.current(state)) == 0:
            # No worker runs: a pool between two epochs, its next workers not started yet.
            # There is nothing to size, and raising 0 to ``low`` would resize the next
            # epoch's pool to ``min_workers``.
            return 0
        asked = int(self.current(state)) + int(move or 0)
        if workers != asked:
            bound = "max_workers" if asked > workers else "min_workers"
            self.limited_by = f"held to {workers} by {bound}"
        if self.grant is not None:
            granted = self.grant(workers, self.low)
            if granted != workers:
                self.limited_by = f"held to {granted} by this loader's share of the host's cores"
            workers = granted
        return workers


class PrefetchKnob(StepKnob):
    """Batches in flight + ready: two per worker plus a learned extra, within the memory budget.

    The extra depth is kept across ticks, so the depth follows the worker count.
    """

    name = "prefetch"

    def __init__(
        self,
        apply: Callable[[int], None],
        *,
        high: int,
        batch_bytes: Callable[[], int] = lambda: 0,
        adjustable: bool = True,
    ) -> None:
        """
        Args:
            high: most batches in flight + ready.
            batch_bytes: bytes of the largest batch so far (0 before the first); the depth
                is capped at ``memory_budget // batch_bytes``.
        """
        if high < 1:
            raise ValueError(f"max_prefetch must be >= 1, got {high!r}")
        super().__init__(apply, low=1, high=high, adjustable=adjustable)
        self._batch_bytes = batch_bytes
        self._extra = 0  # depth beyond two batches per worker

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        if not self.adjustable:
            return state.prefetch
        workers = int(chosen.get("workers", state.workers))
        if workers == 0:  # a pool between two epochs: its depth is held for the next one
            return state.prefetch
        depth = min(self.high, max(1, 2 * workers + self._extra + int(move or 0)))
        batch_bytes = self._batch_bytes()
        if batch_bytes > 0:
            depth = min(depth, max(1, state.memory_budget // batch_bytes))
        self._extra = depth - 2 * workers
        return depth


class LookaheadKnob(StepKnob):
    """How far past the next batch work may start early: +1 doubles it, -1 halves it (the
    dispatcher starts predicted-slow work least slack first within it)."""

    name = "lookahead"

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        value = int(self.current(state))
        if not self.adjustable or not move:
            return value
        stepped = value * 2 if int(move) > 0 else value // 2
        return min(self.high, max(self.low, stepped))


class ExecutorKnob(StepKnob):
    """What new workers are: 0 worker processes, 1 threads of the training process (+1 tries
    threads, -1 goes back). The pool applies it only where the dataset allows threads
    (:class:`~drapps.runtime.executor_pool.ExecutorPool`); where it does not, the value
    stays, and a policy sees its move clipped.

    Example:
        >>> from types import SimpleNamespace
        >>> knob = ExecutorKnob(apply=print)
        >>> state = SimpleNamespace(extra={"executor": 0})  # the State field it reads
        >>> [knob.propose(state, move, {}) for move in (1, -1, 0)]  # type: ignore[arg-type]
        [1, 0, 0]
    """

    name = "executor"

    def __init__(self, apply: Callable[[int], None], *, adjustable: bool = True) -> None:
        super().__init__(apply, low=0, high=1, adjustable=adjustable)

    def current(self, state: State) -> Value:
        # A pool making batches in the training process for now (a recipe its workers
        # cannot receive) reports no executor: processes, which nothing moves.
        return int(state.extra.get("executor", 0))


class SplitKnob(StepKnob):
    """Where a Pipeline is cut: -1 moves one more op into the device stage (after the reorder
    buffer, batched, on the training side), +1 moves one back into the workers."""

    name = "split"

    def __init__(
        self, apply: Callable[[int], None], *, low: int, high: int, adjustable: bool = True
    ) -> None:
        """
        Args:
            low, high: the first and last valid split points (every one between is valid:
                the ops a batch stage may run form a suffix of the pipeline).
        """
        if not 0 <= low <= high:
            raise ValueError(f"split bounds need 0 <= low <= high, got {low}, {high}")
        super().__init__(apply, low=low, high=high, adjustable=adjustable)


OFFLOAD_STEP = 0.25
"""How far one step of the ``offload`` knob moves the share."""


class OffloadKnob(Knob):
    """The share of each batch's samples whose ops from the split on run in the device stage,
    in [0, 1] (:mod:`drapps.ops.cut`): a step (-1, 0, +1) moves it by ``step``; a float sets
    it (what a policy with continuous actions gives).

    Example:
        >>> from types import SimpleNamespace
        >>> knob = OffloadKnob(apply=print)
        >>> state = SimpleNamespace(knob=lambda name: 0.5)  # the State method it reads
        >>> knob.propose(state, +1, {}), knob.propose(state, 0.3, {})  # type: ignore[arg-type]
        (0.75, 0.3)
    """

    name = "offload"

    def __init__(
        self,
        apply: Callable[[float], object],
        *,
        step: float = OFFLOAD_STEP,
        adjustable: bool = True,
    ) -> None:
        super().__init__(apply, adjustable=adjustable)
        if not 0.0 < step <= 1.0:
            raise ValueError(f"offload step must be in (0, 1], got {step!r}")
        self.step = step

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        value = float(self.current(state))
        if not self.adjustable or move is None:
            return value
        target = float(move) if isinstance(move, float) else value + int(move) * self.step
        return min(1.0, max(0.0, round(target, 6)))

    def bounds(self) -> tuple[float, float]:
        return 0.0, 1.0


class CodecKnob(ChoiceKnob):
    """The sample cache's codec for new entries (one of the cache's codecs, or "off" to
    bypass the cache).

    A codec's name sets it (the heuristic's rule); a step (what a learned policy gives) moves
    along the codecs the cache has profiled, ordered by their entries' size: +1 to the next
    smaller (more of the dataset fits, a dearer decode), -1 to the next larger. A step never
    turns the cache off, and holds until the cache has profiled its codecs.

    Example:
        >>> from types import SimpleNamespace
        >>> knob = CodecKnob(apply=print, choices=("raw", "lz4", "zstd", "off"))
        >>> profile = {"raw": [3000, 0, 0.1], "lz4": [1500, 1, 0.3], "zstd": [900, 4, 0.8]}
        >>> state = SimpleNamespace(  # the State fields and method it reads
        ...     codec="lz4", cache_profile=profile, knob=lambda name: "lz4"
        ... )
        >>> [knob.propose(state, move, {}) for move in (1, -1, 0, "raw")]  # type: ignore[arg-type]
        ['zstd', 'raw', 'lz4', 'raw']
    """

    name = "codec"

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        if isinstance(move, str) or move is None:
            return super().propose(state, move, chosen)
        current = str(state.codec)
        order = self.by_size(state)
        if not self.adjustable or not move or current not in order:
            return current
        k = min(len(order) - 1, max(0, order.index(current) + (1 if int(move) > 0 else -1)))
        return order[k]

    def by_size(self, state: State) -> list[str]:
        """The profiled codecs among this knob's choices, largest entries first."""
        profile = state.cache_profile
        names = [name for name in self.choices if name in profile]
        return sorted(names, key=lambda name: -profile[name][0])


class PriorityKnob(Knob):
    """The workers' CPU priority: ``"normal"``, then ``"low"`` (nice +10) once the training
    process itself competes with them for a saturated CPU.

    A policy trained on this knob moves it (a -1 step lowers the workers' priority;
    :meth:`steer`); for any other, a rule decides it. When, over ``window`` ticks in a row, the
    training process asked for at least ``main_cpu`` cores (a training step on the CPU, or a
    heavy host side of a GPU step, that wants most of a core; what it used plus the time its
    loop waited for a core, so a loop starved by contention counts for what it wants, not for
    what it got) while the machine's CPU was at least ``busy``, the workers yield to it: the
    step is the critical path, and the workers only need what it leaves. With an idle CPU, or
    a training loop that mostly waits on an accelerator, priority changes nothing, so it stays
    normal (and workers keep their share against outside load). The change is one-way:
    without privilege a process may not lower its children's niceness again.

    Example:
        >>> from types import SimpleNamespace
        >>> knob = PriorityKnob(apply=print, window=2)
        >>> busy = SimpleNamespace(main_cpu=0.3, main_wait=0.6, cpu_util=0.97)  # what it reads
        >>> [knob.propose(busy, None, {}) for _ in range(2)]  # type: ignore[arg-type]
        ['normal', 'low']
    """

    name = "priority"

    def __init__(
        self,
        apply: Callable[[str], object],
        *,
        window: int = 6,
        main_cpu: float = 0.8,
        busy: float = 0.9,
        adjustable: bool = True,
    ) -> None:
        super().__init__(apply, adjustable=adjustable)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.window, self.main_cpu, self.busy = window, main_cpu, busy
        self.value = "normal"
        self.steered = False
        """True once a policy trained on this knob moves it (the rule then rests)."""
        self._streak = 0

    def current(self, state: State) -> Value:
        return self.value

    def steer(self) -> None:
        self.steered = True

    def propose(self, state: State, move: Any, chosen: Mapping[str, Value]) -> Value:
        self.limited_by = None
        if self.steered and self.adjustable and move:
            if int(move) < 0:
                return "low"
            if self.value == "low":
                self.limited_by = "held low: the workers' niceness cannot be lowered again"
            return self.value
        if not self.adjustable or self.value == "low" or self.steered:
            return self.value
        asked = state.main_cpu + state.main_wait
        competing = asked >= self.main_cpu and state.cpu_util >= self.busy
        self._streak = self._streak + 1 if competing else 0
        return "low" if self._streak >= self.window else "normal"

    def apply(self, value: Value) -> None:
        self.value = str(value)
        super().apply(value)

    def bounds(self) -> tuple[Any, ...]:
        return ("normal", "low")
