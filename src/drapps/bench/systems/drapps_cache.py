"""``drapps-cache`` and ``drapps-cache-<codec>``: drapps.Loader with its sample cache.

The workload's samples come as its deterministic part (read and decode; tokenise) and the
random rest as a transform (:meth:`Workload.cached_dataset`), so the cache holds decoded
photos or token ids and the augmentation stays fresh each epoch. ``drapps-cache`` lets the
controller choose the codec (``Cache(codec="auto")``) and the workers; ``drapps-cache-none``,
``-lz4``, ``-zstd``, ``-quantize-16`` and ``-jpeg`` fix the codec (the controller still moves
the workers); ``drapps-cache-psnr35`` lets the controller choose lossy JPEG entries too (those
that decode at 35 dB PSNR or better). ``drapps bench --cache`` runs them from the second
epoch on, beside the same loader without a cache (``drapps-heuristic``), DataLoader and
tf.data; ``--cache-memory`` sets the budget (a dataset four times the budget:
``--cache-memory`` a quarter of its size).
"""

from __future__ import annotations

from typing import ClassVar

import drapps
from drapps._optional import install_hint
from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload
from drapps.cache import available


class DrappsCache(System):
    name = "drapps-cache"
    summary = 'drapps.Loader(workers="auto", cache=Cache(codec="auto")): the controller picks'
    opt_in = True  # run by ``drapps bench --cache``, or when named
    runs_python_step = False  # builds its pipeline from ops, or caches a deterministic part

    codec: ClassVar[str] = "auto"
    min_psnr: ClassVar[float | None] = None
    """Lossy codecs allowed above this PSNR (jpeg systems: 35 dB)."""
    memory: str | None = None
    """The cache's memory budget (``drapps bench --cache-memory``); None: "auto"."""

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return ["auto"]

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        dataset, transform = workload.cached_dataset(throttle)
        cache = drapps.Cache(memory=self.memory or "auto", codec=self.codec, min_psnr=self.min_psnr)
        loader = drapps.Loader(
            dataset,
            batch_size=batch_size,
            drop_last=True,
            shuffle=True,
            seed=seed,
            transform=transform,
            workers=workers,  # type: ignore[arg-type]
            persistent_workers=True,
            cache=cache,
        )
        return EpochSource(loader, lambda: _where(loader))


def _where(loader: drapps.Loader) -> str:
    """Workers and codec at the end of the run, e.g. ``2/zstd``."""
    stats = loader.stats()
    return f"{stats.workers}/{stats.cache['codec'] if stats.cache else 'off'}"


def _fixed(codec: str, needs: str | None = None) -> type[DrappsCache]:
    class Fixed(DrappsCache):
        name = f"drapps-cache-{codec}"
        summary = f"drapps-cache with the codec fixed to {codec}"

        @classmethod
        def unavailable(cls) -> str | None:
            if needs is not None and needs not in available():
                return f"the {needs} codec needs its library: {install_hint('cache')}"
            return None

    Fixed.codec = codec
    Fixed.min_psnr = 35.0 if codec.startswith("jpeg") else None
    Fixed.__name__ = Fixed.__qualname__ = f"DrappsCache_{codec.replace('-', '_')}"
    return Fixed


class DrappsCacheLossy(DrappsCache):
    name = "drapps-cache-psnr35"
    summary = "drapps-cache that may also pick jpeg, where entries decode at 35 dB or better"
    min_psnr = 35.0


CACHE_SYSTEMS: tuple[type[DrappsCache], ...] = (
    DrappsCache,
    DrappsCacheLossy,
    _fixed("none"),
    _fixed("lz4", "lz4"),
    _fixed("zstd", "zstd"),
    _fixed("quantize-16"),
    _fixed("jpeg", "jpeg"),
)
