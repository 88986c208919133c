"""Run by ``torchrun`` from tests/test_distributed.py: each rank records what it read.

Usage: ``torchrun ... ranks.py OUT_DIR MODE`` with MODE ``shard``, ``sampler`` or ``cores``.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import drapps
from drapps.runtime.cores import CoreBudget


class Indexed:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Busy(Indexed):
    """About 3 ms of CPU per sample: a loader-bound job that wants every core."""

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.process_time() + 0.003
        while time.process_time() < end:
            pass
        return torch.tensor(i)


def flat(batches: Any) -> list[int]:
    return [int(i) for batch in batches for i in batch]


def shard() -> dict[str, Any]:
    kwargs: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 3, "workers": "auto"}
    with drapps.Loader(Indexed(40), **kwargs) as loader:
        record: dict[str, Any] = {"len": len(loader)}
        record["epochs"] = [flat(loader), flat(loader)]
        iterator = iter(loader)  # epoch 2, checkpointed after two batches
        head = flat([next(iterator), next(iterator)])
        state = loader.state_dict()
    with drapps.Loader(Indexed(40), **kwargs) as resumed:
        resumed.load_state_dict(state)
        record["resumed"] = head + flat(resumed)
    with drapps.Loader(Indexed(40), batch_size=4, workers=2) as loader:  # seed from torch's RNG
        record["torch_seeded"] = flat(loader)
    return record


def sampler() -> dict[str, Any]:
    data = Indexed(42)
    dist_sampler = DistributedSampler(data, shuffle=True, seed=1)
    record: dict[str, Any] = {"epochs": [], "reference": []}
    with drapps.Loader(data, batch_size=4, sampler=dist_sampler, workers=2) as loader:
        for epoch in range(2):
            dist_sampler.set_epoch(epoch)
            record["epochs"].append(flat(loader))
    for epoch in range(2):
        dist_sampler.set_epoch(epoch)
        record["reference"].append(flat(DataLoader(data, batch_size=4, sampler=dist_sampler)))
    return record


def cores() -> dict[str, Any]:
    kwargs: dict[str, Any] = {"batch_size": 2, "workers": "auto", "control_interval": 0.1}
    with drapps.Loader(Busy(100_000), **kwargs) as loader:
        iterator = iter(loader)
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            next(iterator)
        dist.barrier()  # every rank is running its loader now
        time.sleep(1.0)  # a few controller ticks
        workers = loader.num_workers
        claims = CoreBudget(1).claims()
        dist.barrier()
    return {"workers": workers, "claims": claims}


def main() -> None:
    # A hang shows its stacks in the test's failure (the test kills the ranks at 240 s).
    faulthandler.dump_traceback_later(200, exit=True)
    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(100 + dist.get_rank())  # ranks' own RNGs differ, as in real jobs
    record = {"shard": shard, "sampler": sampler, "cores": cores}[mode]()
    record["rank"], record["world"] = dist.get_rank(), dist.get_world_size()
    with open(f"{out}/rank{dist.get_rank()}.json", "w") as file:
        json.dump(record, file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
