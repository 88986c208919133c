"""A dataset's identity from its files, for sample-cache keys."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any


def file_fingerprint(paths: Sequence[str], how: Any) -> str:
    """A hash of each file's path, size and modification time, and of ``how`` it is read (a
    function's qualified name, or a string): a file rewritten in place changes it."""
    digest = hashlib.blake2b(digest_size=20)
    name = getattr(how, "__qualname__", None)
    digest.update((f"{getattr(how, '__module__', '')}.{name}" if name else str(how)).encode())
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
