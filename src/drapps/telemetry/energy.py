"""Energy: joules spent by the CPU, its memory and the GPU, from the best counter the machine has.

Three sources, each used where it can be read, and the reading says which were used:

* **RAPL** (``/sys/class/powercap/intel-rapl:N``, also AMD's on Linux): the CPU package's and the
  DRAM's cumulative energy counters, machine-wide (everything the machine runs, not only the
  pipeline). Recent kernels let only root read them; an unreadable counter is skipped.
* **NVML**'s total-energy counter of the first GPU (Volta and later, with ``nvidia-ml-py``).
* Otherwise an **estimate** of the CPU's share: the CPU seconds of the training process and its
  workers times :data:`WATTS_PER_CORE`. It counts the pipeline's own work only, not idle or
  uncore power, and is labelled an estimate wherever it is shown.

Nothing here leaves the machine: the counters are files and a local driver call.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RAPL_ROOT = Path("/sys/class/powercap")

WATTS_PER_CORE = 6.0
"""Watts one fully busy core draws, for the CPU-time estimate: a server CPU's package power at
full load over its cores is about 4-8 W (e.g. 350 W / 56 cores, 360 W / 96 cores, 125 W / 16
cores). ``DRAPPS_WATTS_PER_CORE`` in the environment sets another figure."""

_PACKAGE = re.compile(r"intel-rapl:\d+")
_SUBZONE = re.compile(r"intel-rapl:\d+:\d+")


@dataclass(frozen=True)
class _Zone:
    """One RAPL counter: its file, its name, and where it wraps."""

    energy: Path
    name: str
    wraps_at: int


def rapl_zones(root: Path = RAPL_ROOT) -> list[_Zone]:
    """The readable package and DRAM counters under ``root`` (core and uncore sub-zones are
    inside the package's count, so they are left out; so are the MMIO duplicates and psys)."""
    zones: list[_Zone] = []
    if not root.is_dir():
        return zones
    for path in sorted(root.glob("intel-rapl:*")):
        if not (_PACKAGE.fullmatch(path.name) or _SUBZONE.fullmatch(path.name)):
            continue
        try:
            name = (path / "name").read_text().strip()
            if _SUBZONE.fullmatch(path.name) and name != "dram":
                continue
            if _PACKAGE.fullmatch(path.name) and not name.startswith(("package", "dram")):
                continue  # psys: the whole platform, which would count the package twice
            int((path / "energy_uj").read_text())
            wraps_at = int((path / "max_energy_range_uj").read_text())
        except (OSError, ValueError) as exc:  # root-only since 2020 on most kernels
            logger.debug("RAPL zone %s unreadable: %s", path, repr(exc))
            continue
        zones.append(_Zone(path / "energy_uj", name, wraps_at))
    return zones


@dataclass(frozen=True)
class EnergyReading:
    """The counters at one instant (cumulative; only differences mean anything)."""

    cpu_s: float
    """CPU seconds of the pipeline's processes, as the caller counted them."""
    rapl_uj: tuple[int, ...]
    """Each RAPL zone's counter, in :meth:`EnergyMeter.zones` order."""
    gpu_mj: int | None
    """NVML's total-energy counter, None without one."""


@dataclass(frozen=True)
class Energy:
    """Joules spent between two readings, by part."""

    cpu_j: float
    """The CPU package's joules (RAPL), or the estimate from CPU time (:attr:`estimated`)."""
    dram_j: float | None
    """DRAM joules by RAPL, None where not read."""
    gpu_j: float | None
    """GPU joules by NVML, None where not read."""
    estimated: bool
    """True when :attr:`cpu_j` is the CPU-time estimate, not a RAPL counter."""

    @property
    def total_j(self) -> float:
        return self.cpu_j + (self.dram_j or 0.0) + (self.gpu_j or 0.0)


class EnergyMeter:
    """Reads the energy counters this machine lets it read; see the module's docstring.

    Example:
        >>> meter = EnergyMeter(rapl_root=Path("/nonexistent"))
        >>> before = meter.read(cpu_s=10.0)
        >>> meter.between(before, meter.read(cpu_s=12.0)).cpu_j  # 2 CPU seconds at 6 W
        12.0
        >>> meter.source
        'CPU-time estimate (6 W per busy core)'
    """

    def __init__(
        self,
        *,
        rapl_root: Path = RAPL_ROOT,
        gpu: Any = None,
        watts_per_core: float | None = None,
    ) -> None:
        """
        Args:
            rapl_root: where the powercap tree is (a test points it at files it wrote).
            gpu: a :class:`~drapps.telemetry.monitor.GpuMeter` (anything with
                ``energy_mj() -> int | None``), or None for no GPU energy.
            watts_per_core: for the estimate; default ``DRAPPS_WATTS_PER_CORE`` or
                :data:`WATTS_PER_CORE`.

        Raises:
            ValueError: ``watts_per_core`` (or the environment's) is not a positive number.
        """
        if watts_per_core is None:
            text = os.environ.get("DRAPPS_WATTS_PER_CORE", "")
            try:
                watts_per_core = float(text) if text else WATTS_PER_CORE
            except ValueError:
                raise ValueError(
                    f"DRAPPS_WATTS_PER_CORE must be a number of watts, got {text!r}"
                ) from None
        if not watts_per_core > 0:
            raise ValueError(f"watts_per_core must be > 0, got {watts_per_core!r}")
        self.watts_per_core = watts_per_core
        self.zones = rapl_zones(rapl_root)
        self._gpu = gpu
        self._has_gpu = gpu is not None and gpu.energy_mj() is not None

    @property
    def source(self) -> str:
        """How the joules are counted, in words ("RAPL package+dram", "CPU-time estimate ...",
        with "+ NVML GPU" where the GPU's counter is read)."""
        if self.zones:
            cpu = "RAPL " + "+".join(dict.fromkeys(z.name.split("-")[0] for z in self.zones))
        else:
            cpu = f"CPU-time estimate ({self.watts_per_core:g} W per busy core)"
        return cpu + (" + NVML GPU" if self._has_gpu else "")

    @property
    def estimated(self) -> bool:
        """True when the CPU's joules are the estimate from CPU time."""
        return not self.zones

    def read(self, cpu_s: float) -> EnergyReading:
        """The counters now; ``cpu_s`` is the pipeline's CPU seconds so far (for the estimate)."""
        counts = []
        for zone in self.zones:
            try:
                counts.append(int(zone.energy.read_text()))
            except (OSError, ValueError):
                counts.append(-1)  # gone (a hot-unplugged package): that zone counts 0
        gpu = self._gpu.energy_mj() if self._has_gpu else None
        return EnergyReading(cpu_s=cpu_s, rapl_uj=tuple(counts), gpu_mj=gpu)

    def between(self, before: EnergyReading, after: EnergyReading) -> Energy:
        """Joules from ``before`` to ``after`` (RAPL counters that wrapped are unwrapped)."""
        package = dram = 0.0
        for zone, old, new in zip(self.zones, before.rapl_uj, after.rapl_uj, strict=True):
            if old < 0 or new < 0:
                continue
            delta = new - old if new >= old else new + zone.wraps_at - old
            if zone.name == "dram":
                dram += delta / 1e6
            else:
                package += delta / 1e6
        if self.zones:
            cpu_j, dram_j = package, (dram if any(z.name == "dram" for z in self.zones) else None)
        else:
            cpu_j, dram_j = max(0.0, after.cpu_s - before.cpu_s) * self.watts_per_core, None
        gpu_j = None
        if before.gpu_mj is not None and after.gpu_mj is not None:
            gpu_j = max(0, after.gpu_mj - before.gpu_mj) / 1000.0
        return Energy(cpu_j=cpu_j, dram_j=dram_j, gpu_j=gpu_j, estimated=not self.zones)
