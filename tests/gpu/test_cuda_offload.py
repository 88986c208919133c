"""The offload share on CUDA (skipped without it; ``make gpu-check-tests`` on a GPU machine).

A share of each batch is decoded by nvJPEG in the device stage, the rest by libjpeg-turbo in the
workers: the batches hold the same samples with the same crops and flips, and the GPU-decoded
images differ from the CPU's within the tolerance printed here (max and mean absolute
difference, PSNR). The stage shrinks under memory pressure; the cuda-model consumer trains.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import drapps
from drapps.ops import (
    DecodeJPEG,
    DeviceStage,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
simplejpeg = pytest.importorskip("simplejpeg")


class Jpegs:
    """Smooth photos (gradients and a little noise), baseline JPEG at quality 90."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        rng = np.random.default_rng(index)
        h, w = 160 + 8 * (index % 5), 200 + 8 * (index % 3)
        y, x = np.mgrid[0:h, 0:w]
        image = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)], axis=-1)
        image = np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)
        return simplejpeg.encode_jpeg(image, quality=90), index


def pipeline() -> Pipeline:
    ops = [DecodeJPEG(), ToCHWTensor(), RandomResizedCrop(64), RandomHorizontalFlip()]
    return Pipeline(ops, key=0, takes=Spec("bytes"))


def epoch(**options: Any) -> list[Any]:
    with drapps.Loader(
        Jpegs(), batch_size=8, shuffle=True, seed=1, transform=pipeline(), **options
    ) as loader:
        return [[t.cpu() for t in batch] for batch in loader]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_offloaded_batches_hold_the_same_samples_within_the_stated_tolerance(share: float) -> None:
    reference = epoch(workers=2)  # every sample decoded by libjpeg-turbo in the workers
    offloaded = epoch(workers=2, split=0, offload=share, device="cuda")
    worst, means, quality = 0, [], []
    for ref, got in zip(reference, offloaded, strict=True):
        assert torch.equal(ref[1], got[1])  # the same samples, in the same order
        assert ref[0].shape == got[0].shape and got[0].dtype == torch.uint8
        diff = (ref[0].int() - got[0].int()).abs()
        worst = max(worst, int(diff.max()))
        means.append(float(diff.float().mean()))
        quality.append(psnr(ref[0], got[0]))
    print(
        f"offload {share:.0%} on {torch.cuda.get_device_name(0)}: max abs {worst}, mean abs "
        f"{np.mean(means):.2f}, PSNR {np.median(quality):.1f} dB (median over batches)"
    )
    assert np.mean(means) < 3 and np.median(quality) > 35


def test_the_stage_runs_pieces_on_a_gpu_short_of_memory() -> None:
    ops = pipeline()
    images = [Jpegs()[i][0] for i in range(8)]
    seeds = list(range(8))
    whole = DeviceStage(ops, "cuda").run((images, torch.arange(8)), seeds, 0)
    squeezed = DeviceStage(ops, "cuda", memory=lambda: (0, 80 * 2**30))
    pieces = squeezed.run((images, torch.arange(8)), seeds, 0)
    assert squeezed.piece == 4 and squeezed.squeezed == 1
    assert torch.equal(whole[0], pieces[0])


def test_the_cuda_model_consumer_trains_resnet50() -> None:
    from drapps.bench.models import DeviceStep, resnet50

    step = DeviceStep(lambda: resnet50(classes=10), "cuda")
    x = torch.randint(0, 256, (16, 3, 128, 128), dtype=torch.uint8)
    before = [p.detach().clone() for p in step.model.parameters()]
    step(x, torch.randint(0, 10, (16,)))
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))
