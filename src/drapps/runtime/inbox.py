"""A worker's side of its pipes: the training process it watches, and the tasks it takes.

:class:`Parent` tells a worker when the training process has gone (whoever the worker's own
parent is); :class:`Inbox` holds the messages sent and not yet taken, and gives out the task
for the earliest batch first.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from drapps.runtime.messages import BatchTask, SlabsFreed
from drapps.runtime.ready import readable, ready

_PARENT_CHECK_S = 1.0
"""How often a waiting worker looks whether the training process is still there."""

PARENT_GONE = object()


class Parent:
    """The training process, as a worker watches it: :meth:`gone` once it has exited.

    A worker's own parent is the training process only under ``fork`` and ``spawn``; under
    ``forkserver`` it is the fork server, which outlives the training process, so a changed
    ``os.getppid()`` cannot be the sign. A pidfd of the training process (Linux 5.3+) turns
    readable when it exits, whoever the worker's parent is; where there is none, the parent
    pid (when it is the training process) or the process's existence is checked.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        self._by_ppid = os.getppid() == pid
        if not self._by_ppid and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.fd = os.pidfd_open(pid)

    def gone(self) -> bool:
        """Whether the training process has exited."""
        if self._by_ppid:
            return os.getppid() != self.pid
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], 0)[0])
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # it exists, as another user's process: ours has not been reaped yet
        return False


def next_task(tasks: Connection, parent: Parent) -> Any:
    """The next message from the training process, or ``PARENT_GONE`` once it has died."""
    watched: list[Any] = [tasks] if parent.fd is None else [tasks, parent.fd]
    while True:
        if tasks in ready(watched, _PARENT_CHECK_S) or readable(tasks):
            return tasks.recv()
        if parent.gone():
            return PARENT_GONE


class Inbox:
    """A worker's messages from the training process. Of the tasks waiting, the one for the
    earliest batch (of the newest generation) goes first, then the order sent: a copy of an
    overdue part of the batch the loop waits for overtakes the later batches queued before
    it. The tasks behind the current one are visible (to read ahead for); slab releases
    (:class:`SlabsFreed`) go to ``released`` as they arrive; a stop (``None``) stays behind
    every task sent before it."""

    def __init__(self, tasks: Connection, parent: Parent, released: Callable[[Any], None]) -> None:
        self.tasks, self.parent, self.released = tasks, parent, released
        self._queued: collections.deque[Any] = collections.deque()

    def next(self) -> Any:
        """The next task, ``None`` (stop) or ``PARENT_GONE``."""
        self.waiting()
        while True:
            if self._queued:
                return self._take_first()
            message = next_task(self.tasks, self.parent)
            if not self._free(message):
                return message

    def waiting(self) -> list[Any]:
        """The tasks sent after the current one and not taken yet (without blocking)."""
        while readable(self.tasks):
            message = self.tasks.recv()
            if not self._free(message):
                self._queued.append(message)
        return [m for m in self._queued if m is not None]

    def _take_first(self) -> Any:
        queued = self._queued
        end = next((i for i, m in enumerate(queued) if not isinstance(m, BatchTask)), len(queued))
        if end == 0:
            return queued.popleft()  # None (stop) or PARENT_GONE
        first = min(range(end), key=lambda i: urgency(queued[i].generation, queued[i].batch_id))
        task = queued[first]
        del queued[first]
        return task

    def _free(self, message: Any) -> bool:
        if isinstance(message, SlabsFreed):
            self.released(message.notices)
            return True
        return False


def urgency(generation: int, batch_id: int) -> tuple[int, int]:
    """Sort key of a task: the newest generation, then the earliest batch, first (the order
    a worker takes the tasks it holds in, and the dispatcher's model of it)."""
    return (-generation, batch_id)
