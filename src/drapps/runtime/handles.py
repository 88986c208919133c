"""Open handles a dataset holds, which threads of one process would share.

A file object read with ``seek`` then ``read`` (a record at an offset, a member of a tar
archive) gives each caller the bytes at the position the last ``seek`` left, whoever made it:
two threads making samples from one such handle read each other's records, and nothing
fails. Worker processes each hold their own (opened before the fork, or after it in each), so
a dataset that holds one keeps making its samples one at a time in each process
(:class:`drapps.runtime.worker.SampleThreads`, :func:`drapps.runtime.thread_pool.thread_hazard`).

Example:
    >>> import io
    >>> class Records:
    ...     def __init__(self):
    ...         self.file = io.BytesIO(b"0123")
    >>> shared_handle(Records())
    "an open file (io.BytesIO) in its attribute 'file'"
    >>> shared_handle(object()) is None
    True
"""

from __future__ import annotations

import io
import socket
import tarfile
from typing import Any

HANDLES: tuple[type, ...] = (io.IOBase, socket.socket, tarfile.TarFile)
"""Types of handles whose position or stream threads would share."""

DEPTH = 2
"""How deep :func:`shared_handle` looks: the dataset's attributes, and theirs (a reader
object the dataset holds), and the items of a list, tuple or dict among them."""


def shared_handle(obj: Any, depth: int = DEPTH) -> str | None:
    """The first open handle ``obj`` holds within :data:`DEPTH` attributes, in words; None
    where it holds none (a closed file counts as none)."""
    return _find(obj, depth, "", set())


def _find(obj: Any, depth: int, path: str, seen: set[int]) -> str | None:
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, HANDLES) and not getattr(obj, "closed", False):
        kind = "an open file" if isinstance(obj, io.IOBase) else "an open handle"
        name = f"{type(obj).__module__}.{type(obj).__qualname__}".replace("_io.", "io.")
        return f"{kind} ({name}) in its attribute {path!r}"
    if depth <= 0:
        return None
    if isinstance(obj, (list, tuple)):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(obj[:64]))
    elif isinstance(obj, dict):
        children = ((f"{path}[{k!r}]", v) for k, v in list(obj.items())[:64])
    else:
        attributes = getattr(obj, "__dict__", None)
        if not isinstance(attributes, dict):
            return None
        children = ((f"{path}.{k}" if path else k, v) for k, v in attributes.items())
    for where, child in children:
        if isinstance(child, (str, bytes, int, float, bool, type(None))):
            continue
        found = _find(child, depth - 1, where, seen)
        if found is not None:
            return found
    return None
