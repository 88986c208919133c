"""The peer loaders in the bench deliver the image workload's batches (never a speed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from drapps.bench import BenchConfig, run_benchmark
from drapps.bench.systems import SYSTEMS
from drapps.bench.systems.peers import PEER_SYSTEMS
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import workload_class
from drapps.runtime.config import usable_cores

pytestmark = pytest.mark.integration  # starts real engines or interpreters

PEERS = {system.name: system for system in PEER_SYSTEMS}
VARIANT = {"dali-cpu": 2, "spdl": 2, "torchdata-nodes": "threads-2", "ffcv": 2}


def _skip_unless_available(name: str) -> None:
    reason = PEERS[name].unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> object:
    cls = workload_class("image")
    return cls(cls.prepare(tmp_path_factory.mktemp("data"), "smoke", seed=0))


@pytest.mark.parametrize("name", sorted(PEERS))
@pytest.mark.parametrize("slow_disk", [False, True])
def test_each_peer_delivers_augmented_uint8_chw_batches(
    name: str, slow_disk: bool, image: object
) -> None:
    _skip_unless_available(name)
    if slow_disk and name == "torchdata-nodes":
        pytest.skip("torchdata-nodes reads through the workload's dataset, tested above")
    labels = set(image.files()[1])  # type: ignore[attr-defined]
    throttle = IoThrottle(mb_per_s=500.0, latency_ms=0.1) if slow_disk else None
    source = PEERS[name]().open(image, VARIANT[name], 8, 0, throttle)  # type: ignore[arg-type]
    try:
        batches = [next(iter(source)) for _ in range(8)]  # past one epoch of 48 images
    finally:
        source.close()
        if throttle is not None:
            throttle.close()
    for x, y in batches:
        assert x.shape == (8, 3, 224, 224) and x.dtype == torch.uint8
        assert y.shape == (8,) and y.dtype == torch.int64 and set(y.tolist()) <= labels
        assert x.float().std() > 10  # photo content, not blank frames
    # Random crops: the same file twice gives different pixels, so no two batches are equal.
    assert not torch.equal(batches[0][0], batches[6][0])


@pytest.mark.parametrize("name", ["dali-cpu", "spdl", "ffcv"])
def test_image_only_peers_name_the_workload_they_refuse(name: str, tmp_path: Path) -> None:
    _skip_unless_available(name)
    cls = workload_class("synthetic")
    synthetic = cls(cls.prepare(tmp_path, "smoke", seed=0))
    with pytest.raises(ValueError, match=f"{name} runs the image workload only, got 'synthetic'"):
        PEERS[name]().open(synthetic, 2, 8, 0, None)


def test_bad_variants_are_named(image: object) -> None:
    for name, bad, message in [
        ("dali-cpu", 0, "dali-cpu needs a thread count >= 1, got 0"),
        ("spdl", "x", "spdl needs a concurrency >= 1, got 'x'"),
        ("torchdata-nodes", "forks-2", "torchdata-nodes needs 'threads-N' or 'processes-N'"),
        ("ffcv", -1, "ffcv needs a thread count >= 1, got -1"),
    ]:
        if PEERS[name].unavailable() is None:
            with pytest.raises(ValueError, match=message):
                PEERS[name]().open(image, bad, 8, 0, None)  # type: ignore[arg-type]


def test_peers_are_registered_and_listed_with_their_variants() -> None:
    assert {"dali-cpu", "spdl", "torchdata-nodes"} <= set(SYSTEMS)
    assert PEERS["dali-cpu"].variants(2) == [2, 4]
    names = [PEERS["torchdata-nodes"].case_name(w) for w in PEERS["torchdata-nodes"].variants(2)]
    assert names == [
        "torchdata-nodes-threads-2",
        "torchdata-nodes-threads-4",
        "torchdata-nodes-processes-2",
    ]


@pytest.mark.timeout(300)
def test_a_bench_run_with_the_peers_records_each_case(tmp_path: Path) -> None:
    names = [n for n in PEERS if PEERS[n].unavailable() is None]
    if not names:
        pytest.skip("no peer is installed")
    config = BenchConfig(
        workloads=("image",),
        scenarios=("steady",),
        systems=tuple(names),
        size="smoke",
        repeats=1,
        measure_batches=3,
        data_dir=tmp_path,
    )
    results = run_benchmark(config, progress=False)
    got = {run["case"] for run in results["runs"]}
    want = {PEERS[n].case_name(w) for n in names for w in PEERS[n].variants(usable_cores())}
    assert got == want
    for run in results["runs"]:
        assert run["shape_mismatch"] is None and run["samples"] == run["expected_samples"]
    assert np.isfinite(results["limit"]["image"]["samples_per_s"])
