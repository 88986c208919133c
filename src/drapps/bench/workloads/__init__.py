"""Benchmark workloads, registered by name in :data:`WORKLOADS`."""

from __future__ import annotations

from drapps.bench.workloads._base import SIZES, Workload
from drapps.bench.workloads.image import ImageWorkload
from drapps.bench.workloads.image_gil import ImageGilWorkload
from drapps.bench.workloads.stragglers import StragglersWorkload
from drapps.bench.workloads.synthetic import SyntheticWorkload
from drapps.bench.workloads.text import TextWorkload
from drapps.registry import Registry

WORKLOADS: Registry[type[Workload]] = Registry("workload")
"""Workload classes by name (``drapps bench --workloads``)."""
for _workload in (
    ImageWorkload,
    ImageGilWorkload,
    TextWorkload,
    SyntheticWorkload,
    StragglersWorkload,
):
    WORKLOADS.register(_workload.name, _workload)


def workload_class(name: str) -> type[Workload]:
    """The workload registered as ``name``; the error lists the valid names."""
    return WORKLOADS.get(name)


__all__ = ["SIZES", "WORKLOADS", "Workload", "workload_class"]
