"""Loading systems the benchmark compares, registered by name."""

from __future__ import annotations

from drapps.bench.systems._base import Source, System, Workers
from drapps.bench.systems.dataloader import DataLoaderSystem
from drapps.bench.systems.drapps_loader import (
    DrappsHeuristic,
    DrappsRl,
    DrappsStatic,
    DrappsStaticPinned,
    DrappsStaticSampler,
)
from drapps.bench.systems.tfdata import TfDataSystem

SYSTEMS: dict[str, type[System]] = {
    s.name: s
    for s in (
        DataLoaderSystem,
        TfDataSystem,
        DrappsStatic,
        DrappsHeuristic,
        DrappsRl,
        DrappsStaticSampler,
        DrappsStaticPinned,
    )
}


def system_class(name: str) -> type[System]:
    """The system registered as ``name``; the error lists the valid names."""
    if name not in SYSTEMS:
        raise ValueError(f"systems must be among {list(SYSTEMS)}, got {name!r}")
    return SYSTEMS[name]


__all__ = ["SYSTEMS", "Source", "System", "Workers", "system_class"]
