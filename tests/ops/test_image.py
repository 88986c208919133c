import numpy as np
import pytest
import torch

import drapps
from drapps.ops import Compose, RandomHorizontalFlip, RandomResizedCrop, ToCHWTensor
from drapps.runtime.seeding import clear_sample, seed_sample


@pytest.fixture()
def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (400, 500, 3), dtype=np.uint8)


def test_random_resized_crop_shape_and_per_sample_determinism(image: np.ndarray) -> None:
    crop = RandomResizedCrop(224)

    def run(seed: int) -> np.ndarray:
        seed_sample(seed)
        try:
            return crop(image)
        finally:
            clear_sample()

    assert run(1).shape == (224, 224, 3) and run(1).dtype == np.uint8
    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_crop_box_stays_inside_the_image_and_honours_scale() -> None:
    crop = RandomResizedCrop(32, scale=(0.5, 0.5), ratio=(1.0, 1.0))
    rng = np.random.default_rng(0)
    for _ in range(50):
        top, left, h, w = crop.crop_box(100, 200, rng)
        assert top >= 0 and top + h <= 100 and left >= 0 and left + w <= 200
        assert abs(h * w - 100 * 200 * 0.5) / (100 * 200 * 0.5) < 0.02


def test_flip_probability_extremes_and_chw(image: np.ndarray) -> None:
    np.testing.assert_array_equal(RandomHorizontalFlip(1.0)(image), image[:, ::-1])
    np.testing.assert_array_equal(RandomHorizontalFlip(0.0)(image), image)
    tensor = ToCHWTensor()(image[:, ::-1])
    assert tensor.shape == (3, 400, 500) and tensor.is_contiguous() and tensor.dtype == torch.uint8
    assert torch.equal(tensor[:, 0, 0], torch.from_numpy(image[0, -1].copy()))


def test_ops_work_outside_a_loader(image: np.ndarray) -> None:
    pipeline = Compose([RandomResizedCrop(64), RandomHorizontalFlip(), ToCHWTensor()])
    assert pipeline(image).shape == (3, 64, 64)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RandomResizedCrop(0), "size must be an int >= 1, got 0"),
        (lambda: RandomResizedCrop(8, scale=(0.5, 0.1)), "scale must satisfy"),
        (lambda: RandomResizedCrop(8, ratio=(0, 1)), "ratio must satisfy"),
        (lambda: RandomHorizontalFlip(2), r"p must be in \[0, 1\], got 2"),
        (lambda: Compose([1]), "every op must be callable"),
    ],
)
def test_bad_arguments_are_named(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


class Images:
    def __init__(self, image: np.ndarray) -> None:
        self.image = image

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> np.ndarray:
        return self.image


def test_pipeline_in_a_loader_is_deterministic_across_worker_counts(image: np.ndarray) -> None:
    transform = Compose([RandomResizedCrop(48), RandomHorizontalFlip(), ToCHWTensor()])
    outs = []
    for workers in (0, 2):
        with drapps.Loader(
            Images(image), batch_size=4, transform=transform, seed=0, workers=workers
        ) as loader:
            outs.append(torch.cat(list(loader)))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0][0], outs[0][1])  # samples draw different crops


def test_a_missing_image_extra_is_named_when_the_op_or_dataset_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Without simplejpeg the error came at the first batch, from inside a worker."""
    from drapps.datasets import ImageFolder
    from drapps.ops import DecodeJPEG
    from drapps.ops.decode_crop import DecodeRandomResizedCrop

    monkeypatch.setitem(__import__("sys").modules, "simplejpeg", None)  # not importable
    for make in (DecodeJPEG, lambda: DecodeRandomResizedCrop(8), lambda: ImageFolder(tmp_path)):
        with pytest.raises(ImportError, match=r"pip install 'drapps-loader\[image\]'"):
            make()
