"""How batches are made: plan, worker pool, shared-memory transport, reorder buffer, dispatcher."""

from drapps.runtime.config import LoaderConfig
from drapps.runtime.errors import ArgumentError, SampleError, WorkerTimeoutError
from drapps.runtime.plan import Plan
from drapps.runtime.seeding import sample_rng, sample_seed, sample_seed_for
from drapps.runtime.slabs import SharedMemoryFullError
from drapps.runtime.stats import LoaderStats

__all__ = [
    "ArgumentError",
    "LoaderConfig",
    "LoaderStats",
    "Plan",
    "SampleError",
    "SharedMemoryFullError",
    "WorkerTimeoutError",
    "sample_rng",
    "sample_seed",
    "sample_seed_for",
]
