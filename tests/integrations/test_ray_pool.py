"""The Ray backend on a real two-node Ray cluster, inside a loopback-only network namespace.

The cluster scenarios run in a child process in the namespace (``_ray_cluster.py``); each
module-level fixture runs one scenario once and the tests read what it found.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from _netns import loopback_namespace, run_scenario

import drapps
from drapps.engines.backends import ProcessBackend, RayBackend, resolve_backend
from drapps.runtime.transport import pack_buffer, unpack

pytestmark = pytest.mark.integration  # starts real engines or interpreters

ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'drapps-loader[ray]'")


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    with loopback_namespace() as name:
        yield name


@pytest.fixture(scope="module")
def semantics(namespace: str) -> dict[str, Any]:
    return run_scenario(namespace, "_ray_cluster.py", "semantics")


@pytest.fixture(scope="module")
def faults(namespace: str) -> dict[str, Any]:
    return run_scenario(namespace, "_ray_cluster.py", "faults")


@pytest.mark.timeout(300)
def test_batches_are_those_of_worker_processes(semantics: dict[str, Any]) -> None:
    assert semantics["identical"]
    # "auto" starts with every CPU of the two nodes (2 + 1), and is bounded by them.
    assert semantics["max_workers"] == 3
    assert semantics["workers"] == 3
    # The controller's State sees the cluster's CPUs (3), all held by the 3 actors.
    assert semantics["pool_cores"] == [3.0, 0.0]


def test_the_ray_pool_passes_the_engine_conformance_check(semantics: dict[str, Any]) -> None:
    assert semantics["conformance"] == "passed"


def test_ready_batches_stay_within_the_memory_budget(semantics: dict[str, Any]) -> None:
    assert semantics["budget_ok"]
    assert semantics["budget_batches"] == 12


def test_a_failing_sample_is_named(semantics: dict[str, Any]) -> None:
    assert semantics["error"] == "sample 13 failed in __getitem__: ValueError: sample 13 is broken"


def test_no_actor_is_left_after_close_or_garbage_collection(semantics: dict[str, Any]) -> None:
    assert semantics["gc_actors_left"] == 0
    assert (semantics["actors_left"], semantics["processes_left"]) == (0, 0)


@pytest.mark.timeout(300)
def test_a_killed_actor_loses_and_repeats_nothing(faults: dict[str, Any]) -> None:
    assert faults["actor_killed_identical"]
    assert faults["actor_killed_restarts"] >= 1


def test_a_lost_node_loses_and_repeats_nothing(faults: dict[str, Any]) -> None:
    # Its actors' batches are made again elsewhere; the replacement that the cluster has no
    # CPU for any more is given up rather than waited for.
    assert faults["actors_before"] == 3
    assert faults["node_killed_identical"] and faults["exactly_once"]
    assert faults["node_killed_restarts"] >= 1
    assert faults["actors_left"] == 0


def test_batches_cross_as_one_uint8_array_and_come_back_writable() -> None:
    batch = {"x": torch.arange(12, dtype=torch.int16).view(3, 4), "y": np.ones(5), "n": 3}
    packed = pack_buffer(batch)
    assert packed.fd is None and all(part.dtype == np.uint8 for _, part in packed.buffer)
    for _, part in packed.buffer:
        part.setflags(write=False)  # as Ray's object store hands them over
    back = unpack(packed)
    assert torch.equal(back["x"], batch["x"]) and np.array_equal(back["y"], batch["y"])
    back["x"] += 1  # the user's to modify, as DataLoader's batches are
    assert back["n"] == 3


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def test_backend_arguments_are_checked() -> None:
    assert isinstance(resolve_backend("process"), ProcessBackend)
    assert resolve_backend("ray") == RayBackend()
    with pytest.raises(
        ValueError, match=r"backend must be one of \['process', 'ray', 'thread'\] or a drapps"
    ):
        resolve_backend("dask")
    with pytest.raises(ValueError, match="cpus_per_worker must be > 0, got 0"):
        RayBackend(cpus_per_worker=0)
    data = [torch.zeros(2)] * 4
    with pytest.raises(ValueError, match="backend='ray' needs workers >= 1"):
        drapps.Loader(data, workers=0, backend="ray")
    with pytest.raises(ValueError, match="out of reach of this machine's shared-memory cache"):
        drapps.Loader(data, workers=1, backend="ray", cache=drapps.Cache())
    with pytest.raises(ValueError, match="needs a map-style dataset"):
        drapps.Loader(Stream(), workers=1, backend="ray")
