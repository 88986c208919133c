import errno
import gc
import os
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import mounted_tmpfs

from drapps.runtime import transport
from drapps.runtime.transport import SharedMemoryFullError, pack, remove_slabs, unpack

Pair = namedtuple("Pair", "image label")


@pytest.fixture()
def slab_path() -> str:
    return transport.slab_prefix(f"{os.getpid()}_test", 0) + "0"


def test_round_trip_keeps_structure_dtypes_and_values(slab_path: str) -> None:
    batch = {
        "f32": torch.randn(4, 3, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(20).reshape(4, 5).t(),
        "numpy": np.arange(12, dtype=np.int16).reshape(3, 4),
        "pair": Pair(torch.ones(2, 2, dtype=torch.uint8), 7),
        "names": ["a", "b"],
    }
    packed = pack(batch, slab_path)
    assert packed.path == slab_path and len(packed.skeleton) < 2048
    out = unpack(packed)
    assert not os.path.exists(slab_path)  # unlinked as soon as it is mapped
    for key in ("f32", "bf16", "bool", "scalar", "empty", "strided"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key]), key
    np.testing.assert_array_equal(out["numpy"], batch["numpy"])
    assert isinstance(out["pair"], Pair) and out["pair"].label == 7
    assert torch.equal(out["pair"].image, batch["pair"].image)
    assert out["names"] == ["a", "b"]


def test_tensors_are_writable_and_outlive_the_unlinked_slab(slab_path: str) -> None:
    out = unpack(pack(torch.zeros(1000), slab_path))
    out += 1
    assert float(out.sum()) == 1000.0


def test_batch_without_arrays_needs_no_slab(slab_path: str) -> None:
    packed = pack({"labels": [1, 2], "text": "x"}, slab_path)
    assert packed.path is None and unpack(packed) == {"labels": [1, 2], "text": "x"}


def test_full_shared_memory_names_the_fix_and_removes_the_partial_slab(
    slab_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(SharedMemoryFullError, match="--shm-size"):
        pack(torch.zeros(100), slab_path)
    assert not os.path.exists(slab_path)


def test_remove_slabs_by_prefix(slab_path: str) -> None:
    pack(torch.zeros(3), slab_path)
    pack(torch.zeros(3), slab_path + "b")
    assert remove_slabs(transport.slab_prefix(f"{os.getpid()}_test")) == 2


@pytest.fixture()
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "shm", "1m") as mount:
        yield mount


def test_a_really_full_tmpfs_raises_shared_memory_full(tiny_tmpfs: Path) -> None:
    path = str(tiny_tmpfs / "drapps_test_w0_0")
    with pytest.raises(SharedMemoryFullError, match=r"\(1 MiB\) is full while writing a 4.0 MiB"):
        pack(torch.zeros(2**20), path)
    assert os.listdir(tiny_tmpfs) == []


def _released(batch: object) -> None:
    """Drop the caller's last reference to a batch (passed in, not held elsewhere), so its
    slab's finalizers run."""
    del batch
    gc.collect()


def test_a_released_slab_is_written_over_by_its_worker(tmp_path: Path) -> None:
    prefix = transport.slab_prefix(f"{os.getpid()}_recycle", 3)
    writer, recycler = transport.SlabWriter(), transport.SlabRecycler()
    try:
        first = pack({"x": torch.arange(4096)}, transport.slab_name(prefix), writer)
        assert first.recycle and first.path is not None
        batch = unpack(first, recycler=recycler)
        inode = os.stat(first.path).st_ino  # the name stays while the batch lives
        held = pack({"x": torch.arange(4096) + 1}, transport.slab_name(prefix), writer)
        assert os.stat(held.path).st_ino != inode  # not released yet: a new slab
        del batch
        gc.collect()
        assert os.path.exists(first.path + transport.FREE_SUFFIX)
        second = pack({"x": torch.arange(4096) * 2}, transport.slab_name(prefix), writer)
        assert os.stat(second.path).st_ino == inode  # the released one, renamed
        assert not os.path.exists(first.path + transport.FREE_SUFFIX)
        torch.testing.assert_close(unpack(second, recycler=recycler)["x"], torch.arange(4096) * 2)
        torch.testing.assert_close(unpack(held, recycler=recycler)["x"], torch.arange(4096) + 1)
    finally:
        recycler.close()
        remove_slabs(prefix)


def test_the_recycler_keeps_a_few_per_worker_and_none_after_close() -> None:
    prefix = transport.slab_prefix(f"{os.getpid()}_keep", 0)
    writer, recycler = transport.SlabWriter(), transport.SlabRecycler(keep=2)
    try:
        packed = [pack([np.ones(1000)], transport.slab_name(prefix), writer) for _ in range(4)]
        batches = [unpack(p, recycler=recycler) for p in packed]
        for _ in range(3):
            _released(batches.pop(0))
        free = [p.path for p in packed if os.path.exists(p.path + transport.FREE_SUFFIX)]
        assert len(free) == 2 and not os.path.exists(packed[2].path)  # the third: unlinked
        recycler.close()
        _released(batches.pop())
        assert not os.path.exists(packed[3].path)  # after close: unlinked, not kept
    finally:
        remove_slabs(prefix)


def test_without_a_recycler_a_recyclable_slab_is_unlinked_at_once(slab_path: str) -> None:
    packed = pack([np.ones(10)], slab_path, transport.SlabWriter())
    batch = unpack(packed)
    assert not os.path.exists(slab_path) and batch[0].sum() == 10


def test_a_recyclable_slab_that_cannot_be_mapped_is_unlinked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = transport.slab_prefix(f"{os.getpid()}_nomap", 0)
    packed = pack([np.ones(100)], transport.slab_name(prefix), transport.SlabWriter())

    def no_map(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(transport.mmap, "mmap", no_map)
    try:
        with pytest.raises(OSError, match="Cannot allocate memory"):
            unpack(packed, recycler=transport.SlabRecycler())
        assert not os.path.exists(packed.path)  # never released, so not kept for its worker
    finally:
        remove_slabs(prefix)
