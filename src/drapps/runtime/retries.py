"""Lost tasks: made again, or given up after ``max_attempts``; workers past ``timeout``.

A task is lost when its worker dies, hangs past ``timeout`` or sends a batch that cannot be read
back. :class:`Retries` owns the attempts at each (batch, part) of the epoch and the counters;
the dispatcher asks it whether a lost task goes back to the queue or is given up, which workers
ran past the timeout, and how long it may wait before the next one would. :class:`HangLimit`
says how long that is: the user's ``timeout``, or, by default, a limit that follows the
batches' own times, so that a slow batch is waited for and a hung worker is not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from drapps.runtime.plan import EpochPlan
from drapps.runtime.pool import Task, Worker

PAUSE_S = 2.0
"""A wait that returns this much later than its timeout means the process was not running."""


class HangLimit:
    """Seconds a worker may spend on one batch before it counts as hung.

    Args:
        timeout: a number of seconds; None: no limit; 0 (DataLoader's default, and drapps'):
            follow the batches, ``factor`` times the slowest one a worker has made so far and
            at least ``floor_s``, or ``first_s`` before any has come (a worker starting, or a
            dataset whose every batch takes minutes: a 3-D volume, a long clip).

    Example:
        >>> limit = HangLimit(0)
        >>> limit.seconds()
        600.0
        >>> limit.note(2.0); limit.seconds()
        60.0
        >>> limit.note(45.0); limit.seconds()
        450.0
        >>> HangLimit(30).seconds(), HangLimit(None).seconds()
        (30.0, None)
    """

    def __init__(
        self,
        timeout: float | None,
        *,
        factor: float = 10.0,
        floor_s: float = 60.0,
        first_s: float = 600.0,
    ) -> None:
        self.fixed = None if timeout is None else float(timeout) or None
        self.follows = timeout is not None and not timeout
        self._factor, self._floor_s, self._first_s = factor, floor_s, first_s
        self._slowest_s: float | None = None

    def seconds(self) -> float | None:
        """The limit now (None: none)."""
        if not self.follows:
            return self.fixed
        if self._slowest_s is None:
            return self._first_s
        return max(self._floor_s, self._factor * self._slowest_s)

    def note(self, seconds: float) -> None:
        """A worker made a batch in ``seconds``."""
        if self._slowest_s is None or seconds > self._slowest_s:
            self._slowest_s = seconds


class Retries:
    """Attempts at each (batch, part) and the worker timeout.

    Args:
        max_attempts: attempts at a batch (or part) whose worker keeps dying or hanging.
        timeout: seconds a worker may spend on one task before it is replaced (None: no
            limit; 0: following the batches' times, :class:`HangLimit`).
    """

    def __init__(self, max_attempts: int, timeout: float | None) -> None:
        self.max_attempts = max_attempts
        self.limit = HangLimit(timeout)
        self._attempts: dict[tuple[int, int | None], int] = {}
        self.counters = {"retries": 0, "timeouts": 0}

    def reset(self, plan: EpochPlan, start: int) -> None:
        """A new epoch: no attempt at any of its batches yet."""
        self._attempts = {}

    def again(self, batch_id: int, part: int | None) -> bool:
        """Count one more attempt at ``(batch_id, part)``, lost; whether it may be made again
        (False once ``max_attempts`` are spent: give it up)."""
        key = (batch_id, part)
        self._attempts[key] = self._attempts.get(key, 1) + 1
        return self._attempts[key] <= self.max_attempts

    def requeued(self) -> None:
        """A lost task went back to the queue."""
        self.counters["retries"] += 1

    @property
    def timeout(self) -> float | None:
        """Seconds a worker may spend on one task now (None: no limit)."""
        return self.limit.seconds()

    def overdue(self, workers: Iterable[Worker]) -> Iterator[Worker]:
        """Workers on one task for longer than ``timeout`` (each counted as a timeout)."""
        timeout = self.timeout
        if timeout is None:
            return
        now = time.monotonic()
        for worker in list(workers):
            started = worker.head_started()
            if started is not None and now - started > timeout:
                self.counters["timeouts"] += 1
                yield worker

    def timeout_words(self) -> tuple[str, str]:
        """Why a worker past the timeout was stopped, and DataLoader's words for the error a
        given-up batch raises (scripts match them)."""
        timeout = self.timeout
        return (
            f"exceeded timeout={timeout:g}s",
            f"DataLoader timed out after {timeout:g} seconds",
        )

    def credit_pause(self, workers: Iterable[Worker], overrun_s: float) -> bool:
        """A wait that overran its timeout by ``overrun_s``, far (``PAUSE_S`` or more), means
        this process was not running (Ctrl-Z, SIGSTOP, a paused VM): that time does not count
        against the workers' ``timeout``. Whether it was credited."""
        if overrun_s < PAUSE_S:
            return False
        for worker in workers:
            started = worker.head_started()
            if started is not None:
                worker.last_progress = started + overrun_s
        return True

    def wait_s(self, workers: Iterable[Worker], tick: float) -> float:
        """How long the dispatcher may wait: ``tick``, or less where a worker's task would run
        past the timeout sooner."""
        timeout = self.timeout
        if timeout is None:
            return tick
        now = time.monotonic()
        deadlines = [
            started + timeout - now for w in workers if (started := w.head_started()) is not None
        ]
        return max(0.001, min([tick, *deadlines]))

    def given_up(self, task: Task, reason: str, lead: str | None = None) -> str:
        """The message of the error (or skip) for ``task``, given up: its worker ``reason``
        on every attempt. ``lead``: DataLoader's words, put first."""
        message = (
            f"batch {task.batch_id} (indices {task.indices}) was not made: its worker {reason} "
            f"on each of {self.max_attempts} attempts"
        )
        return f"{lead.rstrip('.')}; {message}" if lead else message
