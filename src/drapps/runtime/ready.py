"""Which pipes, sockets and sentinels are ready to read, asked of the kernel directly.

``multiprocessing.connection.wait`` and ``Connection.poll`` build a selector in Python on every
call (about 20 us each); the dispatcher asks once or twice a batch and each worker once a
task, which batches of samples made in memory notice. These ask ``poll(2)`` itself (about
2 us) and answer the same: an item is ready when reading it would not block, which includes
its other end having closed.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any


def _fd(item: Any) -> int:
    return item if isinstance(item, int) else item.fileno()


def ready(items: Sequence[Any], timeout: float | None) -> list[Any]:
    """The ones of ``items`` (connections, sockets or descriptors) ready to read, waiting up
    to ``timeout`` seconds (None: until one is) for the first: what
    ``multiprocessing.connection.wait(items, timeout)`` returns.

    Raises:
        OSError: an item is a closed connection.
    """
    poller = select.poll()
    by_fd: dict[int, list[Any]] = {}
    for item in items:
        fd = _fd(item)
        if fd not in by_fd:
            by_fd[fd] = []
            poller.register(fd, select.POLLIN)
        by_fd[fd].append(item)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1e3))
    return [item for fd, _ in poller.poll(ms) for item in by_fd[fd]]


def readable(item: Any) -> bool:
    """Whether ``item`` can be read now without blocking: ``Connection.poll()``.

    Raises:
        OSError: ``item`` is a closed connection.
    """
    poller = select.poll()
    poller.register(_fd(item), select.POLLIN)
    return bool(poller.poll(0))
