"""Loading systems the benchmark compares, registered by name."""

from __future__ import annotations

from drapps.bench.systems._base import Source, System, Workers
from drapps.bench.systems.dali_gpu import DaliGpu
from drapps.bench.systems.dataloader import DataLoaderSystem, DataLoaderUnorderedSystem
from drapps.bench.systems.drapps_cache import CACHE_SYSTEMS
from drapps.bench.systems.drapps_loader import (
    DrappsFill,
    DrappsHeuristic,
    DrappsRl,
    DrappsStatic,
    DrappsStaticPinned,
    DrappsStaticSampler,
)
from drapps.bench.systems.drapps_offload import DrappsOffload
from drapps.bench.systems.drapps_split import DrappsSplit, DrappsSplitOneWorker
from drapps.bench.systems.peers import PEER_SYSTEMS
from drapps.bench.systems.tfdata import TfDataCacheSystem, TfDataSystem
from drapps.registry import Registry

SYSTEMS: Registry[type[System]] = Registry("system")
"""Loading systems by name (``drapps bench --systems``)."""
_BUILT_IN: tuple[type[System], ...] = (
    DataLoaderSystem,
    DataLoaderUnorderedSystem,
    TfDataSystem,
    TfDataCacheSystem,
    DrappsStatic,
    DrappsHeuristic,
    DrappsRl,
    DrappsStaticSampler,
    DrappsStaticPinned,
    DrappsFill,
    DrappsSplit,
    DrappsSplitOneWorker,
    DrappsOffload,
    *PEER_SYSTEMS,
    DaliGpu,
    *CACHE_SYSTEMS,
)
for _system in _BUILT_IN:
    SYSTEMS.register(_system.name, _system)


def system_class(name: str) -> type[System]:
    """The system registered as ``name``; the error lists the valid names."""
    return SYSTEMS.get(name)


__all__ = ["SYSTEMS", "Source", "System", "Workers", "system_class"]
