"""No wrong batch and no foreign code: forks, crafted cache entries, odd inputs.

Each test here failed before its fix: a forked child's exit made the parent receive another
batch's data; a cache entry's header was a pickle; a float split was taken; zero-size tensors
could not leave a worker; worker seeds reached 2**63.
"""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from test_loader_lifecycle import run_script

import drapps
from drapps.cache import Cache
from drapps.cache.entry import CorruptEntry, unpack
from drapps.cache.none import Raw
from drapps.ops import Pipeline, RandomHorizontalFlip, ToCHWTensor

FORKS = """
import multiprocessing, os
import torch

class Indexed(torch.utils.data.Dataset):
    def __len__(self):
        return 400
    def __getitem__(self, i):  # 1 MiB, every value its index
        return torch.full((256 * 1024,), float(i))

def child_exits():
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a helper process that finishes normally: atexit, finalizers and all
    os.waitpid(pid, 0)

def process_exits():
    proc = multiprocessing.get_context("fork").Process(target=lambda: None)
    proc.start()
    proc.join()

def child_iterates():
    pid = os.fork()
    if pid == 0:
        with drapps.Loader(Indexed(), batch_size=4, num_workers=2) as own:
            for k, batch in enumerate(own):
                if k == 5:
                    break
        sys.exit(0)
    os.waitpid(pid, 0)

fork = {"os.fork": child_exits, "process": process_exits, "iterates": child_iterates}[KIND]
loader = drapps.Loader(Indexed(), batch_size=4, workers=2, prefetch=8)
held, bad = [], 0
for k, batch in enumerate(loader):
    if k % 10 == 5:
        fork()
    held = (held + [(k, batch)])[-3:]  # the loop keeps the last three batches
    for j, kept in held:
        if kept[:, 0].tolist() != [4.0 * j + i for i in range(4)] or kept.min() != 4 * j:
            bad += 1
    if k == 60:
        break
loader.close()
print("bad", bad, flush=True)
"""


@pytest.mark.parametrize("kind", ["os.fork", "process", "iterates"])
def test_a_forked_child_never_changes_the_parents_batches(kind: str) -> None:
    proc = run_script(f"KIND = {kind!r}\n" + FORKS)
    out, err = proc.communicate(timeout=110)
    assert proc.returncode == 0, err
    assert out.split() == ["bad", "0"], out + err


class Touches:
    """Unpickling this writes a file: what a crafted entry would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> object:
        return (Path(self.path).write_text, ("ran",))


def crafted(header: bytes, payload: bytes = b"", magic: bytes = b"DRJ1") -> bytes:
    body = header + payload
    return struct.pack("<4sII", magic, zlib.crc32(body), len(header)) + body


def test_an_entry_never_unpickles_its_header(tmp_path: Path) -> None:
    flag = tmp_path / "ran"
    codecs = {"none": Raw()}
    evil = pickle.dumps((Touches(str(flag)), [], "none"))
    for magic in (b"DRC1", b"DRJ1"):  # the earlier pickle format, and a pickle in the new one
        with pytest.raises(CorruptEntry):
            unpack(bytearray(crafted(evil, magic=magic)), codecs)
    leaf = [0, "none", "|O", [1], False, {"exact": True}, 8]  # an object dtype: refused
    header = json.dumps({"skeleton": {"a": 0}, "leaves": [leaf], "codec": "none"}).encode()
    with pytest.raises(CorruptEntry, match="dtype"):
        unpack(bytearray(crafted(header, bytes(8))), codecs)
    named = {"n": ["os", "system", [], []]}  # a callable named as a named tuple
    header = json.dumps({"skeleton": named, "leaves": [], "codec": "none"}).encode()
    with pytest.raises(CorruptEntry, match="named tuple"):
        unpack(bytearray(crafted(header)), codecs)
    assert not flag.exists()


class Labelled(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((4, 4), i, dtype=np.uint8), i


def test_crafted_entries_in_a_shared_disk_cache_are_made_again_never_run(tmp_path: Path) -> None:
    """Another job that can write the shared cache directory replaces every entry with a
    pickle that runs code: the loader counts them corrupt and reads the source instead."""
    flag = tmp_path / "ran"
    cache = Cache(memory=1, disk=tmp_path / "disk", key="shared")  # all on disk
    with drapps.Loader(Labelled(), batch_size=4, workers=0, cache=cache) as loader:
        list(loader)
    entries = [p for p in (tmp_path / "disk").rglob("*") if p.is_file() and len(p.name) > 8]
    assert len(entries) >= 16
    evil = crafted(pickle.dumps((Touches(str(flag)), [], "none")), magic=b"DRC1")
    for path in entries:
        path.write_bytes(evil)
    small = Cache(memory=1, disk=tmp_path / "disk", key="shared")  # the disk tier answers
    with drapps.Loader(Labelled(), batch_size=4, workers=2, cache=small) as loader:
        batches = list(loader)
        counts = loader.stats().cache["counts"]  # type: ignore[index]
    assert not flag.exists()
    assert [int(v) for _, labels in batches for v in labels] == list(range(16))
    assert all(int(x[i, 0, 0]) == int(y[i]) for x, y in batches for i in range(4))
    assert counts["corrupt"] >= 16


def flip() -> Pipeline:
    return Pipeline([ToCHWTensor(), RandomHorizontalFlip()])


@pytest.mark.parametrize("bad", [2.0, 1.0, True, "1", 7, 0])
def test_a_bad_split_is_refused_at_the_call(bad: object) -> None:
    images = [np.zeros((2, 2, 1), np.uint8)] * 4
    with drapps.Loader(images, batch_size=2, transform=flip(), workers=1) as loader:
        with pytest.raises(ValueError, match="split must be"):
            loader.set_split(bad)  # type: ignore[arg-type]
        assert len(list(loader)) == 2  # nothing broken by the refusal
    with pytest.raises(ValueError, match="split must be"):
        drapps.Loader(images, batch_size=2, transform=flip(), workers=1, split=bad)


def test_numpy_integer_splits_are_taken_by_both_paths() -> None:
    images = [np.zeros((2, 2, 1), np.uint8)] * 4
    with drapps.Loader(
        images, batch_size=2, transform=flip(), workers=1, split=np.int64(1)
    ) as loader:
        loader.set_split(np.int64(2))
        assert [tuple(b.shape) for b in loader] == [(2, 1, 2, 2)] * 2


def test_zero_size_tensors_leave_a_worker() -> None:
    data = [torch.empty(0) for _ in range(20)]
    with drapps.Loader(data, batch_size=10, num_workers=1) as loader:
        shapes = [tuple(batch.shape) for batch in loader]
    assert shapes == [(10, 0), (10, 0)]


class Seeds(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(torch.initial_seed())  # int64: overflows at 2**63


@pytest.mark.parametrize("seed", [None, 2**64 - 1])
def test_torch_seeds_in_workers_stay_below_2_63(seed: int | None) -> None:
    with drapps.Loader(Seeds(), batch_size=8, num_workers=2, seed=seed) as loader:
        seeds = torch.cat(list(loader))
    assert (seeds >= 0).all()


class Stream(torch.utils.data.IterableDataset):
    """Shards itself by worker; each item is its index."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 64, step):
            yield torch.full((50_000,), float(i))


@pytest.mark.timeout(180)
def test_iterable_datasets_under_forkserver_deliver_every_epoch() -> None:
    """Workers replaced between epochs once removed their successors' slabs (which shared
    their names): FileNotFoundError or a broken pipe, 2 runs in 3."""
    for _ in range(3):
        with drapps.Loader(
            Stream(), batch_size=4, num_workers=2, multiprocessing_context="forkserver"
        ) as loader:
            for _ in range(3):
                assert sorted(int(v) for b in loader for v in b[:, 0]) == list(range(64))
