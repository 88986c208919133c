"""Where a loader's workers run, and where its batches may come from, by name.

``Loader(backend=...)`` takes a registered name ("process", "thread", "ray") or a :class:`Backend`
object; ``Loader(source="redis://...")`` picks the engine registered for the URL's scheme. The
members that need a heavy engine (Ray, Redis) are imported by module name only when used, so
the loader never imports an integration.
"""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any
from urllib.parse import urlsplit

from drapps.engines.source import redact_url
from drapps.registry import Registry
from drapps.runtime.errors import warn_user
from drapps.runtime.pool import WorkerPool
from drapps.runtime.sampling import is_iterable_dataset
from drapps.runtime.worker import BatchRecipe, unsendable


class Backend(ABC):
    """Where a map-style dataset's workers run (a member of :data:`BACKENDS`)."""

    name = ""
    local = True
    """Workers share this machine (its cores, its shared-memory cache)."""
    caches = True
    """Workers can read and write the sample cache (its handles are one per process)."""

    def check(self, workers: Any, dataset: Any, cache: Any) -> None:
        """Refuse what this backend cannot do, naming the argument."""
        return None

    @abstractmethod
    def make_pool(self, recipe: BatchRecipe, context: BaseContext | None) -> WorkerPool:
        """The worker pool the dispatcher runs batches on."""

    def sendable(self, c: Any, recipe: BatchRecipe) -> bool:
        """Whether workers started by ``c``'s start method (a LoaderConfig) can receive
        ``recipe``. Under the default count a part that cannot go makes the loader load in
        this process, as DataLoader's default does, with one warning; a count the user asked
        for raises, naming the part.

        Raises:
            pickle.PicklingError: a part cannot be sent to the workers the user asked for.
        """
        method = (c.context or multiprocessing.get_context()).get_start_method()
        problem = unsendable(recipe) if method != "fork" else None
        if problem is None:
            return True
        name, exc = problem
        why = (
            f"{name} cannot be sent to {method!r} worker processes "
            f"({type(exc).__name__}: {exc}); define it at module level (not inside a function, "
            "and not a lambda) so the workers can import it"
        )
        if c.workers != "auto":
            raise pickle.PicklingError(f"{why}, or use num_workers=0") from exc
        warn_user(f"drapps: {why}; until then batches are made in this process")
        return False


class ProcessBackend(Backend):
    """Worker processes on this machine (the default)."""

    name = "process"

    def make_pool(self, recipe: BatchRecipe, context: BaseContext | None) -> WorkerPool:
        from drapps.runtime.process_pool import ProcessPool

        return ProcessPool(recipe, context)


class ThreadBackend(Backend):
    """Workers as threads of the training process (``backend="thread"``), for a dataset
    whose work releases the GIL (decoding, resizing, reading, waiting on storage).

    A dataset that threads cannot make deterministic (one that draws from a global
    generator, or has a ``worker_init_fn``: see
    :func:`~drapps.runtime.thread_pool.thread_hazard`) keeps worker processes, with a
    warning and the reason in the loader's report.
    """

    name = "thread"
    caches = False

    def __init__(self) -> None:
        self.hazard: str | None = None
        self.keys: list[Any] | None = None
        """The sampler's keys to probe the dataset with (None: ints of its range)."""

    def check(self, workers: Any, dataset: Any, cache: Any) -> None:
        """Refuse an iterable dataset, whose stream is one per worker process, and a sample
        cache asked for (the loader then runs without one).

        Raises:
            ValueError: the dataset is iterable, or a cache was asked for.
        """
        if is_iterable_dataset(dataset):
            raise ValueError(
                "backend='thread' needs a map-style dataset (its batches are planned by "
                f"index); got the iterable {type(dataset).__name__}"
            )
        if _asks_for_cache(cache):
            raise ValueError(
                "cache: the sample cache's handles are one per worker process, which "
                "backend='thread' does not start; use cache=None, or backend='process'"
            )

    def sendable(self, c: Any, recipe: BatchRecipe) -> bool:
        from drapps.runtime.thread_pool import thread_hazard

        self.hazard = thread_hazard(recipe, self.keys)
        if self.hazard is None:
            return True  # nothing crosses a process boundary
        warn_user(f"drapps: backend='thread': {self.hazard}; its workers run as processes")
        return super().sendable(c, recipe)

    def make_pool(self, recipe: BatchRecipe, context: BaseContext | None) -> WorkerPool:
        if self.hazard is None:
            from drapps.runtime.thread_pool import ThreadPool

            return ThreadPool(recipe)
        pool = ProcessBackend().make_pool(recipe, context)
        pool.why = f"threads were asked for (backend='thread'), but {self.hazard}"
        return pool


@dataclass(frozen=True)
class RayBackend(Backend):
    """How the Ray backend runs (``Loader(backend=RayBackend(...))``; ``backend="ray"`` is
    ``RayBackend()``). Needs the ``ray`` extra.

    Example:
        >>> import drapps
        >>> drapps.RayBackend(cpus_per_worker=2).cpus_per_worker
        2.0
    """

    address: str | None = None
    """The cluster to join when Ray is not initialised yet: ``ray.init(address)``. None: the
    one ``ray.init()`` finds (``RAY_ADDRESS``), or a local one it starts and the loader stops
    when it closes."""
    cpus_per_worker: float = 1.0
    """CPUs each actor reserves in Ray's scheduler."""
    spread: bool = True
    """Spread actors over the cluster's nodes (Ray's ``SPREAD`` strategy) rather than packing
    them onto the first node with room."""

    name = "ray"
    local = False

    def __post_init__(self) -> None:
        cpus = self.cpus_per_worker
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus > 0:
            raise ValueError(f"RayBackend.cpus_per_worker must be > 0, got {cpus!r}")
        object.__setattr__(self, "cpus_per_worker", float(cpus))
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"RayBackend.address must be a str or None, got {self.address!r}")

    def check(self, workers: Any, dataset: Any, cache: Any) -> None:
        """Refuse what the Ray backend cannot do (the loader then runs it without a cache).

        Raises:
            ValueError: an iterable dataset, ``workers=0``, or a cache asked for explicitly.
        """
        if is_iterable_dataset(dataset):
            raise ValueError(
                "backend='ray' needs a map-style dataset (its batches are planned by index); "
                f"got the iterable {type(dataset).__name__}"
            )
        if workers == 0:
            raise ValueError("backend='ray' needs workers >= 1 or 'auto', got workers=0")
        if _asks_for_cache(cache):
            raise ValueError(
                "cache: with backend='ray' the actors may run on other machines, out of reach "
                "of this machine's shared-memory cache; use cache=None"
            )

    def sendable(self, c: Any, recipe: BatchRecipe) -> bool:
        return True  # Ray sends with cloudpickle, which takes local functions and classes

    def make_pool(self, recipe: BatchRecipe, context: BaseContext | None) -> WorkerPool:
        # The pool takes plain options: it never imports engines/, which names it only here.
        pool: WorkerPool = importlib.import_module("drapps.integrations.ray_pool").RayPool(
            recipe, address=self.address, cpus_per_worker=self.cpus_per_worker, spread=self.spread
        )
        return pool


def _asks_for_cache(cache: Any) -> bool:
    """Whether the loader's ``cache=`` asks for a cache (not off, and not "auto")."""
    return not (cache is None or cache is False or (isinstance(cache, str) and cache == "auto"))


BACKENDS: Registry[type[Backend]] = Registry("backend")
BACKENDS.register("process", ProcessBackend)
BACKENDS.register("ray", RayBackend)
BACKENDS.register("thread", ThreadBackend)


def resolve_backend(backend: Any) -> Backend:
    """The loader's ``backend=`` argument as a :class:`Backend`.

    Raises:
        ValueError: not a registered name or a :class:`Backend`.
    """
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str) and backend in BACKENDS.names():
        return BACKENDS.get(backend)()
    raise ValueError(
        f"backend must be one of {BACKENDS.names()} or a drapps.RayBackend, got {backend!r}"
    )


SOURCES: Registry[str] = Registry("source scheme")
"""URL scheme -> ``"module:Engine"`` that reads batches made elsewhere."""
for _scheme in ("redis", "rediss", "unix"):
    SOURCES.register(_scheme, "drapps.integrations.redis_source:RedisSource")


def source_engine(source: str) -> Any:
    """The engine class registered for ``source``'s URL scheme.

    Raises:
        ValueError: ``source`` is not a URL of a registered scheme.
    """
    scheme = urlsplit(source).scheme if isinstance(source, str) and "://" in source else None
    if scheme not in SOURCES.names():
        shown = repr(redact_url(source)) if isinstance(source, str) else redact_url(source)
        raise ValueError(
            f"source must be a Redis URL (redis://host:port/db?queue=NAME; the schemes known "
            f"are {SOURCES.names()}), got {shown}"
        )
    module, _, name = SOURCES.get(scheme).partition(":")
    return getattr(importlib.import_module(module), name)
