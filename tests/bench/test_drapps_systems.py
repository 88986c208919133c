"""The bench's drapps systems say which executor a run ended on."""

from __future__ import annotations

import torch

import drapps
from drapps.bench.systems.drapps_loader import ends_on


class Squares(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        return index * index


def test_a_run_that_ends_on_threads_says_so_and_one_on_processes_gives_the_count() -> None:
    for backend, expected in (("thread", "2 threads"), ("process", 2)):
        # Persistent, as the bench's loaders are: workers that are not kept exit when the
        # epoch ends, and a count read after that may see them gone.
        loader = drapps.Loader(
            Squares(), batch_size=4, num_workers=2, backend=backend, persistent_workers=True
        )
        try:
            assert sum(len(batch) for batch in loader) == 16
            assert ends_on(loader) == expected
        finally:
            loader.close()
