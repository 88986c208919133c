"""The device stage on CUDA (skipped without it; run on a GPU machine with ``pytest tests/gpu``).

Crop, flip and dtype changes are exact on any device; the antialiased resize runs in float32
on the GPU, so it may differ from the CPU's uint8 kernel by up to 2 intensity levels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import drapps
from drapps.ops import (
    ColorJitter,
    DecodeJPEG,
    Normalize,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Photos:
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(index)
        size = (120 + 7 * (index % 5), 100 + 5 * (index % 4), 3)
        return rng.integers(0, 256, size, dtype=np.uint8), index


def run(split: int, device: str | None, ops: list[Any], workers: int = 2) -> list[Any]:
    pipeline = Pipeline(ops, key=0, takes=Spec("array", "uint8", "HWC"))
    with drapps.Loader(
        Photos(), batch_size=6, seed=4, workers=workers, transform=pipeline, split=split,
        device=device,
    ) as loader:  # fmt: skip
        return [[t.cpu() for t in batch] for batch in loader]


def test_exact_ops_on_the_gpu_equal_the_workers_bit_for_bit() -> None:
    ops = [ToCHWTensor(), RandomResizedCrop(32), RandomHorizontalFlip(), ColorJitter(0.3, 0.3)]
    reference = run(4, None, ops)
    on_gpu = run(2, "cuda", ops)  # crop in the workers; flip and jitter on the GPU
    for a, b in zip(reference, on_gpu, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_resize_on_the_gpu_is_within_two_levels() -> None:
    ops = [ToCHWTensor(), RandomResizedCrop(32), RandomHorizontalFlip()]
    reference = run(3, None, ops)
    on_gpu = run(1, "cuda", ops)  # the crop and its resize on the GPU
    for a, b in zip(reference, on_gpu, strict=True):
        diff = (a[0].int() - b[0].int()).abs()
        assert int(diff.max()) <= 2 and float(diff.float().mean()) < 0.5


def test_batches_arrive_on_the_gpu_ready_for_the_loops_stream() -> None:
    ops = [ToCHWTensor(), RandomResizedCrop(32), Normalize([0.5] * 3, [0.25] * 3)]
    pipeline = Pipeline(ops, key=0, takes=Spec("array", "uint8", "HWC"), split=2)
    side = torch.cuda.Stream()
    with drapps.Loader(Photos(), batch_size=6, seed=0, workers=2, transform=pipeline,
                       device="cuda") as loader, torch.cuda.stream(side):  # fmt: skip
        for images, labels in loader:
            assert images.device.type == "cuda" and labels.device.type == "cuda"
            assert images.dtype == torch.float32 and torch.isfinite(images.sum())
        stats = loader.stats()
    assert stats.device_batches == 4 and stats.device_s > 0


def test_nvjpeg_decodes_in_the_device_stage() -> None:
    pytest.importorskip("torchvision")
    simplejpeg = pytest.importorskip("simplejpeg")
    jpegs = [
        (simplejpeg.encode_jpeg(np.ascontiguousarray(Photos()[i][0]), quality=95), i)
        for i in range(12)
    ]
    ops = [DecodeJPEG(), ToCHWTensor(), RandomResizedCrop(32), RandomHorizontalFlip()]

    def decode(split: int, device: str | None) -> list[Any]:
        pipeline = Pipeline(ops, key=0, takes=Spec("bytes"))
        with drapps.Loader(jpegs, batch_size=4, seed=1, workers=0, transform=pipeline,
                           split=split, device=device) as loader:  # fmt: skip
            return [batch[0].cpu() for batch in loader]

    for cpu, gpu in zip(decode(4, None), decode(0, "cuda"), strict=True):
        diff = (cpu.int() - gpu.int()).abs().float()
        assert float(diff.mean()) < 3.0  # nvJPEG's IDCT differs slightly from libjpeg-turbo's
