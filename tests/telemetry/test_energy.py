"""Energy counters: RAPL files as the kernel lays them out, NVML's counter, and the labelled
CPU-time estimate when neither can be read."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import state as make_state

from drapps.control.reward import RewardWeights, reward
from drapps.telemetry import Monitor, PipelineSnapshot
from drapps.telemetry.energy import WATTS_PER_CORE, EnergyMeter, rapl_zones
from drapps.telemetry.monitor import GpuMeter


def write_zone(root: Path, name: str, label: str, energy_uj: int, wraps_at: int = 2**32) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wraps_at}\n")
    return zone


@pytest.fixture()
def powercap(tmp_path: Path) -> Path:
    """A two-socket powercap tree: packages with core, uncore and dram sub-zones, a psys zone
    and the MMIO duplicate of package 0 (the last four must not be counted)."""
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, wraps_at=10_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", "core", 700_000)
    write_zone(tmp_path, "intel-rapl:0:1", "uncore", 100_000)
    write_zone(tmp_path, "intel-rapl:0:2", "dram", 50_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 2_000_000)
    write_zone(tmp_path, "intel-rapl:2", "psys", 9_000_000)
    write_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 1_000_000)
    return tmp_path


def test_rapl_counts_packages_and_dram_once(powercap: Path) -> None:
    meter = EnergyMeter(rapl_root=powercap)
    assert [z.name for z in meter.zones] == ["package-0", "dram", "package-1"]
    assert meter.source == "RAPL package+dram" and not meter.estimated
    before = meter.read(cpu_s=0.0)
    (powercap / "intel-rapl:0" / "energy_uj").write_text("4000000\n")  # +3 J
    (powercap / "intel-rapl:0:2" / "energy_uj").write_text("550000\n")  # +0.5 J
    (powercap / "intel-rapl:1" / "energy_uj").write_text("3000000\n")  # +1 J
    (powercap / "intel-rapl:0:0" / "energy_uj").write_text("9700000\n")  # inside the package
    energy = meter.between(before, meter.read(cpu_s=100.0))  # CPU time plays no part
    assert energy.cpu_j == pytest.approx(4.0) and energy.dram_j == pytest.approx(0.5)
    assert energy.gpu_j is None and energy.total_j == pytest.approx(4.5)


def test_a_rapl_counter_that_wrapped_is_unwrapped(powercap: Path) -> None:
    meter = EnergyMeter(rapl_root=powercap)
    before = meter.read(cpu_s=0.0)
    # package 0 wraps at 10 J: from 1 J, through 10 J, on to 0.5 J is 9.5 J
    (powercap / "intel-rapl:0" / "energy_uj").write_text("500000\n")
    assert meter.between(before, meter.read(cpu_s=0.0)).cpu_j == pytest.approx(9.5)


def test_unreadable_rapl_zones_are_skipped_and_none_left_means_the_estimate(
    tmp_path: Path,
) -> None:
    zone = write_zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (zone / "energy_uj").unlink()
    (zone / "energy_uj").mkdir()  # reading it fails as a root-only file does for a user
    assert rapl_zones(tmp_path) == []
    meter = EnergyMeter(rapl_root=tmp_path, watts_per_core=5.0)
    assert meter.estimated and meter.source == "CPU-time estimate (5 W per busy core)"
    energy = meter.between(meter.read(cpu_s=3.0), meter.read(cpu_s=7.0))
    assert energy.cpu_j == pytest.approx(20.0) and energy.estimated and energy.dram_j is None


def test_the_estimate_takes_its_watts_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAPPS_WATTS_PER_CORE", "12.5")
    assert EnergyMeter(rapl_root=tmp_path).watts_per_core == 12.5
    monkeypatch.setenv("DRAPPS_WATTS_PER_CORE", "lots")
    with pytest.raises(ValueError, match=r"DRAPPS_WATTS_PER_CORE.*'lots'"):
        EnergyMeter(rapl_root=tmp_path)
    with pytest.raises(ValueError, match="watts_per_core must be > 0, got -1"):
        EnergyMeter(rapl_root=tmp_path, watts_per_core=-1)


class FakeNvml:
    """NVML's total-energy call on a board that has it (or raises, on one that does not)."""

    def __init__(self, millijoules: int | None) -> None:
        self.millijoules = millijoules

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        if self.millijoules is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.millijoules


def gpu_meter(nvml: FakeNvml) -> GpuMeter:
    """A GpuMeter whose NVML is ``nvml`` (no GPU here to read a real one)."""
    meter = GpuMeter.__new__(GpuMeter)
    meter._handle, meter._nvml = object(), nvml
    return meter


def test_the_gpu_counter_adds_its_joules(tmp_path: Path) -> None:
    nvml = FakeNvml(5_000)
    meter = EnergyMeter(rapl_root=tmp_path, gpu=gpu_meter(nvml), watts_per_core=6)
    assert meter.source == "CPU-time estimate (6 W per busy core) + NVML GPU"
    before = meter.read(cpu_s=0.0)
    nvml.millijoules = 305_000
    energy = meter.between(before, meter.read(cpu_s=1.0))
    assert energy.gpu_j == pytest.approx(300.0) and energy.total_j == pytest.approx(306.0)
    older = EnergyMeter(rapl_root=tmp_path, gpu=gpu_meter(FakeNvml(None)))
    assert "NVML" not in older.source and older.read(0.0).gpu_mj is None


def test_the_monitor_reports_power_from_the_pipelines_cpu(tmp_path: Path) -> None:
    """Without RAPL (this machine, and most containers), a tick's watts are the pipeline's CPU
    time over the tick at WATTS_PER_CORE, and the State says it is an estimate."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        snapshot = PipelineSnapshot(
            samples=0, wait_s=0.0, ready_batches=0, ready_bytes=0, memory_budget=1,
            workers=1, max_workers=1, prefetch_depth=1, worker_pids=(burner.pid,),
        )  # fmt: skip
        monitor = Monitor(lambda: snapshot)
        monitor.energy = EnergyMeter(rapl_root=tmp_path)  # as on a machine without RAPL
        monitor.sample()
        time.sleep(0.5)
        state = monitor.sample()
        assert state.power_w is not None and "estimate" in (state.energy_source or "")
        assert state.power_w == pytest.approx(
            (state.main_cpu + state.workers_cpu) * WATTS_PER_CORE, rel=1e-6
        )
        assert state.power_w > 0  # the burner's CPU (how much: the machine's speed)
        assert monitor.joules > 0
    finally:
        burner.kill()
        burner.wait()


def test_the_energy_reward_term_is_off_unless_weighted() -> None:
    state = make_state(throughput=1000.0, power_w=50.0)
    plain = reward(state)
    assert reward(replace(state, power_w=500.0)) == plain  # weight 0: watts do not count
    weighted = RewardWeights(energy=1.0)
    assert reward(state, weighted) == pytest.approx(plain - math.log1p(50.0))
    assert reward(replace(state, power_w=None), weighted) == plain  # nothing measured
    with pytest.raises(ValueError, match=r"RewardWeights\.energy must be >= 0"):
        RewardWeights(energy=-0.1)
