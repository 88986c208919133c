"""pin_memory=True on a machine with CUDA: batches arrive page-locked (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import drapps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Pairs:
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return torch.full((3, 8, 8), i, dtype=torch.uint8), {"label": torch.tensor(i)}


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_arrive_pinned_and_equal_to_dataloaders(workers: int) -> None:
    expected = list(DataLoader(Pairs(), batch_size=4, pin_memory=True))
    with drapps.Loader(Pairs(), batch_size=4, pin_memory=True, workers=workers) as loader:
        batches = list(loader)
    for (image, meta), (ref_image, ref_meta) in zip(batches, expected, strict=True):
        assert image.is_pinned() and meta["label"].is_pinned()
        assert torch.equal(image, ref_image) and torch.equal(meta["label"], ref_meta["label"])
        image.cuda(non_blocking=True)
