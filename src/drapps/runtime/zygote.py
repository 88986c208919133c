"""Workers forked from a clean parent: one small process per pool that holds the recipe and
forks each worker on request.

A pool's workers start all through an epoch (the controller adds them, a dead one is
replaced), not only when it begins. Forked from the training process, each would copy a
process that runs threads (the dispatcher, the controller, the user's own): a lock one of them
held at that instant stays held forever in the child. Spawned, each would receive its own
pickled copy of the dataset, one after another, seconds each for a large one.

So a pool starts one :class:`Zygote` when an epoch begins (where DataLoader starts its
workers), in the caller's thread and with the user's start method: under ``fork`` it inherits
the dataset as DataLoader's workers would; under ``spawn`` and ``forkserver`` the dataset
crosses to it once. The zygote runs no thread; it freezes what it holds out of the garbage
collector's walks (``gc.freeze``: forked pages stay shared) and forks every worker the pool
asks for. The worker's pipes and clock cross to it as descriptors over a Unix socket, and a
pidfd of each worker comes back, so the pool watches, signals and reaps a process that is not
its child (exit codes arrive from the zygote, which waits for its children).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import reduction, util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from drapps.runtime.inbox import Parent

logger = logging.getLogger(__name__)

_REPORT_S = 5.0
"""The longest a pool waits for the zygote to report an exit it can already see."""


class Zygote:
    """The pool's side of a zygote process (see the module's docstring).

    Args:
        context: the start method the zygote itself starts with.
        main: runs in each forked worker, ``main(fds, **kwargs)`` with the descriptors and
            keywords :meth:`fork` was given; the zygote holds it (with the dataset in it).
        name: the zygote process's name.
    """

    def __init__(self, context: BaseContext, main: Callable[..., None], name: str) -> None:
        ours, theirs = context.Pipe(duplex=True)  # a Unix socket pair
        self._control = ours
        self._socket = socket.socket(fileno=os.dup(ours.fileno()))
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_zygote_main, args=(main, theirs, os.getpid()), name=name, daemon=True
        )
        self.process.start()
        self.pid: int | None = self.process.pid
        """The zygote's process id (kept: it is read from other threads after a close)."""
        theirs.close()
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self.retired = False
        """No new worker comes from it; it closes once its last worker is reaped."""

    @property
    def closed(self) -> bool:
        return self._control.closed

    def alive(self) -> bool:
        return not self.closed and self.process.is_alive()

    def retire(self) -> None:
        """Fork no more; close once the last worker it forked is reaped."""
        with self._lock:
            self.retired = True
            last = not self._children
        if last:
            self.close()

    def fork(self, fds: list[int], name: str, **kwargs: Any) -> ForkedProcess:
        """A new worker ``name`` running ``main(fds, **kwargs)``; ``fds`` are duplicated into
        it.

        Raises:
            OSError: the zygote is gone (its pipe broke).
        """
        with self._lock:
            self._control.send((name, kwargs))
            reduction.sendfds(self._socket, fds)
            while True:
                message = self._next(timeout=None)
                if message is not None and message[0] == "forked":
                    pidfd = reduction.recvfds(self._socket, 1)[0]
                    self._children.add(message[1])
                    return ForkedProcess(self, message[1], pidfd, name)

    def exitcode(self, pid: int, wait_s: float = 0.0) -> int | None:
        """``pid``'s exit code, once the zygote reported it (waiting up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while pid not in self._exits:
                left = deadline - time.monotonic()
                try:
                    if self._next(timeout=max(0.0, left)) is None and left <= 0:
                        break
                except (EOFError, OSError):
                    break  # the zygote is gone: its children's codes went with it
            return self._exits.get(pid)

    def forget(self, pid: int) -> None:
        """``pid`` was reaped: its code is no longer needed (the last one closes a retired
        zygote)."""
        with self._lock:
            self._children.discard(pid)
            self._exits.pop(pid, None)
            last = self.retired and not self._children
        if last:
            self.close()

    def _next(self, timeout: float | None) -> tuple[Any, ...] | None:
        """The zygote's next message (None if none came within ``timeout``); exits are
        recorded as they pass."""
        if timeout is not None and not self._control.poll(timeout):
            return None
        message: tuple[Any, ...] = self._control.recv()
        if message[0] == "exit":
            self._exits[message[1]] = message[2]
        return message

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the zygote exit (its workers run on until they are told to stop). Idempotent."""
        with self._lock:
            if self._control.closed:
                return
            with contextlib.suppress(OSError):
                self._control.send(None)
            self._control.close()
            self._socket.close()
        self.process.join(timeout=timeout_s)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(timeout=timeout_s)
        with contextlib.suppress(ValueError):
            self.process.close()


class ForkedProcess:
    """A worker the zygote forked, with what the pools use of a ``multiprocessing`` process:
    ``pid``, ``sentinel`` (a pidfd: readable once it exits), ``exitcode`` (as
    ``multiprocessing`` gives it: negative for a signal), ``is_alive``, ``kill``, ``join``,
    ``close``."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int, name: str | None) -> None:
        self._zygote = zygote
        self.pid = pid
        self.sentinel = pidfd
        self.name = name
        self._code: int | None = None

    def _exited(self, timeout: float) -> bool:
        return bool(select.select([self.sentinel], [], [], timeout)[0])

    @property
    def exitcode(self) -> int | None:
        if self._code is None and self.sentinel >= 0 and self._exited(0.0):
            self._code = self._zygote.exitcode(self.pid, wait_s=_REPORT_S)
            if self._code is None:  # its zygote died before it could say
                self._code = -signal.SIGKILL
        return self._code

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        if self._code is None and self.sentinel >= 0:
            self._exited(timeout if timeout is not None else 1e9)

    def kill(self) -> None:
        if self._code is None and self.sentinel >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.sentinel, signal.SIGKILL)

    def close(self) -> None:
        """Let go of the pidfd (once it has exited)."""
        if self.exitcode is None:
            raise ValueError(f"worker {self.pid} is still running")
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1
            self._zygote.forget(self.pid)


# --------------------------------------------------------------------------- in the zygote


def _zygote_main(main: Callable[..., None], control: Connection, parent_pid: int) -> None:
    """The zygote: fork a worker for each request until the pool closes it or the training
    process exits; report each worker's exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    sock = socket.socket(fileno=os.dup(control.fileno()))
    parent = Parent(parent_pid)
    children: dict[int, int] = {}  # pidfd: pid
    gc.freeze()  # what it holds now is never walked again: in the workers its pages stay shared
    warned = False
    while not parent.gone():
        ready = wait([control, *children], timeout=1.0)
        for pidfd in [fd for fd in ready if isinstance(fd, int)]:
            pid = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            control.send(("exit", pid, os.waitstatus_to_exitcode(status)))
        if control not in ready:
            continue
        try:
            request = control.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        name, kwargs = request
        fds = reduction.recvfds(sock, 3)
        if threading.active_count() > 1 and not warned:
            warned = True
            logger.warning(
                "a thread started in drapps' zygote process (%s); its workers are forked "
                "from it all the same",
                [t.name for t in threading.enumerate()],
            )
        pid = os.fork()
        if pid == 0:
            _worker_main(main, name, fds, kwargs, [control.fileno(), sock.fileno(), *children])
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        children[pidfd] = pid
        control.send(("forked", pid))
        reduction.sendfds(sock, [pidfd])


def _worker_main(
    main: Callable[..., None], name: str, fds: list[int], kwargs: dict[str, Any], close: list[int]
) -> None:
    """A forked worker: run ``main`` and exit with its code, as a ``multiprocessing`` process
    would, without the zygote's exit handlers."""
    code = 1
    try:
        for fd in close:
            os.close(fd)
        util._run_after_forkers()  # type: ignore[attr-defined]  # what multiprocessing does in every forked child
        import multiprocessing

        multiprocessing.current_process().name = name
        main(fds, **kwargs)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
