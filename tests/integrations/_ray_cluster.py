"""Ray scenarios, run inside a loopback-only network namespace by ``test_ray_pool.py``.

Each starts a real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
node and a second node, separate raylet processes), runs loaders on it and prints what it found
as one JSON line.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time

import psutil
import ray
import torch
from conformance import check_engine
from helpers import RandomDataset
from ray.cluster_utils import Cluster

import drapps


class SlowDataset(RandomDataset):
    """Samples that take a while, so a kill lands mid-epoch."""

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        time.sleep(0.01)
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return super().__getitem__(i)

    bad = -1


def batches(loader: drapps.Loader) -> list[dict]:
    return [dict(b) for b in loader]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def alive_actors() -> int:
    actors = ray._private.state.actors()  # GCS' table; the state API needs the dashboard
    return sum(1 for a in actors.values() if a["State"] != "DEAD")


def actor_processes() -> int:
    return sum(1 for p in psutil.process_iter(["name"]) if "_BatchMaker" in (p.info["name"] or ""))


def wait_for(check, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def semantics(cluster: Cluster) -> dict:
    found: dict = {}
    t0 = time.monotonic()
    data = RandomDataset(96, (3, 4))
    kwargs = {"batch_size": 8, "shuffle": True, "seed": 7, "cache": None}
    local = drapps.Loader(data, workers=2, **kwargs)
    reference = [batches(local) for _ in range(2)]  # epochs 0 and 1
    # persistent_workers: the actors outlive each epoch, so their count can be read after it.
    ray_options = {"workers": "auto", "backend": "ray", "persistent_workers": True}
    with drapps.Loader(data, **ray_options, **kwargs) as loader:
        found["max_workers"] = loader.config.resolved_max_workers
        got = [batches(loader) for _ in range(2)]
        found["identical"] = all(same(a, b) for a, b in zip(reference, got, strict=False))
        found["workers"] = loader.stats().workers
        found["pool_cores"] = loader.snapshot().pool_cores  # Ray's view, for the State
    found["identical_s"] = time.monotonic() - t0
    found["conformance"] = conformance(data)
    # The memory budget holds through the object store too.
    budget = 3 * 8 * 3 * 4 * 4 + 4096
    with drapps.Loader(data, workers=3, backend="ray", memory_budget=budget, **kwargs) as small:
        it = iter(small)
        time.sleep(2.0)  # workers run ahead until the budget stops them
        found["budget_batches"] = len([dict(b) for b in it])
        found["budget_ok"] = small.stats().peak_ready_bytes <= budget
    # A failing sample is named, as with worker processes.
    bad = SlowDataset(32, (3,))
    bad.bad = 13
    try:
        with drapps.Loader(bad, batch_size=4, workers=2, backend="ray", cache=None) as failing:
            batches(failing)
        found["error"] = None
    except drapps.SampleError as exc:
        found["error"] = str(exc)
    # Dropped mid-epoch without close(): garbage collection stops its actors.
    dropped = drapps.Loader(data, workers=2, backend="ray", **kwargs)
    it = iter(dropped)
    next(it)
    del it, dropped
    gc.collect()
    found["gc_actors_left"] = 0 if wait_for(lambda: alive_actors() == 0) else alive_actors()
    found["all_s"] = time.monotonic() - t0
    wait_for(lambda: alive_actors() == 0 and actor_processes() == 0)
    found["actors_left"], found["processes_left"] = alive_actors(), actor_processes()
    return found


def conformance(data: RandomDataset) -> str:
    """The engine conformance check over the Ray pool, against the inline engine (with a
    seed, each sample's draws are the same whoever makes it)."""
    kwargs = {"batch_size": 8, "shuffle": True, "cache": None, "seed": 3}
    expected = list(drapps.Loader(data, workers=0, **kwargs))

    def make(**overrides: object) -> drapps.Loader:
        return drapps.Loader(data, workers=2, backend="ray", **{**kwargs, **overrides})

    def kill(loader: drapps.Loader) -> None:
        ray.kill(loader._parts.engine.dispatcher.pool.workers[0].actor, no_restart=True)

    try:
        # Actors are not this process' children: the scenario counts them itself.
        check_engine(make, expected, kill=kill, clean=False)
    except AssertionError as exc:
        return f"failed: {exc}"
    return "passed"


def faults(cluster: Cluster, second) -> dict:  # type: ignore[no-untyped-def]
    found: dict = {}
    data = SlowDataset(240, (3,))
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 11, "cache": None}
    reference = batches(drapps.Loader(data, workers=2, **kwargs))
    # One actor killed mid-epoch.
    with drapps.Loader(data, workers=3, backend="ray", **kwargs) as loader:
        got = []
        for n, batch in enumerate(loader):
            got.append(dict(batch))
            if n == 5:
                ray.kill(loader._parts.engine.dispatcher.pool.workers[0].actor, no_restart=True)
        found["actor_killed_identical"] = same(reference, got)
        found["actor_killed_restarts"] = loader.stats().worker_restarts
    # A whole worker node removed mid-epoch (its raylet and every actor on it).
    with drapps.Loader(data, workers=3, backend="ray", **kwargs) as loader:
        got = []
        for n, batch in enumerate(loader):
            got.append(dict(batch))
            if n == 5:
                nodes = {w.actor._actor_id for w in loader._parts.engine.dispatcher.pool.workers}
                found["actors_before"] = len(nodes)
                cluster.remove_node(second)
        found["node_killed_identical"] = same(reference, got)
        found["node_killed_restarts"] = loader.stats().worker_restarts
        indices = sorted(int(i) for b in got for i in b["index"])
        found["exactly_once"] = indices == list(range(len(data)))
    wait_for(lambda: alive_actors() == 0)
    found["actors_left"] = alive_actors()
    return found


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    scenario = sys.argv[1]
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False},
    )
    second = cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, logging_level=logging.ERROR)
        found = semantics(cluster) if scenario == "semantics" else faults(cluster, second)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
