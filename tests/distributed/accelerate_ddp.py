"""Hugging Face Accelerate with 2 CPU processes and a prepared drapps.Loader
(tests/test_distributed.py). Usage: ``accelerate launch ... accelerate_ddp.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys

import torch
from accelerate import Accelerator

import drapps


class Indexed:
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((4,), float(i)), i


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = drapps.Loader(Indexed(), batch_size=6, shuffle=True, num_workers=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen: list[int] = []
    for x, index in loader:
        seen.extend(int(i) for i in index)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    rank = accelerator.process_index
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as file:
        json.dump({"rank": rank, "world": accelerator.num_processes, "seen": seen}, file)
    accelerator.wait_for_everyone()
    loader.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
