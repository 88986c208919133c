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

A fork copies the import locks too. A module that another thread of the training process was
importing at that instant stays half made and locked in the zygote, and a worker that imports
it would wait forever. The zygote looks for such imports before it forks a worker: it answers
the first request with their names (:class:`ImportUnderWay`), and the pool makes a new zygote
once this process has finished them. The imports of the thread that begins the epoch are
left whole: its loop runs inside them, as a script's does when another module imports it,
and a worker sees them as one DataLoader forked from that thread would.
"""

from __future__ import annotations

import contextlib
import gc
import importlib._bootstrap
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

IMPORT_WAIT_S = 60.0
"""The longest a worker's start waits for other threads' imports (:class:`ImportWait`)."""


class ImportUnderWay(Exception):
    """The zygote was forked while another thread of this process was importing ``modules``:
    it forks no worker (one that imported them would wait forever for their locks)."""

    def __init__(self, modules: list[str]) -> None:
        super().__init__(", ".join(modules))
        self.modules = modules


def imports_under_way(thread: int | None = None) -> list[str]:
    """The modules whose import is under way in this process: by thread ``thread`` (an
    ident), or by any thread (None)."""
    return [
        name
        for name, lock in _module_locks()
        if lock.count and (thread is None or lock.owner == thread)
    ]


class ImportWait:
    """One worker's start waiting for other threads' imports (:class:`ImportUnderWay`), for
    at most ``limit_s`` in all."""

    def __init__(self, limit_s: float = IMPORT_WAIT_S) -> None:
        self._limit_s = limit_s
        self._since: float | None = None

    def wait(self, modules: list[str]) -> None:
        """Return once no thread of this process is importing any of ``modules``.

        Raises:
            RuntimeError: some still are, ``limit_s`` after this start first waited.
        """
        now = time.monotonic()
        since = self._since = now if self._since is None else self._since
        while True:
            left = [name for name in imports_under_way() if name in modules]
            if not left:
                return
            if time.monotonic() - since > self._limit_s:
                raise RuntimeError(
                    f"drapps cannot start a worker process: another thread of this process "
                    f"has been importing {', '.join(left)} for {self._limit_s:.0f} s, and a "
                    "worker forked meanwhile would wait for that import forever. Let the "
                    "import finish before the loader starts its workers, or make batches in "
                    "this process (num_workers=0)"
                )
            time.sleep(0.005)


class Zygote:
    """The pool's side of a zygote process (see the module's docstring).

    Args:
        context: the start method the zygote itself starts with.
        main: runs in each forked worker, ``main(fds, **kwargs)`` with the descriptors and
            keywords :meth:`fork` was given; the zygote holds it (with the dataset in it).
        name: the zygote process's name.
        whole: modules whose import the thread that begins the epoch has under way (its
            loop runs inside them): a worker sees them as far as they got, as an import of
            a module that is importing it does, not as imports cut short.
    """

    def __init__(
        self,
        context: BaseContext,
        main: Callable[..., None],
        name: str,
        whole: frozenset[str] = frozenset(),
    ) -> None:
        ours, theirs = context.Pipe(duplex=True)  # a Unix socket pair
        self._control = ours
        self._socket = socket.socket(fileno=os.dup(ours.fileno()))
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_zygote_main,
            args=(main, theirs, os.getpid(), whole),
            name=name,
            daemon=True,
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
            ImportUnderWay: it was forked in the middle of another thread's imports.
        """
        with self._lock:
            self._control.send((name, kwargs))
            reduction.sendfds(self._socket, fds)
            while True:
                message = self._next(timeout=None)
                if message is not None and message[0] == "cut short":
                    raise ImportUnderWay(message[1])
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


def _zygote_main(
    main: Callable[..., None],
    control: Connection,
    parent_pid: int,
    whole: frozenset[str] = frozenset(),
) -> None:
    """The zygote: fork a worker for each request until the pool closes it or the training
    process exits; report each worker's exit. Where the fork cut another thread's imports
    short, answer the first request with their names instead, and exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    cut_short = _imports_cut_short(whole)
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
        if cut_short:
            for fd in fds:
                os.close(fd)
            control.send(("cut short", cut_short))
            return
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


def _module_locks() -> list[tuple[str, Any]]:
    """(name, lock) of each module import lock this process holds now (importlib's own
    table: none where an interpreter keeps it elsewhere)."""
    table = getattr(importlib._bootstrap, "_module_locks", None)
    if not isinstance(table, dict):
        return []
    locks = []
    for name, ref in list(table.items()):
        lock = ref() if callable(ref) else None
        if all(hasattr(lock, attribute) for attribute in ("owner", "count", "lock")):
            locks.append((name, lock))
    return locks


def _imports_cut_short(whole: frozenset[str]) -> list[str]:
    """In a process just forked: the modules another thread was importing at the fork, which
    no thread here will finish. Those in ``whole`` become this thread's, as far as they got
    (an import of them returns the module, as within a circular import)."""
    me = threading.get_ident()
    cut = []
    for name, lock in _module_locks():
        if not lock.lock.acquire(False):  # the fork came as a thread changed the lock itself
            cut.append(name)
            continue
        try:
            if lock.count and lock.owner != me:
                if name in whole:
                    lock.owner = me
                else:
                    cut.append(name)
        finally:
            lock.lock.release()
    return cut
