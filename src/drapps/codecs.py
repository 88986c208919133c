"""The old name of :mod:`drapps.cache` (the package holds the sample cache and its codecs).

``from drapps.codecs import X`` still works and warns once; import from ``drapps.cache``.
"""

from __future__ import annotations

import importlib
import warnings


def __getattr__(name: str) -> object:
    cache = importlib.import_module("drapps.cache")
    if name not in cache.__all__:
        raise AttributeError(f"module 'drapps.codecs' has no attribute {name!r}")
    warnings.warn(
        f"drapps.codecs is now drapps.cache: import {name} from drapps.cache",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(cache, name)
