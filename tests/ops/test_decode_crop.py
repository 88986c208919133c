"""DecodeRandomResizedCrop: the same box as decode-then-crop, decoded at a reduced DCT scale and
only over the box's rows and columns."""

from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
import torch

import drapps
from drapps.cache import psnr
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
from drapps.ops.decode_crop import REGION_DECODER, decode_region, reduction

# Real photos come from scikit-image (the bench extra): the integration tier.
pytestmark = pytest.mark.extras
skimage_data = pytest.importorskip("skimage.data")

needs_region = pytest.mark.skipif(REGION_DECODER is None, reason="region decoder not built")


def _photo_jpeg(width: int, height: int) -> bytes:
    """A real photo (scikit-image's astronaut) at ``width`` x ``height``, quality 90."""
    photo = cv2.resize(skimage_data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)
    return simplejpeg.encode_jpeg(np.ascontiguousarray(photo), quality=90, colorspace="RGB")


@pytest.mark.parametrize("region", [True, False])
def test_full_path_is_decode_then_crop_pixel_for_pixel(region: bool) -> None:
    data = _photo_jpeg(1600, 1200)
    full = DecodeRandomResizedCrop(224, reduce=False, region=region)
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


@needs_region
@pytest.mark.parametrize("subsampling", ["444", "422", "420", "411", "440", "gray"])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_a_region_is_the_same_box_of_the_whole_decode_bit_for_bit(
    subsampling: str, denom: int
) -> None:
    photo = cv2.resize(skimage_data.astronaut(), (333, 251), interpolation=cv2.INTER_CUBIC)
    colorspace = "GRAY" if subsampling == "gray" else "RGB"
    if subsampling == "gray":
        photo = np.ascontiguousarray(cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)[..., None])
        data = simplejpeg.encode_jpeg(photo, quality=90, colorspace=colorspace)
    else:
        data = simplejpeg.encode_jpeg(
            photo, quality=90, colorspace=colorspace, colorsubsampling=subsampling
        )
    whole = simplejpeg.decode_jpeg(
        data, colorspace="RGB", min_height=-(-251 // denom), min_width=-(-333 // denom)
    )
    rows, cols = whole.shape[:2]
    rng = np.random.default_rng(denom)
    # Boxes touching each edge, on and off the iMCU grid, one pixel wide, and the whole image.
    boxes = [(0, 0, rows, cols), (0, 0, 1, 1), (rows - 1, cols - 1, 1, 1), (0, 16, rows, 16)]
    for _ in range(40):
        h, w = int(rng.integers(1, rows + 1)), int(rng.integers(1, cols + 1))
        boxes.append((int(rng.integers(0, rows - h + 1)), int(rng.integers(0, cols - w + 1)), h, w))
    for top, left, h, w in boxes:
        region = decode_region(data, top, left, h, w, denom)
        assert region.shape == (h, w, 3), (top, left, h, w)
        np.testing.assert_array_equal(region, whole[top : top + h, left : left + w])


@needs_region
def test_progressive_jpegs_are_region_decoded_exactly() -> None:
    photo = cv2.resize(skimage_data.astronaut(), (640, 480))
    ok, encoded = cv2.imencode(".jpg", photo, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    data = encoded.tobytes()
    whole = simplejpeg.decode_jpeg(data, colorspace="RGB")
    np.testing.assert_array_equal(decode_region(data, 100, 203, 250, 301), whole[100:350, 203:504])


@needs_region
def test_the_op_takes_the_region_path_and_its_batches_do_not_change() -> None:
    for width, height in ((500, 400), (1600, 1200)):
        data = _photo_jpeg(width, height)
        region, whole = DecodeRandomResizedCrop(224), DecodeRandomResizedCrop(224, region=False)
        for seed in range(20):
            a = region.apply(data, np.random.default_rng(seed))
            b = whole.apply(data, np.random.default_rng(seed))
            np.testing.assert_array_equal(a, b)
            assert region.last_path == "region"
            assert whole.last_path == ("reduced" if whole.last_reduction > 1 else "full")
            assert region.last_reduction == whole.last_reduction
    # reduce=False with a region is still the full path's pixels.
    data = _photo_jpeg(1600, 1200)
    full = DecodeRandomResizedCrop(224, reduce=False)
    reference = DecodeRandomResizedCrop(224, reduce=False, region=False)
    for seed in range(5):
        np.testing.assert_array_equal(
            full.apply(data, np.random.default_rng(seed)),
            reference.apply(data, np.random.default_rng(seed)),
        )


@needs_region
def test_region_decode_names_bad_input() -> None:
    data = _photo_jpeg(64, 48)
    with pytest.raises(ValueError, match="outside the 48x64 image"):
        decode_region(data, 40, 0, 9, 8)
    with pytest.raises(ValueError, match="outside"):
        decode_region(data, 0, -1, 8, 8)
    with pytest.raises(ValueError, match="denom must be 1, 2, 4 or 8"):
        decode_region(data, 0, 0, 8, 8, 3)
    with pytest.raises(ValueError, match="not a JPEG"):
        decode_region(b"\xff\xd8 truncated", 0, 0, 8, 8)
    with pytest.raises(ValueError, match="not a JPEG"):
        decode_region(data[: len(data) // 2] + b"\x00" * 4, 0, 0, 48, 64)  # truncated: no crash


def test_without_the_compiled_decoder_the_op_decodes_the_whole_photo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from drapps.ops import decode_crop

    monkeypatch.setattr(decode_crop, "_jpeg_region", None)
    op = DecodeRandomResizedCrop(224)
    out = op.apply(_photo_jpeg(1600, 1200), np.random.default_rng(0))
    assert out.shape == (224, 224, 3) and op.last_path in ("full", "reduced")
    with pytest.raises(RuntimeError, match="libjpeg62-turbo-dev"):
        decode_crop.decode_region(b"", 0, 0, 1, 1)


def test_reduction_picks_the_largest_scale_that_still_covers_the_output() -> None:
    assert reduction(1792, 1800, 224) == 8
    assert reduction(1791, 1800, 224) == 4
    assert reduction(448, 448, 224) == 2
    assert reduction(447, 2000, 224) == 1


def test_bad_arguments_and_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="reduce must be True or False"):
        DecodeRandomResizedCrop(224, reduce="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="region must be True or False"):
        DecodeRandomResizedCrop(224, region=1)  # type: ignore[arg-type]
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
