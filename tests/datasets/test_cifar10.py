"""CIFAR-10 read from tiny files written in both published formats."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from drapps.datasets import CIFAR10, write_cifar10
from drapps.ops import RandomCrop


def tiny_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, n)


@pytest.mark.parametrize("fmt", ["python", "binary"])
def test_both_formats_read_back_exactly(fmt: str, tmp_path: Path) -> None:
    train, test = tiny_split(12, 0), tiny_split(4, 1)
    folder = write_cifar10(tmp_path, train, test, format=fmt)  # type: ignore[arg-type]
    expected_files = {f"data_batch_{i}" for i in range(1, 6)} | {"test_batch"}
    suffix = ".bin" if fmt == "binary" else ""
    assert {p.name for p in folder.iterdir()} == {n + suffix for n in expected_files}
    for split, (images, labels) in ((True, train), (False, test)):
        ds = CIFAR10(tmp_path, train=split)  # the parent folder is found too
        assert ds.format == fmt and len(ds) == len(labels)
        for i in range(len(ds)):
            image, label = ds[i]
            assert image.shape == (32, 32, 3) and image.dtype == np.uint8
            np.testing.assert_array_equal(image, images[i].transpose(1, 2, 0))
            assert label == labels[i]


def test_the_binary_record_layout_is_cifars(tmp_path: Path) -> None:
    images, labels = tiny_split(5, 2)
    folder = write_cifar10(tmp_path, (images, labels), (images, labels), format="binary")
    raw = (folder / "test_batch.bin").read_bytes()
    assert len(raw) == 5 * 3073
    assert raw[0] == labels[0] and raw[1:1025] == images[0, 0].tobytes()  # red plane first


def test_python_batches_use_cifars_keys(tmp_path: Path) -> None:
    images, labels = tiny_split(5, 3)
    folder = write_cifar10(tmp_path, (images, labels), (images, labels), format="python")
    with open(folder / "test_batch", "rb") as file:
        batch = pickle.load(file, encoding="bytes")
    assert batch[b"data"].shape == (5, 3072) and batch[b"labels"] == labels.tolist()


def test_missing_and_broken_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no CIFAR-10 batches"):
        CIFAR10(tmp_path)
    folder = write_cifar10(tmp_path, tiny_split(10, 0), tiny_split(2, 1), format="binary")
    (folder / "data_batch_3.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match=r"data_batch_3\.bin"):
        CIFAR10(tmp_path, train=True)
    (folder / "data_batch_4.bin").unlink()
    with pytest.raises((FileNotFoundError, ValueError), match="data_batch_"):
        CIFAR10(tmp_path, train=True)


def test_torchvisions_signature_and_attributes(tmp_path: Path) -> None:
    """A torchvision user's CIFAR10(root, train, transform, target_transform, download) and the
    attributes their code reads (data, targets, classes, class_to_idx)."""
    with pytest.raises(FileNotFoundError, match=r"drapps downloads nothing \(download=True\)"):
        CIFAR10(tmp_path, download=True)
    train, test = tiny_split(10, 0), tiny_split(3, 1)
    write_cifar10(tmp_path, train, test)
    ds = CIFAR10(tmp_path, train=False, target_transform=lambda label: -label, download=True)
    assert ds.data is ds.images and ds.data.shape == (3, 32, 32, 3)
    assert ds.targets == test[1].tolist() and all(type(t) is int for t in ds.targets)
    assert ds.classes[3] == "cat" and ds.class_to_idx["truck"] == 9 and len(ds.classes) == 10
    assert [ds[i][1] for i in range(3)] == [-label for label in test[1].tolist()]


def test_random_crop_pads_and_crops() -> None:
    image = np.full((32, 32, 3), 255, dtype=np.uint8)
    crops = [RandomCrop(32, padding=4)(image) for _ in range(40)]
    assert all(c.shape == (32, 32, 3) for c in crops)
    assert any((c == 0).any() for c in crops)  # some crops reach into the zero padding
    with pytest.raises(ValueError, match="cannot crop"):
        RandomCrop(40)(image)


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/drapps-cifar-pwned",))


def test_a_crafted_python_batch_cannot_run_code(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = Path("/tmp/drapps-cifar-pwned")
    marker.unlink(missing_ok=True)
    crafted = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": _RunsCode()}
    (folder / "test_batch").write_bytes(pickle.dumps(crafted))
    with pytest.raises(ValueError, match=r"asks for posix\.system, which is refused"):
        CIFAR10(tmp_path, train=False)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python_batches_of_every_pickle_protocol_read(protocol: int, tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    batch = {b"data": data, b"labels": [3, 7], b"batch_label": b"testing batch 1 of 1"}
    (folder / "test_batch").write_bytes(pickle.dumps(batch, protocol=protocol))
    images = CIFAR10(tmp_path, train=False)
    assert len(images) == 2 and images[1][1] == 7
