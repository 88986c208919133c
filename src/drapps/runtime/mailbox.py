"""Commands from other threads to the dispatcher's thread, and the pipe that wakes it.

The training loop, the controller and the loader call in from their own threads (a new
epoch, a resize, a prefetch depth, stop). :class:`Mailbox` queues each command, wakes the
dispatcher's thread out of its wait on the workers' pipes, and lets a caller wait until the
thread has applied what it sent. Before the thread exists a setting simply holds; the first
epoch starts the thread.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

Apply = Callable[[str, Any], None]
"""Apply one command (its name, its value) in the dispatcher's thread."""


class Mailbox:
    """The dispatcher's commands and its wake-up pipe.

    Args:
        name: the thread's name.
        run: the thread's body, started by the first ``"epoch"`` command.
        apply: applies one command; called in the thread, or at once (under the mailbox's
            lock) while there is no thread yet.
    """

    def __init__(self, name: str, run: Callable[[], None], apply: Apply) -> None:
        self._name, self._run, self._apply = name, run, apply
        self._lock = threading.Lock()
        self._commands: list[tuple[str, Any]] = []
        self._late: collections.deque[tuple[str, Any]] = collections.deque()  # from finalizers
        self._applied = threading.Condition(self._lock)
        self._sent = 0
        self._done = 0
        self.wake_fd, self._wake_w = os.pipe()
        """Readable when the thread has something to do (poll it beside the workers)."""
        os.set_blocking(self._wake_w, False)
        self.thread: threading.Thread | None = None
        self.stopped = False
        self._closed = False

    def post(self, name: str, value: Any, *, wait_applied: bool) -> None:
        """Send command ``name``; with ``wait_applied``, return once the thread applied it."""
        with self._lock:
            if self.stopped:
                raise RuntimeError("this drapps.Loader is closed")
            if self.thread is None and name != "epoch":
                self._apply(name, value)  # no pool yet: it holds when the first epoch starts
                return
            self._commands.append((name, value))
            self._sent += 1
            seq = self._sent
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self.thread.start()
        self.wake()
        if wait_applied and self.thread is not threading.current_thread():
            with self._applied:
                while self._done < seq and not self.stopped:
                    self._applied.wait(timeout=1.0)

    def post_from_finalizer(self, name: str, value: Any) -> None:
        """Send command ``name`` from a finalizer (``__del__``), which may run in a thread
        that holds this mailbox's lock already (a garbage collection inside :meth:`post`), so
        it never waits for the lock: the command is queued apart, and the thread applies it
        on its next pass (woken now where the lock is free, else within its tick). Nothing is
        sent once stopped."""
        if self.stopped:
            return
        self._late.append((name, value))  # atomic: needs no lock
        if self._lock.acquire(blocking=False):
            try:
                if not self._closed:
                    with contextlib.suppress(OSError):  # a full pipe wakes it just as well
                        os.write(self._wake_w, b"x")
            finally:
                self._lock.release()

    def apply_all(self) -> None:
        """In the thread: apply every command sent so far, in order (then those sent from
        finalizers), and tell the waiters."""
        with self._lock:
            commands, self._commands = self._commands, []
            seq = self._sent
        while self._late:
            commands.append(self._late.popleft())
        for name, value in commands:
            self._apply(name, value)
        with self._applied:
            self._done = seq
            self._applied.notify_all()

    def wake(self) -> None:
        """Wake the thread from its wait (a no-op once closed)."""
        # Under the lock: once close() shut the pipe its fd number may belong to another file.
        with self._lock:
            if self._closed:
                return
            # A full pipe wakes the thread just as well as a write that lands.
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def woken(self) -> None:
        """In the thread, after a wait the pipe ended: empty it."""
        os.read(self.wake_fd, 4096)

    def stop(self) -> bool:
        """Refuse commands from now on; False if already stopped."""
        with self._lock:
            if self.stopped:
                return False
            self.stopped = True
            return True

    def close(self) -> bool:
        """Stop and shut the pipe; False if already closed. Callers waiting are let go."""
        with self._lock:
            if self._closed:
                return False
            self._closed = self.stopped = True
            os.close(self.wake_fd)
            os.close(self._wake_w)
        return True

    def finished(self) -> None:
        """The thread ends: no caller waits on it any longer."""
        with self._applied:
            self._applied.notify_all()
