from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from helpers import assert_batches_equal

import drapps
from drapps.datasets import ImageFolder


def write_tree(root: Path, per_class: int = 3) -> None:
    rng = np.random.default_rng(0)
    for name in ("cat", "ant"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
            (root / name / f"{i}.jpg").write_bytes(simplejpeg.encode_jpeg(image, quality=90))
    (root / "ant" / "notes.txt").write_text("not an image")


def test_reads_the_imagefolder_layout(tmp_path: Path) -> None:
    write_tree(tmp_path)
    data = ImageFolder(tmp_path)
    assert data.classes == ["ant", "cat"] and len(data) == 6
    image, target = data[4]
    assert image.shape == (40, 50, 3) and image.dtype == np.uint8 and target == 1
    assert data.samples[0] == (str(tmp_path / "ant" / "0.jpg"), 0)


def test_a_corrupt_jpeg_is_named_by_path_in_the_training_loop(tmp_path: Path) -> None:
    write_tree(tmp_path)
    bad = tmp_path / "cat" / "1.jpg"
    bad.write_bytes(b"\xff\xd8 truncated")
    with drapps.Loader(ImageFolder(tmp_path), batch_size=2, workers=2) as loader:
        with pytest.raises(drapps.SampleError, match=f"sample 4 \\({bad}\\) failed in __getitem__"):
            list(loader)


def test_bad_roots_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="root must be a directory of class folders"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match=r"found no \.jpg/\.jpeg files"):
        ImageFolder(tmp_path)


class CountingRead:
    """A file read that counts the reads of each path (in this process)."""

    def __init__(self) -> None:
        self.reads: dict[str, int] = {}

    def __call__(self, path: str) -> bytes:
        self.reads[path] = self.reads.get(path, 0) + 1
        with open(path, "rb") as file:
            return file.read()


def test_read_ahead_reads_each_file_once_and_gives_the_same_samples(tmp_path: Path) -> None:
    write_tree(tmp_path)
    read = CountingRead()
    data = ImageFolder(tmp_path, read=read)
    try:
        data.read_ahead([3, 4, 5])
        got = [data[i] for i in (3, 4, 5)]
    finally:
        data.close()
    plain = ImageFolder(tmp_path, read_threads=0)
    for (image, target), i in zip(got, (3, 4, 5), strict=True):
        assert np.array_equal(image, plain[i][0]) and target == plain[i][1]
    assert sorted(read.reads.values()) == [1, 1, 1]


def noisy(image: np.ndarray) -> torch.Tensor:
    """A random transform: the per-sample seed decides the noise."""
    return torch.as_tensor(image) + torch.randint(0, 9, (1,), dtype=torch.uint8)


def test_workers_reading_ahead_make_the_batches_of_workers_that_do_not(tmp_path: Path) -> None:
    write_tree(tmp_path, per_class=8)

    def epoch(read_threads: int) -> list[Any]:
        data = ImageFolder(tmp_path, transform=noisy, read_threads=read_threads)
        with drapps.Loader(data, batch_size=4, shuffle=True, seed=5, workers=2) as loader:
            return list(loader)

    assert_batches_equal(epoch(4), epoch(0))


def test_bad_read_threads_are_named(tmp_path: Path) -> None:
    write_tree(tmp_path)
    with pytest.raises(ValueError, match="read_threads must be an int >= 0, got -1"):
        ImageFolder(tmp_path, read_threads=-1)
