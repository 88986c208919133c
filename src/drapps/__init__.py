"""drapps: a DataLoader drop-in that keeps a training loop fed without hand-tuning.

Example:
    >>> import torch, drapps
    >>> loader = drapps.Loader([torch.arange(3)] * 8, batch_size=4, workers=0)
    >>> [tuple(b.shape) for b in loader]
    [(4, 3), (4, 3)]
"""

from drapps._version import __version__
from drapps.cache import Cache
from drapps.engines.backends import RayBackend
from drapps.engines.source import Source
from drapps.loader import Loader
from drapps.runtime import (
    ArgumentError,
    LoaderConfig,
    SampleError,
    SharedMemoryFullError,
    WorkerTimeoutError,
    sample_rng,
    sample_seed,
)
from drapps.runtime.stats import LoaderStats

__all__ = [
    "ArgumentError",
    "Cache",
    "Loader",
    "LoaderConfig",
    "LoaderStats",
    "RayBackend",
    "SampleError",
    "SharedMemoryFullError",
    "Source",
    "WorkerTimeoutError",
    "__version__",
    "sample_rng",
    "sample_seed",
]
