"""The disk tier: a full or failing file system, things planted where entries go, and who may
read and write the cache directory.

Every sample arrives, exactly once, with its own values, whatever the disk tier's directory
holds: a write that fails is a sample not cached, never a sample lost; a file that is not an
entry (a directory, a FIFO, a link, a huge sparse file, another user's file) is counted
corrupt and the sample made again.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import mounted_tmpfs

import drapps
from drapps.cache import Cache
from drapps.cache import tier as tier_module
from drapps.cache.entry import unpack
from drapps.cache.none import Raw
from drapps.cache.tier import DirectoryTier

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
OTHER_UID = 4242  # a user that is not the one running the tests


class Rows(torch.utils.data.Dataset):
    """``n`` samples of ``size`` bytes: every byte of sample i is ``i % 251``, its label ``i``."""

    def __init__(self, n: int = 24, size: int = 4096) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full(self.size, i % 251, dtype=np.uint8), i


def cache_of(disk: Path, **kwargs: Any) -> Cache:
    """Everything in the disk tier (no memory), entries as they are."""
    return Cache(**{"memory": 0, "disk": disk, "codec": "none", "key": "rows", **kwargs})


def load(cache: Cache, workers: int, epochs: int = 2, **kwargs: Any) -> tuple[list[Any], dict]:
    """The batches of each epoch and the cache's counters."""
    dataset = Rows(**kwargs)
    with drapps.Loader(dataset, batch_size=4, num_workers=workers, cache=cache) as loader:
        seen = [list(loader) for _ in range(epochs)]
        stats = loader.stats().cache
    assert stats is not None
    for batches in seen:
        assert_every_sample_once(batches, dataset.n)
    return seen, stats


def assert_every_sample_once(batches: list[Any], n: int) -> None:
    labels = [int(label) for _, ys in batches for label in ys]
    assert sorted(labels) == list(range(n)), labels
    for xs, ys in batches:
        for x, y in zip(xs, ys, strict=True):
            assert bool((x == int(y) % 251).all()), f"sample {int(y)} has another's values"


def entry_files(disk: Path) -> list[Path]:
    return [p for p in (disk / "drapps-cache").glob("??/*") if p.is_file() and not p.is_symlink()]


def entries_by_index(disk: Path) -> dict[int, Path]:
    """Each sample's entry file, found by reading the label back from it."""
    found = {}
    for path in entry_files(disk):
        sample = unpack(bytearray(path.read_bytes()), {"none": Raw()}).sample
        found[int(sample[1])] = path
    return found


@pytest.fixture
def umask() -> Iterator[None]:
    """The usual umask (022), whatever the test runner's is."""
    old = os.umask(0o022)
    yield
    os.umask(old)


# ---------------------------------------------------------------------- writes that fail


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_file_system_caches_what_fits_and_delivers_every_sample(
    tmp_path: Path, workers: int
) -> None:
    """A 2 MiB file system under a 100 MB budget: the writes past its end are samples not
    cached, never samples lost, and the ledger counts only what is there."""
    with mounted_tmpfs(tmp_path / "small", "2m") as disk:
        _, stats = load(cache_of(disk, disk_bytes="100MB"), workers, n=48, size=100_000)
        counts = stats["counts"]
        assert counts["writes"] > 0 and counts["not_admitted"] > 0
        assert counts["hits"] == counts["writes"]  # what was written is read back
        on_disk = entry_files(disk)
        assert stats["entries"]["disk"] == len(on_disk) == counts["writes"]
        assert stats["held_bytes"]["disk"] == sum(p.stat().st_size for p in on_disk)
        assert not list(disk.rglob(".tmp-*"))  # no write left half a file behind


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cache_whose_folders_cannot_be_written_delivers_every_sample(
    tmp_path: Path, workers: int
) -> None:
    """The budget has room but every write fails (each folder of entries is replaced by a
    plain file once the loader has opened the cache): nothing is cached, nothing is lost."""
    dataset = Rows()
    with drapps.Loader(dataset, batch_size=4, num_workers=workers, cache=cache_of(tmp_path)) as ld:
        for folder in (tmp_path / "drapps-cache").iterdir():
            if folder.is_dir():
                folder.rmdir()
                folder.write_bytes(b"")
        for _ in range(2):
            assert_every_sample_once(list(ld), dataset.n)
        stats = ld.stats().cache
    assert stats is not None
    assert stats["counts"]["writes"] == 0 and stats["counts"]["not_admitted"] == 2 * dataset.n
    assert stats["entries"]["disk"] == 0 and stats["held_bytes"]["disk"] == 0


class _FailingReplace:
    """``os`` as the tier sees it, with every rename failing with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def replace(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO])
def test_a_write_that_fails_is_refused_rolled_back_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    tier = DirectoryTier(tmp_path / "tier", 10**6, "disk").open()
    monkeypatch.setattr(tier_module, "os", _FailingReplace(code))
    keys = [f"{k:02x}" + "0" * 38 for k in range(3)]
    with caplog.at_level(logging.WARNING, logger="drapps.cache.tier"):
        assert [tier.write(key, b"x" * 100) for key in keys] == [False] * 3
    assert tier.held() == (0, 0) and tier.free() == 10**6
    assert [p.name for p in (tmp_path / "tier").glob("??/*")] == []
    warned = [r for r in caplog.records if r.name == "drapps.cache.tier"]
    assert len(warned) == 1 and os.strerror(code) in warned[0].getMessage()
    tier.close()


# ------------------------------------------------------------ things planted where entries go

PLANTED = ("directory", "sparse 1 TB", "fifo", "link to another entry", "link outside")


def plant(kind: str, path: Path, other: Path, victim: Path) -> None:
    """Put ``kind`` at ``path`` in place of the entry there."""
    path.unlink()
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"not an entry")
    elif kind == "sparse 1 TB":
        with path.open("wb") as file:
            file.truncate(1 << 40)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to another entry":
        path.symlink_to(other)  # a whole entry, with a good checksum, of another sample
    elif kind == "link outside":
        path.symlink_to(victim)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_things_planted_in_place_of_entries_are_made_again_and_nothing_hangs(
    tmp_path: Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tmp_path / "disk"
    cache = cache_of(disk, disk_bytes="16MB")
    load(cache, workers=0, epochs=1)  # real entries, at the paths of real keys
    entries = entries_by_index(disk)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for index, kind in enumerate(PLANTED):
        plant(kind, entries[index], entries[len(PLANTED) + 1], victim)
    with caplog.at_level(logging.WARNING, logger="drapps.cache"):
        _, stats = load(cache, workers)
    counts = stats["counts"]
    assert counts["corrupt"] >= len(PLANTED)
    assert counts["hits"] >= 2 * Rows().n - 2 * len(PLANTED)
    assert victim.read_bytes() == b"precious"
    assert entries[0].is_dir()  # a directory cannot be dropped: it is left, and skipped
    for index in range(1, len(PLANTED)):  # the rest were dropped and written again
        assert stat.S_ISREG(entries[index].lstat().st_mode)
        assert entries[index].stat().st_size < 10_000
    if workers == 0:
        refused = [r for r in caplog.records if "not an entry" in r.getMessage()]
        assert len(refused) == 1, [r.getMessage() for r in caplog.records]


@ROOT_ONLY
def test_an_entry_of_another_user_is_not_read_from_a_private_cache(tmp_path: Path) -> None:
    cache = cache_of(tmp_path)
    load(cache, workers=0, epochs=1)
    entries = entries_by_index(tmp_path)
    for path in entries.values():
        os.chown(path, OTHER_UID, OTHER_UID)
    _, stats = load(cache, workers=0, epochs=1)
    assert stats["counts"]["hits"] == 0 and stats["counts"]["corrupt"] == len(entries)
    assert all(path.stat().st_uid == os.getuid() for path in entries.values())  # made again


# ------------------------------------------------------------------ who may read and write it


def test_a_ledger_link_is_refused_and_what_it_points_at_is_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 4)
    folder = tmp_path / "disk" / "drapps-cache"
    folder.mkdir(parents=True, mode=0o700)
    (folder / ".ledger").symlink_to(victim)
    with pytest.raises(PermissionError, match=r"drapps-cache/\.ledger is a symbolic link"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path / "disk"))
    assert victim.read_bytes() == b"precious" * 4


@ROOT_ONLY
def test_a_ledger_of_another_user_is_refused(tmp_path: Path) -> None:
    load(cache_of(tmp_path), workers=0, epochs=1)
    ledger = tmp_path / "drapps-cache" / ".ledger"
    os.chown(ledger, OTHER_UID, OTHER_UID)
    with pytest.raises(PermissionError, match=rf"\.ledger belongs to user {OTHER_UID}"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_private_cache_is_made_readable_by_its_user_alone(
    tmp_path: Path, umask: None, workers: int
) -> None:
    load(cache_of(tmp_path), workers, epochs=1)
    root = tmp_path / "drapps-cache"
    folders = [p for p in root.iterdir() if p.is_dir()]
    assert len(folders) == 256
    assert {stat.S_IMODE(p.stat().st_mode) for p in [root, *folders]} == {0o700}
    files = [*entry_files(tmp_path), root / ".ledger"]
    assert len(files) == Rows().n + 1
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}


def test_an_older_world_readable_cache_is_made_private(tmp_path: Path, umask: None) -> None:
    root = tmp_path / "drapps-cache"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    load(cache_of(tmp_path), workers=0, epochs=1)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("mode", "owner", "wrong"),
    [
        (0o777, None, "can be written by other users"),
        (0o770, None, "can be written by other users"),
        (0o700, OTHER_UID, f"belongs to user {OTHER_UID}"),
    ],
)
def test_a_private_cache_others_can_write_into_is_refused(
    tmp_path: Path, mode: int, owner: int | None, wrong: str
) -> None:
    if owner is not None and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    root = tmp_path / "drapps-cache"
    root.mkdir()
    os.chmod(root, mode)
    if owner is not None:
        os.chown(root, owner, owner)
    with pytest.raises(PermissionError, match=f"{root}.* {wrong}"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path))
    assert list(root.iterdir()) == []  # nothing made in it


def test_a_folder_of_entries_others_can_write_into_is_refused(tmp_path: Path) -> None:
    load(cache_of(tmp_path), workers=0, epochs=1)
    folder = tmp_path / "drapps-cache" / "a7"
    os.chmod(folder, 0o777)
    with pytest.raises(PermissionError, match=f"{folder} can be written by other users"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path))
    folder.rmdir()
    folder.symlink_to(tmp_path)
    with pytest.raises(PermissionError, match=f"{folder} is not a directory"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path))


def test_a_group_shared_cache_gives_group_modes_and_reads_the_groups_entries(
    tmp_path: Path, umask: None
) -> None:
    shared = cache_of(tmp_path, shared_group=True)
    load(shared, workers=2, epochs=1)
    root = tmp_path / "drapps-cache"
    folders = [p for p in root.iterdir() if p.is_dir()]
    assert {stat.S_IMODE(p.stat().st_mode) for p in [root, *folders]} == {0o2770}
    files = [*entry_files(tmp_path), root / ".ledger"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o660}
    if os.geteuid() == 0:  # entries written by another member of the group are read
        for path in entry_files(tmp_path):
            os.chown(path, OTHER_UID, -1)
    _, stats = load(shared, workers=0, epochs=1)
    assert stats["counts"]["hits"] == Rows().n and stats["counts"]["corrupt"] == 0
    with pytest.raises(PermissionError, match="can be written by other users"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=cache_of(tmp_path))
    os.chmod(root, 0o2777)
    with pytest.raises(PermissionError, match="can be written by every user"):
        drapps.Loader(Rows(), batch_size=4, num_workers=0, cache=shared)


def test_shared_group_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shared_group must be a bool, got 'yes'"):
        Cache(disk=tmp_path, shared_group="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shared_group applies to the disk tier"):
        Cache(shared_group=True)


def test_an_entry_larger_than_the_budget_is_a_miss_and_left_alone(tmp_path: Path) -> None:
    """An entry made under a larger budget is not read (nor allocated), and not dropped."""
    DirectoryTier(tmp_path, 10**6, "disk").open().close()
    tier = DirectoryTier(tmp_path, 100, "disk").open()
    key = "ab" + "0" * 38
    Path(tier.path(key)).write_bytes(b"x" * 200)
    assert tier.read(key) is None and Path(tier.path(key)).exists()
    assert tier.held() == (0, 0)
    tier.close()
