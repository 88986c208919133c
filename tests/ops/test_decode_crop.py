"""DecodeRandomResizedCrop: the same box as decode-then-crop, decoded at a reduced DCT scale."""

from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from skimage import data as skimage_data

import drapps
from drapps.datasets import ImageFolder
from drapps.ops import (
    Compose,
    DecodeJPEG,
    DecodeRandomResizedCrop,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)
from drapps.ops.decode_crop import psnr, reduction


def _photo_jpeg(width: int, height: int) -> bytes:
    """A real photo (scikit-image's astronaut) at ``width`` x ``height``, quality 90."""
    photo = cv2.resize(skimage_data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)
    return simplejpeg.encode_jpeg(np.ascontiguousarray(photo), quality=90, colorspace="RGB")


def test_full_path_is_decode_then_crop_pixel_for_pixel() -> None:
    data = _photo_jpeg(1600, 1200)
    full = DecodeRandomResizedCrop(224, reduce=False)
    for seed in range(10):
        fused = full.apply(data, np.random.default_rng(seed))
        decoded = DecodeJPEG()(data)
        reference = RandomResizedCrop(224)._crop(decoded, np.random.default_rng(seed))
        np.testing.assert_array_equal(fused, reference)
        assert full.last_reduction == 1


def test_reduced_decode_keeps_the_box_and_stays_close_to_the_full_path() -> None:
    data = _photo_jpeg(1600, 1200)
    fused, full = DecodeRandomResizedCrop(224), DecodeRandomResizedCrop(224, reduce=False)
    reductions, scores = [], []
    for seed in range(40):
        a = fused.apply(data, np.random.default_rng(seed))
        b = full.apply(data, np.random.default_rng(seed))
        assert a.shape == b.shape == (224, 224, 3) and a.dtype == np.uint8
        reductions.append(fused.last_reduction)
        if fused.last_reduction > 1:
            scores.append(psnr(a, b))
    assert {2, 4} <= set(reductions)  # large crops decode at 1/2 and 1/4 scale
    # Same box: another crop of this photo scores under 14 dB against the full path.
    assert min(scores) > 25 and np.median(scores) > 28


def test_a_crop_smaller_than_twice_the_output_decodes_at_full_size() -> None:
    data = _photo_jpeg(500, 400)  # the image workload's size: no 224 crop is 448 rows tall
    fused, full = DecodeRandomResizedCrop(224), DecodeRandomResizedCrop(224, reduce=False)
    for seed in range(20):
        np.testing.assert_array_equal(
            fused.apply(data, np.random.default_rng(seed)),
            full.apply(data, np.random.default_rng(seed)),
        )
        assert fused.last_reduction == 1


def test_reduction_picks_the_largest_scale_that_still_covers_the_output() -> None:
    assert reduction(1792, 1800, 224) == 8
    assert reduction(1791, 1800, 224) == 4
    assert reduction(448, 448, 224) == 2
    assert reduction(447, 2000, 224) == 1


def test_bad_arguments_and_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="reduce must be True or False"):
        DecodeRandomResizedCrop(224, reduce="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size must be an int"):
        DecodeRandomResizedCrop(0)
    with pytest.raises(ValueError, match="not a JPEG"):
        DecodeRandomResizedCrop(8).apply(b"\x89PNG not a jpeg", np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"op 1 of the pipeline.*DecodeRandomResizedCrop.*bytes"):
        Pipeline([DecodeJPEG(), DecodeRandomResizedCrop(8)], takes=Spec("bytes"))


def _folder(root: Path) -> Path:
    for i in range(12):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i}.jpg").write_bytes(_photo_jpeg(960 + 16 * i, 720))
    return root


def test_loader_batches_are_the_same_for_every_worker_count(tmp_path: Path) -> None:
    transform = Compose([DecodeRandomResizedCrop(64), RandomHorizontalFlip(), ToCHWTensor()])
    dataset = ImageFolder(_folder(tmp_path), transform=transform, decode=bytes)

    def epoch(workers: int) -> list[torch.Tensor]:
        with drapps.Loader(dataset, batch_size=4, shuffle=True, seed=3, workers=workers) as dl:
            return [x for x, _ in dl]

    alone, pooled = epoch(0), epoch(2)
    assert len(alone) == 3 and alone[0].shape == (4, 3, 64, 64)
    for a, b in zip(alone, pooled, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
