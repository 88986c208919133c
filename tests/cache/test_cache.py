"""The sample cache inside the loader: same batches, exactly once, bounded, never stale."""

from __future__ import annotations

import gc
import json
import logging
import logging.handlers
import os
import signal
import time
import weakref
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from helpers import assert_batches_equal, flatten_indices, slab_fds

import drapps
from drapps.cache import Cache, arena
from drapps.cache import sample_cache as cache_module
from drapps.cache.arena import ArenaTier
from drapps.cache.entry import pack
from drapps.cache.none import Raw
from drapps.cache.tier import DirectoryTier
from drapps.datasets import ImageFolder
from drapps.ops import (
    Op,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    Spec,
    ToCHWTensor,
)


class Photos:
    """Deterministic uint8 photos of a few sizes, with their index as the label."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(i)
        h, w = 20 + (i % 3) * 4, 24
        base = rng.integers(0, 255, (1, 1, 3))
        y, x = np.mgrid[0:h, 0:w]
        image = (base + 3 * x[..., None] + 2 * y[..., None]) % 256
        return image.astype(np.uint8), i


def augment() -> Pipeline:
    ops = [ToCHWTensor(), RandomResizedCrop(16), RandomHorizontalFlip()]
    return Pipeline(ops, key=0, takes=Spec("array", "uint8", "HWC"))


def epochs(loader: drapps.Loader, n: int = 3) -> list[list[Any]]:
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(n)]


def run(
    cache: Any, workers: int = 0, n: int = 3, dataset: Any = None, **kwargs: Any
) -> tuple[list[list[Any]], dict | None]:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": augment(), **kwargs}
    with drapps.Loader(dataset or Photos(), workers=workers, cache=cache, **kwargs) as loader:
        out = epochs(loader, n)
        return out, loader.stats().cache


@pytest.fixture(scope="module")
def uncached() -> list[list[Any]]:
    return run(None)[0]


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd", "quantize-16"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_lossless_cache_gives_the_same_batches_for_any_worker_count(
    uncached: list[list[Any]], codec: str, workers: int
) -> None:
    batches, stats = run(Cache(codec=codec, memory="16MB"), workers)
    for got, want in zip(batches, uncached, strict=True):
        assert_batches_equal(got, want)
    assert stats is not None
    counts = stats["counts"]
    assert (counts["misses"], counts["hits"]) == (24, 48)  # made in epoch 1, read after
    assert stats["entries"]["memory"] == 24 and counts["lossy_batches"] == 0


def test_the_cache_holds_the_deterministic_prefix_and_the_random_ops_stay_fresh() -> None:
    with drapps.Loader(
        Photos(), batch_size=4, seed=3, shuffle=True, transform=augment(), workers=0, cache=True
    ) as loader:
        assert (
            loader._parts.cache is not None and loader._parts.cache.prefix == 1
        )  # ToCHWTensor only
        first, second = epochs(loader, 2)
    # The crop and flip are drawn per epoch: epoch 2 is not epoch 1 replayed.
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))


def test_the_cache_follows_the_split_and_resumes_mid_epoch(uncached: list[list[Any]]) -> None:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": augment()}
    with drapps.Loader(Photos(), workers=2, cache=True, split=0, **kwargs) as loader:
        assert [len(epoch) for epoch in epochs(loader, 1)] == [6]
        it = iter(loader)  # epoch 2, from the cache
        head = [next(it) for _ in range(2)]
        state = loader.state_dict()
    with drapps.Loader(Photos(), workers=2, cache=True, split=1, **kwargs) as loader:
        loader.load_state_dict(state)
        tail = list(loader)
    assert_batches_equal([(x, y) for x, y in head + tail], uncached[1])


def test_a_worker_killed_mid_write_leaves_no_entry_and_loses_no_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uncached: list[list[Any]]
) -> None:
    flag = tmp_path / "killed"
    publish = ArenaTier._publish

    def die_once(self: ArenaTier, *args: Any) -> bool:
        # The record is written in full into the arena; the worker dies before the index
        # points at it.
        if not flag.exists():
            flag.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return publish(self, *args)

    monkeypatch.setattr(ArenaTier, "_publish", die_once)  # forked workers inherit it
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": augment()}
    with drapps.Loader(
        Photos(), workers=2, cache=True, multiprocessing_context="fork", **kwargs
    ) as loader:
        batches = epochs(loader, 3)
        stats = loader.stats()
    assert flag.exists() and stats.worker_restarts >= 1
    for got, want in zip(batches, uncached, strict=True):
        assert_batches_equal(got, want)
        assert sorted(flatten_indices([y for _, y in got])) == list(range(24))
    assert stats.cache is not None and stats.cache["counts"]["corrupt"] == 0


def arena_records(tier: ArenaTier) -> list[tuple[int, int]]:
    """(start, length) of the entry bytes of every live record in the arena."""
    view, records = tier.region.view, []
    for slot in range(tier.slots):
        _, offset, length = arena._SLOT.unpack_from(view, arena._HEADER.size + slot * 32)
        if length > 0:
            records.append((tier._data + offset + arena._DIGEST, length))
    return records


def test_a_corrupt_entry_is_dropped_and_made_again(uncached: list[list[Any]]) -> None:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": augment()}
    with drapps.Loader(Photos(), workers=2, cache=Cache(codec="zstd"), **kwargs) as loader:
        first = epochs(loader, 1)
        assert loader._parts.cache is not None
        memory = loader._parts.cache.tiers[0]
        assert isinstance(memory, ArenaTier)
        records = arena_records(memory)
        assert len(records) == 24
        for start, length in records[::2]:
            memory.region.view[start + length - 3] ^= 0x5A
        rest = epochs(loader, 2)
        counts = loader.stats().cache["counts"]  # type: ignore[index]
    for got, want in zip(first + rest, uncached, strict=True):
        assert_batches_equal(got, want)
    assert counts["corrupt"] == 12 and counts["writes"] == 36  # 24, then the 12 remade
    assert counts["hits"] == 48 - 12


def test_the_budget_bounds_each_tier_and_the_rest_is_made_every_epoch(
    tmp_path: Path, uncached: list[list[Any]]
) -> None:
    one = len(pack(Photos()[0], Raw(), Raw(), None).data)
    cache = Cache(memory=one * 5, disk=tmp_path, disk_bytes=one * 5, codec="none")
    batches, stats = run(cache, workers=2)
    for got, want in zip(batches, uncached, strict=True):
        assert_batches_equal(got, want)
    assert stats is not None
    assert stats["held_bytes"]["memory"] <= one * 5 and stats["held_bytes"]["disk"] <= one * 5
    assert 6 <= stats["entries"]["memory"] + stats["entries"]["disk"] <= 10
    cached = stats["entries"]["memory"] + stats["entries"]["disk"]
    assert stats["counts"]["not_admitted"] == 3 * (24 - cached)
    assert stats["counts"]["hits"] == 2 * cached


def test_disk_entries_outlive_the_run_but_a_changed_pipeline_never_reads_them(
    tmp_path: Path,
) -> None:
    def make(size: int) -> Pipeline:
        return Pipeline([ToCHWTensor(), Resize(size), RandomHorizontalFlip()], key=0)

    def first_epoch(size: int) -> tuple[list[Any], dict]:
        cache = Cache(memory=0, disk=tmp_path)
        batches, stats = run(cache, workers=0, n=1, transform=make(size))
        assert stats is not None
        return batches[0], stats["counts"]

    fresh, counts = first_epoch(12)
    assert counts["misses"] == 24 and counts["writes"] == 24
    again, counts = first_epoch(12)  # a new loader, the same pipeline: read from disk
    assert counts["hits"] == 24 and counts["misses"] == 0
    assert_batches_equal(again, fresh)
    changed, counts = first_epoch(10)  # Resize(10): a new prefix, a new key
    assert counts["hits"] == 0 and changed[0][0].shape[-1] == 10
    assert_batches_equal(changed, run(None, n=1, transform=make(10))[0][0])


def write_folder(root: Path, n: int = 12) -> Path:
    for i in range(n):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        image = Photos()[i][0][:20].repeat(4, axis=0).repeat(4, axis=1)
        (folder / f"{i:03d}.jpg").write_bytes(simplejpeg.encode_jpeg(image, quality=90))
    return root


def test_auto_caches_a_deterministic_image_folder_and_not_one_with_a_random_transform(
    tmp_path: Path,
) -> None:
    root = write_folder(tmp_path / "images")
    with drapps.Loader(ImageFolder(root), batch_size=4, workers=0) as loader:
        list(loader), list(loader)
        stats = loader.stats().cache
        assert stats is not None and stats["counts"]["hits"] == 12 and stats["enabled"]
    random_inside = ImageFolder(root, transform=RandomHorizontalFlip())
    with drapps.Loader(random_inside, batch_size=4, workers=0) as loader:
        assert loader.stats().cache is None
    with drapps.Loader(Photos(), batch_size=4, workers=0) as loader:  # says nothing: off
        assert loader.stats().cache is None


def test_a_rewritten_file_is_never_read_from_an_old_disk_entry(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "images")
    cache = Cache(memory=0, disk=tmp_path / "cache")
    with drapps.Loader(ImageFolder(root), batch_size=12, workers=0, cache=cache) as loader:
        (before,) = list(loader)
    path = root / "class0" / "000.jpg"
    path.write_bytes(simplejpeg.encode_jpeg(np.zeros((80, 96, 3), np.uint8), quality=90))
    with drapps.Loader(ImageFolder(root), batch_size=12, workers=0, cache=cache) as loader:
        (after,) = list(loader)
        assert loader.stats().cache["counts"]["hits"] == 0  # type: ignore[index]
    assert not np.array_equal(before[0][0], after[0][0]) and after[0][0].max() < 8


def test_auto_turns_itself_off_when_the_dataset_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_folder(tmp_path / "images", n=40)
    monkeypatch.setattr(cache_module, "_memory_budget", lambda memory: 200_000)  # ~25 photos
    with drapps.Loader(ImageFolder(root), batch_size=8, workers=0) as loader:
        list(loader), list(loader)
        stats = loader.stats().cache
    assert stats is not None and not stats["enabled"]
    assert stats["entries"]["memory"] == 0 and stats["held_bytes"]["memory"] == 0
    assert stats["counts"]["hits"] == 0


def test_a_lossy_codec_serves_close_batches_and_counts_them(uncached: list[list[Any]]) -> None:
    big = Pipeline([ToCHWTensor(), Resize(64), RandomHorizontalFlip()], key=0)
    exact, _ = run(None, transform=big)
    lossy, stats = run(Cache(codec="jpeg", min_psnr=30), transform=big)
    assert stats is not None and stats["counts"]["lossy_hits"] == 48
    assert stats["counts"]["lossy_batches"] == 12  # epochs 2 and 3
    assert_batches_equal(lossy[0], exact[0])  # epoch 1 is made, not read
    for got, want in zip(lossy[1], exact[1], strict=True):
        assert not torch.equal(got[0], want[0])
        err = (got[0].double() - want[0].double()).pow(2).mean()
        assert 10 * torch.log10(255.0**2 / err) > 30


def test_a_codec_change_re_encodes_entries_as_they_are_read(uncached: list[list[Any]]) -> None:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": augment()}
    with drapps.Loader(Photos(), workers=2, cache=True, **kwargs) as loader:
        first = epochs(loader, 1)
        loader.set_codec("zstd")
        second = epochs(loader, 1)
        stats = loader.stats().cache
        assert stats is not None and stats["codec"] == "zstd"
        assert stats["counts"]["migrations"] == 24
        loader.set_codec("off")
        third = epochs(loader, 1)
        counts = loader.stats().cache["counts"]  # type: ignore[index]
        assert counts["hits"] == 24 and counts["misses"] == 24  # epoch 3 bypassed the cache
        with pytest.raises(
            ValueError, match=r"codec must be one of \['none', .*'off'\], got 'gzip'"
        ):
            loader.set_codec("gzip")
    for got, want in zip(first + second + third, uncached, strict=True):
        assert_batches_equal(got, want)


def test_bad_cache_arguments_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"cache must be 'auto', True, False, None or a drapps.Cache, got 'yes'"
    ):
        drapps.Loader(Photos(), cache="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache: an iterable dataset"):
        drapps.Loader(_Stream(), cache=True, workers=0)
    with drapps.Loader(Photos(), cache=None, workers=0) as loader:
        with pytest.raises(
            ValueError, match=r"set_codec\('zstd'\): this loader has no sample cache"
        ):
            loader.set_codec("zstd")


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(4))


class Flat:
    """Costly to make (3 ms), cheap to compress (flat images): a budget that holds a quarter
    of them raw holds all of them compressed."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        time.sleep(0.003)
        return np.full((100, 200, 3), i % 251, dtype=np.uint8), i


@pytest.mark.timeout(120)
def test_the_controller_moves_to_a_codec_that_fits_the_dataset(tmp_path: Path) -> None:
    cache = Cache(memory=400 * 60_200 // 4)
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(
        Flat(),
        batch_size=16,
        shuffle=True,
        seed=0,
        workers="auto",
        cache=cache,
        control_interval=0.1,
        trace=trace,
    ) as loader:
        for _ in range(8):
            list(loader)
        stats = loader.stats().cache
        report = loader.report()
    assert stats is not None and stats["codec"] in ("lz4", "zstd")
    assert set(stats["profile"]) == {"none", "quantize-16", "lz4", "zstd"}
    assert stats["entries"]["memory"] == 400 and stats["counts"]["migrations"] > 0
    assert "Cache:" in report and "(it moved through none -> " in report
    reasons = [json.loads(line).get("action", {}).get("reason", "") for line in trace.open()]
    assert any(r.startswith(f"codec {stats['codec']}: ") for r in reasons)


@pytest.mark.timeout(120)
def test_a_learned_policy_over_the_codec_and_priority_steers_the_real_loader(
    tmp_path: Path,
) -> None:
    """A policy trained over every knob drives the real cache and pool as the simulator's:
    its codec steps go to smaller profiled entries, one a tick, and its priority step lowers
    the workers'; every sample still comes once per epoch."""
    from drapps.control import Action, State
    from drapps.control.rl import MlpPolicy

    knobs = ("workers", "prefetch", "codec", "priority")
    actions = Action.space(knobs)
    bias = np.full(len(actions), -1.0, dtype=np.float32)
    bias[actions.index(Action.of_steps({"codec": 1, "priority": -1}))] = 1.0
    width = len(State.features(knobs))
    # It decides on the loader's tick: at the trained 0.5 s, each decision would fall on an
    # epoch's start once the cache is warm (epochs here are shorter than that), and a policy
    # holds an interval after an epoch begins, so how many steps it took was the runner's speed.
    layers = [(np.zeros((width, len(actions)), np.float32), bias)]
    policy = MlpPolicy(layers, knobs=knobs, meta={"interval": 0.1})
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(
        Flat(), batch_size=16, shuffle=True, seed=0, workers="auto", policy=policy,
        cache=Cache(memory=400 * 60_200 // 4), control_interval=0.1, trace=trace,
    ) as loader:  # fmt: skip
        for _ in range(4):
            labels = sorted(int(i) for _, y in loader for i in y)
            assert labels == list(range(400))
        stats = loader.stats().cache
    assert stats is not None
    smallest = min(stats["profile"], key=lambda name: stats["profile"][name][0])
    rows = [json.loads(line) for line in trace.open()]
    assert rows[-1]["applied"]["codec"] == smallest and rows[-1]["applied"]["priority"] == "low"
    assert rows[-1]["state"]["priority"] == "low"


def test_further_tiers_must_be_tiers_with_names_of_their_own(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Cache\.tiers must hold Tier objects"):
        drapps.Loader(Photos(), workers=0, cache=Cache(tiers=("redis://",)))
    twin = DirectoryTier(tmp_path / "twin", 10**6, "memory")
    with pytest.raises(ValueError, match="a tier named 'memory' is already in the cache"):
        drapps.Loader(Photos(), workers=0, cache=Cache(tiers=(twin,)))
    extra = DirectoryTier(tmp_path / "extra", 10**7, "extra")
    _, stats = run(Cache(memory=0, tiers=(extra,)), workers=2, n=2)
    assert stats is not None and stats["entries"] == {"memory": 0, "extra": 24}
    assert stats["counts"]["hits"] == 24


class _Slow(Op):
    """A deterministic op that takes 5 ms (a cache keeps its output)."""

    def __call__(self, sample: Any) -> Any:
        time.sleep(0.005)
        return sample


def test_the_cached_ops_still_count_as_transform_time() -> None:
    ops = Pipeline([_Slow(), ToCHWTensor(), RandomHorizontalFlip()], key=0)
    kwargs = {"batch_size": 4, "collate_fn": list, "transform": ops, "cache": True}
    with drapps.Loader(Photos(8), workers=2, **kwargs) as loader:
        assert (
            loader._parts.cache is not None and loader._parts.cache.prefix == 2
        )  # slow op, to-tensor
        list(loader)  # epoch 1 makes every sample: the slow op runs 8 times
        stats = loader.stats()
    assert stats.transform_s >= 8 * 0.005


def test_entries_keep_layouts_and_dtypes_numpy_lacks() -> None:
    """A transposed tensor came back contiguous, a Fortran array C-ordered, a stepped or
    expanded view contiguous; a float8 tensor or a conjugate view failed the sample
    (``.numpy()`` refuses them)."""
    from drapps.cache.entry import pack, unpack
    from drapps.cache.registry import CODECS

    none = CODECS.get("none")
    sample = {
        "transposed": torch.arange(12.0).reshape(3, 4).t(),
        "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)),
        "float8": torch.arange(4.0).to(torch.float8_e4m3fn),
        "bfloat16": torch.arange(6.0).to(torch.bfloat16).reshape(2, 3).t(),
        "conj": (torch.arange(3.0) * 1j).conj(),
        "stepped": torch.arange(24.0).reshape(4, 6)[1::2, ::3],
        "expanded": torch.arange(3).expand(4, 3),
        "stepped bfloat16": torch.arange(8.0).to(torch.bfloat16)[::2],
        "stepped array": np.arange(24).reshape(4, 6)[::2, 1::2],
    }
    got = unpack(bytearray(pack(sample, none, none, None).data), {"none": none}).sample
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            assert got[name].strides == value.strides and np.array_equal(got[name], value)
            continue
        assert got[name].dtype == value.dtype and got[name].stride() == value.stride(), name
        bits = value.resolve_conj().contiguous().view(torch.uint8)
        assert torch.equal(got[name].contiguous().view(torch.uint8), bits), name


def _aligned(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % min(value.element_size(), 16) == 0
    return value.ctypes.data % min(value.itemsize, 16) == 0


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_every_array_of_an_entry_comes_back_aligned_for_its_dtype(codec: str) -> None:
    """Found by a campaign: the ``none`` codec's arrays were views of the read buffer at
    whatever offset the header's length left, and a complex128 tensor at an odd one crashed
    torch's stack (a SIGSEGV in the worker, or in the training process without workers)."""
    from drapps.cache.entry import unpack
    from drapps.cache.registry import CODECS

    chosen = CODECS.get(codec)
    for tag in range(20):  # headers of every length modulo the alignment
        sample = {
            "tag": "x" * tag,
            "complex": (torch.arange(6.0) + tag).to(torch.complex128)[:3].expand(2, 3),
            "floats": np.arange(5, dtype=np.float64) / (tag + 1),
            "bytes": np.arange(3, dtype=np.uint8),  # leaves the next payload's start odd
            "halves": torch.arange(7.0).to(torch.complex64)[::2],
            "wide": np.arange(4).astype(np.clongdouble),
        }
        data = pack(sample, chosen, CODECS.get("none"), None).data
        for buffer in (bytearray(data), memoryview(bytearray(b"?" + data))[1:]):
            got = unpack(buffer, {"none": CODECS.get("none"), codec: chosen}).sample
            for name in ("complex", "floats", "bytes", "halves", "wide"):
                assert _aligned(got[name]), f"{codec}, tag {tag}: {name} is not aligned"
                assert got[name].dtype == sample[name].dtype
                if isinstance(got[name], torch.Tensor):
                    assert got[name].stride() == sample[name].stride()
                    assert torch.equal(got[name], sample[name]), name
                else:
                    assert np.array_equal(got[name], sample[name]), name


def test_an_entry_of_the_format_before_aligned_payloads_is_still_read() -> None:
    """Entries a disk tier kept from before payloads were aligned (``DRJ1``: end to end, a
    CRC-32) are read, their misaligned arrays copied, not made again."""
    import struct
    import zlib

    from drapps.cache.entry import unpack
    from drapps.cache.registry import CODECS

    values = np.arange(3, dtype=np.complex128) + 1j
    leaves = [
        [0, "none", "|u1", [3], False, {"exact": True}, 3],
        [1, "none", values.dtype.str, [3], True, {"exact": True}, values.nbytes],
    ]
    skeleton = {"t": [{"a": 0}, {"a": 1}]}
    header = json.dumps({"skeleton": skeleton, "leaves": leaves, "codec": "none"}).encode()
    body = header + bytes([7, 8, 9]) + values.tobytes()
    data = struct.pack("<4sII", b"DRJ1", zlib.crc32(body), len(header)) + body
    small, tensor = unpack(bytearray(data), {"none": CODECS.get("none")}).sample
    assert small.tolist() == [7, 8, 9]
    assert _aligned(tensor) and torch.equal(tensor, torch.from_numpy(values))


class _Expanded(torch.utils.data.Dataset):
    """Complex samples that are views: each an expanded row."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return (torch.arange(12.0) + i).to(torch.complex128)[:3].expand(2, 3)


@pytest.mark.parametrize("workers", [0, 2])
def test_complex_views_read_back_from_the_cache_are_dataloaders_batches(workers: int) -> None:
    expected = list(torch.utils.data.DataLoader(_Expanded(), batch_size=3))
    cache = Cache(memory="16MB", codec="none")
    with drapps.Loader(_Expanded(), batch_size=3, workers=workers, cache=cache) as loader:
        for epoch in range(3):  # the first makes the entries, the others read them
            assert_batches_equal(list(loader), expected, f"epoch {epoch}, ")


@pytest.mark.parametrize(
    "value",
    [np.ma.masked_array([1, 2], mask=[True, False]), np.zeros(2, dtype=[("a", "<i4")])],
    ids=["masked", "structured"],
)
def test_entries_refuse_what_they_would_change(value: Any) -> None:
    """A masked array was stored as its data (its mask lost, then a failed reshape)."""
    from drapps.cache.entry import Uncacheable, pack
    from drapps.cache.registry import CODECS

    none = CODECS.get("none")
    with pytest.raises(Uncacheable):
        pack({"x": value}, none, none, None)


class _Tagged:
    """Samples holding an object no cache entry can carry."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, Fraction]:
        return i, Fraction(i, 3)


@pytest.mark.parametrize("workers", [0, "auto"])
def test_a_log_handler_that_keeps_records_keeps_no_dropped_loader_alive(
    workers: int | str,
) -> None:
    """A sample the cache refuses is logged once. The record held the refusal itself, whose
    traceback held the training loop's frames and through them the loader: a handler that
    keeps records (pytest's, a MemoryHandler) kept a dropped loader's workers, threads and
    cache memory alive."""
    kept = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
    log = logging.getLogger("drapps")
    log.addHandler(kept)
    try:
        loader = drapps.Loader(
            _Tagged(), batch_size=4, workers=workers, cache=Cache(memory="4MB"), collate_fn=list
        )
        if workers == "auto":  # the batches made in the training process, as auto may
            iterator = iter(loader)
            next(iterator)
            assert loader._parts.engine.use_loop(True)
        else:
            iterator = iter(loader)
        assert next(iterator) is not None
        gone = weakref.ref(loader)
        del loader, iterator
        gc.collect()
        refusals = [r for r in kept.buffer if "is not cached" in r.getMessage()]
        assert refusals, [r.getMessage() for r in kept.buffer]
        assert "cannot hold a fractions.Fraction" in refusals[0].getMessage()
        assert gone() is None, "a dropped loader was kept alive by a logged record"
        assert not slab_fds(), slab_fds()
    finally:
        log.removeHandler(kept)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_no_entry_can_hold_is_made_every_epoch_under_the_default_codec(
    workers: int,
) -> None:
    """The codec profile packed each first sample and let a refusal fail the sample (named as
    failed in the transform); it is not cached, as any refused sample is."""
    expected = [list(batch) for batch in torch.utils.data.DataLoader(_Tagged(), 4, collate_fn=list)]
    with drapps.Loader(
        _Tagged(), batch_size=4, workers=workers, cache=Cache(memory="4MB"), collate_fn=list
    ) as loader:
        for _ in range(2):
            assert [list(batch) for batch in loader] == expected
        stats = loader.stats().cache
    assert stats is not None, stats
    assert stats["counts"]["writes"] == 0 and stats["counts"]["not_admitted"] == 16, stats
