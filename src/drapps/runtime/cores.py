"""A host-wide core budget shared by the auto-tuned loaders of one machine.

Under data-parallel training every rank of a host runs its own loader, and each controller,
alone, would grow to one worker per core: eight ranks would oversubscribe the host eight times.
The loaders of a host therefore share one budget, kept in a small file in the temporary
directory (no service, no network; not in ``/dev/shm``, which holds no file of drapps') and
updated under an exclusive ``flock``: each loader records the workers it holds, and may hold
at most

    max(fair share, cores - what the others hold),  fair share = cores // loaders (at least 1)

so a loader whose training loop waits can take cores that the others do not use, every loader is
always granted its fair share, and a loader above its share shrinks when a newcomer claims its
own. Entries of processes that have exited are dropped on every update.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import psutil

_ids = iter(range(1, 1 << 62))
_ids_lock = threading.Lock()

# Held while this process has the budget file open. A child forked meanwhile (a worker, the
# zygote) would share the locked descriptor, and the flock with it, for as long as it lives:
# every loader of the host would then wait on it. So a fork waits for the file to be closed.
_open = threading.Lock()
os.register_at_fork(before=_open.acquire, after_in_parent=_open.release,
                    after_in_child=_open.release)  # fmt: skip


def default_budget_path() -> str:
    """The budget file of this user on this host."""
    return os.path.join(tempfile.gettempdir(), f"drapps-cores-{os.getuid()}.json")


class CoreBudget:
    """One loader's share of the host's cores.

    Args:
        cores: the cores the loaders of this host share.
        path: the budget file (default: one per user in the temporary directory).
    """

    def __init__(self, cores: int, path: str | None = None) -> None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"cores must be an int >= 1, got {cores!r}")
        self.cores = cores
        self.path = path or default_budget_path()
        with _ids_lock:
            self.key = f"{os.getpid()}:{next(_ids)}"
        self._closed = False

    def grant(self, wanted: int, floor: int = 1) -> int:
        """Record that this loader holds ``min(wanted, allowance)`` workers, but never fewer
        than ``floor`` (the loader's own lower bound); return that count."""
        with self._locked() as claims:
            granted = max(floor, min(wanted, self._allowance(claims)))
            claims[self.key] = granted
        return granted

    def allowance(self) -> int:
        """The most workers this loader may hold now."""
        with self._locked() as claims:
            return self._allowance(claims)

    def claims(self) -> dict[str, int]:
        """Workers held by each live loader of the host (``"pid:n"`` -> workers)."""
        with self._locked() as claims:
            return dict(claims)

    def release(self) -> None:
        """Give this loader's share back. Idempotent; only acts in the process that made it."""
        if self._closed or not self.key.startswith(f"{os.getpid()}:"):
            return
        self._closed = True
        with contextlib.suppress(OSError), self._locked() as claims:
            claims.pop(self.key, None)

    def _allowance(self, claims: dict[str, int]) -> int:
        others = {k: v for k, v in claims.items() if k != self.key}
        fair = max(1, self.cores // (len(others) + 1))
        return max(fair, self.cores - sum(others.values()))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, int]]:
        with _open:  # no fork while the file is open here (see _open)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                if os.fstat(fd).st_uid != os.getuid():  # another user planted it: untrusted
                    raise PermissionError(f"core budget file {self.path} belongs to another user")
                fcntl.flock(fd, fcntl.LOCK_EX)
                with os.fdopen(os.dup(fd), "r+", encoding="utf-8") as file:
                    claims = _live(_parse(file.read()))
                    if self._closed:
                        claims.pop(self.key, None)
                    yield claims
                    file.seek(0)
                    file.truncate()
                    file.write(json.dumps(claims))
            finally:
                os.close(fd)  # closing the last descriptor releases the lock


def _parse(text: str) -> dict[str, int]:
    try:
        data: Any = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}  # a file cut short by a killed writer: start over
    if not isinstance(data, dict):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int) and v >= 0}


def _live(claims: dict[str, int]) -> dict[str, int]:
    alive: dict[str, bool] = {}
    kept = {}
    for key, workers in claims.items():
        pid = key.split(":", 1)[0]
        if pid not in alive:
            alive[pid] = pid.isdigit() and psutil.pid_exists(int(pid))
        if alive[pid]:
            kept[key] = workers
    return kept


class HostShare:
    """A loader's share of the host's cores, active only under ``torch.distributed`` (where
    every rank of a host runs a loader of its own); elsewhere every request is granted."""

    def __init__(self) -> None:
        self._budget: CoreBudget | None = None

    def grant(self, wanted: int, floor: int) -> int:
        """As :meth:`CoreBudget.grant`, once torch.distributed runs several ranks."""
        if self._budget is None:
            from drapps.runtime.config import usable_cores
            from drapps.runtime.sampling import world

            if world() is None:
                return wanted
            self._budget = CoreBudget(usable_cores())
        return self._budget.grant(wanted, floor)

    def release(self) -> None:
        if self._budget is not None:
            self._budget.release()
