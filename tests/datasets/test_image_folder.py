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
    with pytest.raises(FileNotFoundError, match="root must be a directory of class folders"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError, match="root must be a directory of class folders"):
        ImageFolder(tmp_path / "a-file")
    with pytest.raises(FileNotFoundError, match="found no class folder in"):
        ImageFolder(tmp_path)
    write_tree(tmp_path / "tree")
    (tmp_path / "tree" / "bee").mkdir()
    (tmp_path / "tree" / "bee" / "b.png").write_bytes(b"")
    (tmp_path / "tree" / "dog").mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"found no \.jpg/\.jpeg file in the class folder\(s\) bee, dog "
    ):
        ImageFolder(tmp_path / "tree")
    kept = ImageFolder(tmp_path / "tree", allow_empty=True)
    assert kept.classes == ["ant", "bee", "cat", "dog"] and set(kept.targets) == {0, 2}
    for wrong in ("", [], [".jpg", 3], 7):
        with pytest.raises(ValueError, match="extensions must be a file name ending"):
            ImageFolder(tmp_path / "tree", extensions=wrong)  # type: ignore[arg-type]


def test_images_in_sub_folders_count_as_torchvisions_imagefolder_counts_them(
    tmp_path: Path,
) -> None:
    """torchvision's ImageFolder takes each class folder's images at any depth, through links
    to folders, sorted by folder then name; ``class_to_idx``, ``targets`` and ``imgs`` are
    read by samplers that balance classes. A link back to a folder the walk is in is not
    followed again."""
    write_tree(tmp_path / "tree")
    cat = tmp_path / "tree" / "cat"
    (cat / "b" / "deeper").mkdir(parents=True)
    jpeg = (cat / "0.jpg").read_bytes()
    (cat / "b" / "x.JPEG").write_bytes(jpeg)
    (cat / "b" / "deeper" / "y.jpg").write_bytes(jpeg)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "z.jpg").write_bytes(jpeg)
    (cat / "a-link").symlink_to(tmp_path / "outside")
    (cat / "b" / "deeper" / "loop").symlink_to(cat)
    data = ImageFolder(tmp_path / "tree")
    names = [str(Path(path).relative_to(tmp_path / "tree")) for path, _ in data.samples]
    assert names == [
        "ant/0.jpg", "ant/1.jpg", "ant/2.jpg",
        "cat/0.jpg", "cat/1.jpg", "cat/2.jpg",
        "cat/a-link/z.jpg", "cat/b/x.JPEG", "cat/b/deeper/y.jpg",
    ]  # fmt: skip
    assert data.class_to_idx == {"ant": 0, "cat": 1} and data.imgs is data.samples
    assert data.targets == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    image, target = data[8]
    assert image.shape == (40, 50, 3) and target == 1


def test_other_extensions_are_read_with_a_decode_that_reads_them(tmp_path: Path) -> None:
    write_tree(tmp_path)
    for name in ("ant", "cat"):
        (tmp_path / name / "raw.npy").write_bytes(b"")
    data = ImageFolder(tmp_path, decode=len, extensions=".NPY")
    assert [Path(p).name for p, _ in data.samples] == ["raw.npy", "raw.npy"]
    assert data[1] == (0, 1)
    chosen = ImageFolder(tmp_path, decode=len, is_valid_file=lambda path: path.endswith("1.jpg"))
    assert [Path(p).name for p, _ in chosen.samples] == ["1.jpg", "1.jpg"]
    with pytest.raises(FileNotFoundError, match="found no valid file in the class folder"):
        ImageFolder(tmp_path, is_valid_file=lambda path: "ant" in path)
    with pytest.raises(ValueError, match="give extensions or is_valid_file, not both"):
        ImageFolder(tmp_path, extensions=".jpg", is_valid_file=bool)
    with pytest.raises(TypeError, match="is_valid_file must be a callable"):
        ImageFolder(tmp_path, is_valid_file=".jpg")  # type: ignore[arg-type]


def test_a_target_transform_is_applied_to_each_target_and_keeps_samples_uncached(
    tmp_path: Path,
) -> None:
    write_tree(tmp_path)
    data = ImageFolder(tmp_path, target_transform=lambda target: target * 10)
    assert [data[i][1] for i in range(len(data))] == [0, 0, 0, 10, 10, 10]
    assert data.targets == [0, 0, 0, 1, 1, 1]  # as torchvision's: before the transform
    assert data.cache_fingerprint() is None and ImageFolder(tmp_path).cache_fingerprint()


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
