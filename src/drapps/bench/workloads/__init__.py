"""Benchmark workloads, registered by name; ``make_workload`` lists the valid names."""

from __future__ import annotations

from drapps.bench.workloads._base import SIZES, Workload
from drapps.bench.workloads.image import ImageWorkload
from drapps.bench.workloads.synthetic import SyntheticWorkload
from drapps.bench.workloads.text import TextWorkload

WORKLOADS: dict[str, type[Workload]] = {
    w.name: w for w in (ImageWorkload, TextWorkload, SyntheticWorkload)
}


def workload_class(name: str) -> type[Workload]:
    """The workload registered as ``name``; the error lists the valid names."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {list(WORKLOADS)}, got {name!r}")
    return WORKLOADS[name]


__all__ = ["SIZES", "WORKLOADS", "Workload", "workload_class"]
