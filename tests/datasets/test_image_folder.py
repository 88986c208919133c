from pathlib import Path

import numpy as np
import pytest
import simplejpeg

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
