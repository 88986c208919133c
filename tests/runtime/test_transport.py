import atexit
import contextlib
import errno
import gc
import os
import signal
import threading
import time
from collections import namedtuple
from collections.abc import Iterator
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import mounted_tmpfs, slab_fds, slab_maps

from drapps.runtime import recycling, slabs, transport
from drapps.runtime.admission import Admission
from drapps.runtime.pool import Worker
from drapps.runtime.slabs import SharedMemoryFullError
from drapps.runtime.transport import pack, pack_local, receive_message, send_message, unpack

Pair = namedtuple("Pair", "image label")


@pytest.fixture()
def channel() -> Iterator[tuple[Connection, Connection]]:
    """Both ends of a worker's result socket."""
    receiver, sender = Pipe(duplex=True)
    yield sender, receiver
    sender.close()
    receiver.close()


def cross(packed: transport.Packed, channel: tuple[Connection, Connection], writer=None):  # type: ignore[no-untyped-def]
    """``packed`` sent over the socket as a worker sends it; what the receiver gets."""
    sender, receiver = channel
    send_message(sender, ("ok", packed), writer)
    return receive_message(receiver)[1]


def test_round_trip_keeps_structure_dtypes_and_values(channel) -> None:  # type: ignore[no-untyped-def]
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
    packed = pack(batch)
    assert packed.fd is not None and len(packed.skeleton) < 2048
    out = unpack(cross(packed, channel))
    assert slab_fds() == [] and len(slab_maps()) == 1  # mapped, with no descriptor held
    for key in ("f32", "bf16", "bool", "scalar", "empty", "strided"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key]), key
    np.testing.assert_array_equal(out["numpy"], batch["numpy"])
    assert isinstance(out["pair"], Pair) and out["pair"].label == 7
    assert torch.equal(out["pair"].image, batch["pair"].image)
    assert out["names"] == ["a", "b"]
    del out
    gc.collect()
    assert slab_maps() == []


def test_zero_size_tensors_need_no_slab(channel) -> None:  # type: ignore[no-untyped-def]
    packed = pack([torch.empty(0), torch.empty(0, 3, dtype=torch.int64), np.empty(0)])
    assert packed.fd is None
    out = unpack(cross(packed, channel))
    assert out[0].shape == (0,) and out[1].shape == (0, 3) and out[1].dtype == torch.int64
    assert out[2].shape == (0,)


def test_a_masked_array_keeps_its_byte_order_mask_and_fill(channel) -> None:  # type: ignore[no-untyped-def]
    """NumPy's own pickling turns a masked '>i4' array into 'int32' (found by the differential
    campaigns: drapps' workers must give what DataLoader without workers gives)."""
    data = np.arange(6, dtype=">i4").reshape(2, 3)
    masked = np.ma.MaskedArray(data, mask=[[0, 1, 0], [0, 0, 1]], fill_value=7, hard_mask=True)
    plain = np.ma.MaskedArray(np.arange(3, dtype=">f4"))  # no mask at all
    out = unpack(cross(pack([masked, plain]), channel))
    assert out[0].dtype == np.dtype(">i4") and out[0].data.tolist() == data.tolist()
    assert out[0].mask.tolist() == masked.mask.tolist()
    assert out[0].fill_value == 7 and out[0].hardmask
    assert out[1].dtype == np.dtype(">f4") and out[1].mask is np.ma.nomask
    del out
    gc.collect()


def test_tensors_are_writable(channel) -> None:  # type: ignore[no-untyped-def]
    out = unpack(cross(pack(torch.zeros(1000)), channel))
    out += 1
    assert float(out.sum()) == 1000.0


def test_batch_without_arrays_needs_no_slab(channel) -> None:  # type: ignore[no-untyped-def]
    packed = pack({"labels": [1, 2], "text": "x"})
    assert packed.fd is None and unpack(cross(packed, channel)) == {"labels": [1, 2], "text": "x"}


def test_full_shared_memory_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(SharedMemoryFullError, match="memory_budget"):
        pack(torch.zeros(100))
    assert slab_fds() == []


@pytest.fixture()
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "shm", "1m") as mount:
        yield mount


def test_slabs_in_a_really_full_tmpfs_raise_shared_memory_full(tiny_tmpfs: Path) -> None:
    with pytest.raises(SharedMemoryFullError, match=r"ran out while writing a 4.0 MiB"):
        pack(torch.zeros(2**20), directory=str(tiny_tmpfs))
    assert os.listdir(tiny_tmpfs) == []  # a file slab is unlinked the moment it is made


def test_a_slab_lost_in_flight_is_an_eof(channel) -> None:  # type: ignore[no-untyped-def]
    sender, receiver = channel
    packed = pack(torch.zeros(10))
    sender.send(("ok", transport.replace(packed, fd=None)))  # the sender dies before the fd
    os.close(packed.fd)
    sender.close()
    with pytest.raises(EOFError):
        receive_message(receiver)


def test_a_released_slab_is_written_over_by_its_worker(channel) -> None:  # type: ignore[no-untyped-def]
    writer, recycler = slabs.SlabWriter(), recycling.SlabRecycler()
    try:
        first = pack({"x": torch.arange(4096)}, writer)
        assert first.fd is not None
        assert first.recycle and first.slab is not None
        got = cross(first, channel, writer)
        batch = unpack(got, release=recycler.releaser(0, got.slab))
        held = cross(pack({"x": torch.arange(4096) + 1}, writer), channel, writer)
        assert held.slab != first.slab
        assert recycler.drain() == {}  # nothing released while the batch lives
        del batch
        gc.collect()
        notices = recycler.drain()
        assert notices == {0: [(first.slab, True)]}
        writer.released(notices[0])
        reused_fd = writer._free[0]
        second = pack({"x": torch.arange(4096) * 2}, writer)
        assert second.fd == reused_fd  # the released slab, written over
        torch.testing.assert_close(
            unpack(cross(second, channel, writer))["x"], torch.arange(4096) * 2
        )
        torch.testing.assert_close(unpack(held)["x"], torch.arange(4096) + 1)
    finally:
        writer.close()
        recycler.close()
    gc.collect()
    assert slab_fds() == []


def test_the_writer_keeps_the_slabs_released_as_reusable_and_closes_the_rest() -> None:
    """Which released slabs are kept is the receiver's decision (it counts them in the
    memory budget): the writer keeps those it is told are reusable."""
    writer = slabs.SlabWriter(keep=2)
    packed = [pack([np.ones(1000)], writer) for _ in range(4)]
    assert writer.held() == 0  # kept only once sent
    for p in packed:
        assert p.fd is not None and p.slab is not None
        writer.sent(p.slab, p.fd)
    writer.released([(p.slab, True) for p in packed[:3]])  # type: ignore[misc]
    assert len(writer._free) == 3 and writer.held() == 4
    writer.released([(packed[3].slab, False)])  # type: ignore[list-item]
    assert writer.held() == 3  # not reusable (not kept by the receiver): closed
    writer.close()
    assert slab_fds() == []


def test_a_slab_mapped_across_a_fork_is_never_reused(channel) -> None:  # type: ignore[no-untyped-def]
    recycler = recycling.SlabRecycler()
    got = cross(pack(torch.arange(10)), channel)
    batch = unpack(got, release=recycler.releaser(0, 7))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    del batch
    gc.collect()
    assert recycler.drain() == {0: [(7, False)]}


def test_a_forked_child_that_drops_a_batch_releases_nothing(channel) -> None:  # type: ignore[no-untyped-def]
    recycler = recycling.SlabRecycler()
    seen: list[int] = []
    got = cross(pack(torch.arange(10)), channel)
    batch = unpack(got, on_release=seen.append, release=recycler.releaser(0, 1))
    reader, writer_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops its copy and reports what its finalizers did
        del batch
        gc.collect()
        os.write(writer_end, f"{len(seen)} {len(recycler.drain())}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(reader, 100) == b"0 0"
    os.close(reader)
    os.close(writer_end)
    assert batch.tolist() == list(range(10))


def test_a_forked_child_that_drops_a_thread_made_batch_counts_and_waits_on_nothing() -> None:
    """A batch made by a thread worker counts against the budget until it goes, under the
    budget's lock, which another thread may hold at a fork: the child that drops its copy
    and exits neither counts it nor waits on that lock (it would wait forever)."""
    lock, seen = threading.Lock(), []

    def released(nbytes: int) -> None:
        with lock:
            seen.append(nbytes)

    batch = unpack(pack_local(torch.arange(10)), on_release=released)
    reader, writer_end = os.pipe()
    with lock:  # held by "another thread" at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            del batch
            gc.collect()
            atexit._run_exitfuncs()
            os.write(writer_end, str(len(seen)).encode())
            os._exit(0)
    deadline = time.monotonic() + 30
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child waited on its parent's lock to drop a batch")
        time.sleep(0.01)
    assert os.read(reader, 100) == b"0"
    os.close(reader)
    os.close(writer_end)
    del batch
    gc.collect()
    assert seen == [80]  # here, the batch is counted out


def _collated(arena: slabs.SlabArena, images: list[torch.Tensor], labels: list[int]):  # type: ignore[no-untyped-def]
    """The batch torch's default collate makes of (image, label) pairs, stacked into ``arena``."""
    from torch.utils.data._utils.collate import collate

    return collate(list(zip(images, labels, strict=True)), collate_fn_map=arena.collate_map)


def test_a_batch_collated_into_its_slab_is_not_copied_again(
    channel, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    writer = slabs.SlabWriter()
    arena = slabs.SlabArena(writer)
    images = [torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8) for _ in range(8)]
    written: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: memoryview, offset: int) -> int:
        written.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    try:
        batch = _collated(arena, images, list(range(8)))
        assert arena.offset_of(batch[0]) == 0 and arena.offset_of(batch[1]) is None
        packed = pack(batch, writer, arena=arena)
        assert sum(written) == 8 * 8  # only the labels: the images are in the slab already
        assert arena.used == 0 and arena.hand_over() is None  # emptied for the next batch
        del batch
        out = unpack(cross(packed, channel, writer))
        torch.testing.assert_close(out[0], torch.stack(images), rtol=0, atol=0)
        assert out[1].tolist() == list(range(8))
    finally:
        writer.close()


def test_the_arena_grows_within_a_batch_and_keeps_what_it_holds(channel) -> None:  # type: ignore[no-untyped-def]
    arena = slabs.SlabArena()
    small = arena.empty((10,), torch.int64)
    assert small is not None
    small.copy_(torch.arange(10))
    big = arena.empty((3, 1000, 1000), torch.uint8)  # past the first mapping: maps again
    assert big is not None
    big.fill_(7)
    assert arena.offset_of(small) == 0 and arena.offset_of(big) == 128
    packed = pack({"small": small, "big": big, "other": torch.ones(5)}, arena=arena)
    del small, big
    out = unpack(cross(packed, channel))
    assert out["small"].tolist() == list(range(10))
    assert int(out["big"].sum()) == 7 * 3_000_000 and out["other"].tolist() == [1.0] * 5


def test_a_full_shared_memory_stacks_in_private_memory_instead(
    channel, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    writer = slabs.SlabWriter()
    arena = slabs.SlabArena(writer)
    try:
        images = [torch.full((4, 4), i, dtype=torch.uint8) for i in range(3)]
        batch = _collated(arena, images, [0, 1, 2])
        assert arena.offset_of(batch[0]) is None  # never a SIGBUS on a write to a full slab
        monkeypatch.undo()
        out = unpack(cross(pack(batch, writer, arena=arena), channel, writer))
        torch.testing.assert_close(out[0], torch.stack(images), rtol=0, atol=0)
    finally:
        writer.close()


def test_a_batch_that_fails_after_collating_gives_its_slab_back() -> None:
    writer = slabs.SlabWriter()
    arena = slabs.SlabArena(writer)
    try:
        batch = _collated(arena, [torch.zeros(100)], [0])
        with pytest.raises(Exception, match="pickle"):
            pack([batch, lambda: None], writer, arena=arena)  # a lambda cannot be pickled
        assert len(writer._free) == 1 and arena.used == 0
        again = _collated(arena, [torch.ones(100)], [1])
        assert arena.offset_of(again[0]) == 0
        arena.reset()
        assert len(writer._free) == 1  # the same slab, not a second one
    finally:
        writer.close()
    gc.collect()
    assert slab_fds() == []


def test_a_recycled_slab_stays_mapped_in_its_worker_and_never_shrinks_under_it(channel) -> None:  # type: ignore[no-untyped-def]
    writer = slabs.SlabWriter()
    arena = slabs.SlabArena(writer)
    try:
        mappings = []
        for round_ in range(4):
            images = [torch.full((3, 64, 64), round_, dtype=torch.uint8) for _ in range(4)]
            if round_ == 2:  # a batch a user's collate made: written, not collated in place
                batch = [torch.stack(images), torch.tensor([1])]
                packed = pack(batch, writer, arena=arena)
            else:
                batch = _collated(arena, images, [0, 1, 2, 3])
                packed = pack(batch, writer, arena=arena)
                mappings.append(writer._mapped[packed.fd][1])
            del batch
            got = cross(packed, channel, writer)
            out = unpack(got)
            assert int(out[0].float().mean()) == round_  # every batch right, whatever came before
            del out
            gc.collect()
            writer.released([(got.slab, True)])
        assert mappings[0] is mappings[1] is mappings[2]  # one slab, mapped once
        assert len(writer._mapped) == 1 and writer.held() == 1
    finally:
        writer.close()
    assert writer._mapped == {}
    del mappings
    gc.collect()
    assert slab_fds() == [] and slab_maps() == []


def _worker_round(writer, recycler, channel, value: int, rows: int = 64):  # type: ignore[no-untyped-def]
    """One batch from a worker's writer through the socket, unpacked as the dispatcher does."""
    packed = pack({"x": torch.full((rows, 1024), value, dtype=torch.int32)}, writer)
    got = cross(packed, channel, writer)
    release = recycler.releaser(0, got.slab)
    return unpack(got, release=release, mappings=recycler.mappings, sender=0)


def test_the_training_process_reads_a_recycled_slab_through_the_mapping_it_had(channel) -> None:  # type: ignore[no-untyped-def]
    writer, recycler = slabs.SlabWriter(), recycling.SlabRecycler()
    try:
        first = _worker_round(writer, recycler, channel, 1)
        address = first["x"].data_ptr()
        del first
        gc.collect()
        assert len(recycler.mappings) == 1 and len(slab_maps()) == 1  # kept, not unmapped
        writer.released(recycler.drain()[0])
        second = _worker_round(writer, recycler, channel, 2)  # the same slab, written over
        assert second["x"].data_ptr() == address and len(recycler.mappings) == 0
        assert int(second["x"].sum()) == 2 * 64 * 1024  # the worker's new bytes, not the old
        del second
        gc.collect()
        writer.released(recycler.drain()[0])
    finally:
        writer.close()
        recycler.close()
    assert len(recycler.mappings) == 0
    gc.collect()
    assert slab_maps() == [] and slab_fds() == []


def _rows(writer, recycler, channel, rows: int):  # type: ignore[no-untyped-def]
    """A batch of ``rows`` rows, each holding ``rows`` (a part of that many samples)."""
    return _worker_round(writer, recycler, channel, rows, rows=rows)


@contextlib.contextmanager
def _recycling(**writer_options: Any) -> Iterator[tuple[slabs.SlabWriter, Any]]:
    """A worker's writer and the training process's recycler, closed on the way out; then
    no slab is left mapped or open."""
    writer, recycler = slabs.SlabWriter(**writer_options), recycling.SlabRecycler()
    try:
        yield writer, recycler
    finally:
        writer.close()
        recycler.close()
    gc.collect()
    assert slab_maps() == [] and slab_fds() == []


def test_a_recycled_slab_only_grows_and_the_receiver_maps_all_of_it(channel) -> None:  # type: ignore[no-untyped-def]
    # Parts of batches cut among workers differ in size. A slab keeps the length of the largest
    # it held, and the training process maps the whole file, so the next larger part written
    # into it is read through the mapping it has.
    big_bytes = 64 * 1024 * 4
    with _recycling() as (writer, recycler):
        big = _rows(writer, recycler, channel, 64)
        del big
        gc.collect()
        recycler.mappings.forget(tuple(recycler.mappings._held))  # as if pushed out
        writer.released(recycler.drain()[0])
        small = _rows(writer, recycler, channel, 16)  # into the big slab, mapped afresh
        assert list(writer._length.values()) == [big_bytes]  # not shrunk to the part
        assert small["x"].shape == (16, 1024) and int(small["x"].sum()) == 16 * 16 * 1024
        address = small["x"].data_ptr()
        del small
        gc.collect()
        assert [size for _, size, _ in recycler.mappings._held.values()] == [big_bytes]
        writer.released(recycler.drain()[0])
        again = _rows(writer, recycler, channel, 64)
        assert again["x"].data_ptr() == address and int(again["x"].sum()) == 64 * 64 * 1024
        assert len(recycler.mappings) == 0  # taken, not mapped again
        del again
        gc.collect()


def test_a_worker_keeps_small_released_slabs_by_bytes_and_the_receiver_forgets_closed_ones(
    channel,
) -> None:  # type: ignore[no-untyped-def]
    with _recycling(keep=2) as (writer, recycler):
        whole = _rows(writer, recycler, channel, 64)  # the largest slab: 2 of it are kept
        parts = [_rows(writer, recycler, channel, 16) for _ in range(10)]
        del whole, parts
        gc.collect()
        # 2 x 64 rows of room: the largest slab and four of the small ones; the rest let go.
        assert len(recycler.mappings) == 5
        writer.released(recycler.drain()[0])
        assert len(writer._free) == 5 and writer.held() == 5  # the other 6 closed
        held = recycler.mappings.held_bytes()  # the 6 let go count until closed
        nxt = _rows(writer, recycler, channel, 16)  # carries the closed slabs' files
        assert len(recycler.mappings) == 4  # 1 mapping taken back
        assert recycler.mappings.held_bytes() < held - 6 * 16 * 1024 * 4 + 1  # 6 forgotten
        assert len(slab_maps()) == 5
        del nxt
        gc.collect()


def test_a_dropped_reply_still_has_the_receiver_forget_the_slabs_its_worker_closed(
    channel,
) -> None:  # type: ignore[no-untyped-def]
    # The slabs a worker closed since its last batch are named only by its next reply. A reply
    # the dispatcher drops unread (a stale epoch's, a duplicate) must still have the training
    # process forget them: else they stay counted against the memory budget, and fewer
    # batches are made ahead, until the worker exits.
    admission = Admission(budget=1 << 30)
    recycler = admission.recycler
    writer = slabs.SlabWriter(keep=2)
    try:
        whole = _rows(writer, recycler, channel, 64)
        parts = [_rows(writer, recycler, channel, 16) for _ in range(10)]
        del whole, parts
        gc.collect()
        writer.released(recycler.drain()[0])  # 6 let go: the worker closes them
        held = recycler.mappings.held_bytes()
        batch = {"x": torch.zeros(16, 1024, dtype=torch.int32)}
        stale = cross(pack(batch, writer), channel, writer)
        assert len(stale.closed) == 6
        admission.drop(Worker(0), stale)
        assert recycler.mappings.held_bytes() == held - 6 * 16 * 1024 * 4
        writer.released(recycler.drain()[0])  # the dropped reply's slab is free again
        assert len(writer._free) == 5
    finally:
        writer.close()
        recycler.close()
    gc.collect()
    assert slab_maps() == [] and slab_fds() == []


@pytest.mark.parametrize("room", [None, 0], ids=["room", "no room"])
def test_a_slab_its_worker_closed_while_the_loop_held_its_batch_is_not_kept_or_awaited(
    channel, room: int | None
) -> None:  # type: ignore[no-untyped-def]
    # A worker remembers only so many sent slabs: past that it closes the oldest and names it
    # with its next batch, while the loop may still hold the batch. Once that batch goes, a
    # kept mapping would hold the pages and a place in the worker's share, and a slab not
    # kept would be counted against the budget until a close already told: both until the
    # worker exits, for a slab never sent again.
    with _recycling(memory=1) as (writer, recycler):
        if room is not None:
            recycler.mappings.room = lambda: room
        batches = [_worker_round(writer, recycler, channel, value) for value in (1, 2, 3)]
        assert writer.held() == 1  # the first two closed; the first named by the third batch
        first = batches.pop(0)
        assert int(first["x"].sum()) == 64 * 1024  # a batch the loop holds is untouched
        del first
        gc.collect()
        assert len(recycler.mappings) == 0 and recycler.mappings.held_bytes() == 0
        assert len(slab_maps()) == 2
        writer.released(recycler.drain()[0])
        assert writer.held() == 1
        del batches
        gc.collect()


def test_the_slabs_of_a_worker_that_exited_are_unmapped_and_not_kept(channel) -> None:  # type: ignore[no-untyped-def]
    # A worker's slab files close with it: a mapping the training process kept for the slab's
    # next batch would then be all that holds the pages, for a batch that never comes.
    with _recycling() as (writer, recycler):
        released = [_worker_round(writer, recycler, channel, 1)]
        held = _worker_round(writer, recycler, channel, 2)  # still in the loop's hands
        del released
        gc.collect()
        assert len(recycler.mappings) == 1 and len(slab_maps()) == 2
        writer.close()  # the worker exits
        recycler.mappings.gone(0)
        assert len(recycler.mappings) == 0 and len(slab_maps()) == 1
        assert int(held["x"].sum()) == 2 * 64 * 1024  # a batch the loop holds is untouched
        del held
        gc.collect()
        assert len(recycler.mappings) == 0 and slab_maps() == []  # released, not kept
        recycler.drain()


def test_kept_slabs_are_bounded_by_the_budget_and_a_closed_recycler_keeps_none(channel) -> None:  # type: ignore[no-untyped-def]
    """A slab kept for reuse holds its pages: it is kept only while the budget has room,
    and counted until its worker closes it once it is not."""
    slab = 64 * 1024 * 4
    writer, recycler = slabs.SlabWriter(), recycling.SlabRecycler()
    recycler.mappings.keep = 8  # the worker's share would take them all
    recycler.mappings.room = lambda: 2 * slab - recycler.mappings.held_bytes_unlocked()
    try:
        batches = [_worker_round(writer, recycler, channel, i) for i in range(4)]
        del batches
        gc.collect()
        assert len(recycler.mappings) == 2 and len(slab_maps()) == 2  # two let go
        assert recycler.mappings.held_bytes() == 4 * slab  # until their worker closes them
        writer.released(recycler.drain()[0])
        assert len(writer._free) == 2
        held = _worker_round(writer, recycler, channel, 9)  # into a kept slab
        recycler.close()
        assert len(slab_maps()) == 1  # only the batch still held
        del held
        gc.collect()
        assert slab_maps() == []  # released after close: unmapped, not kept
    finally:
        writer.close()
        recycler.close()


def test_a_batch_freed_by_a_collection_inside_the_receivers_bookkeeping_waits_for_nothing(
    channel,
) -> None:  # type: ignore[no-untyped-def]
    # A batch in a reference cycle is freed by whichever allocation starts a collection, in
    # any thread: one inside the receiver's own bookkeeping too (here, as it weighs keeping
    # another released slab). Its slab's finalizer must not wait for the lock its own
    # thread holds: the thread hung there for good.
    with _recycling() as (writer, recycler):
        cyclic = _worker_round(writer, recycler, channel, 1)
        plain = _worker_round(writer, recycler, channel, 2)
        room = recycler.mappings.room

        def collecting_room() -> int:
            gc.collect()  # what any allocation here may start
            return room() if room is not None else 1 << 40

        recycler.mappings.room = collecting_room
        gc.disable()  # only the collection above may free the cycle
        try:
            cyclic["self"] = cyclic
            del cyclic
            held = [plain]
            del plain
            dropped = threading.Thread(target=held.clear, daemon=True)  # drops the batch
            dropped.start()
            dropped.join(timeout=60)
            assert not dropped.is_alive(), "the finalizer waited for its own thread's lock"
        finally:
            gc.enable()
        assert len(recycler.mappings) == 2 and len(slab_maps()) == 2  # both kept for reuse
        notices = recycler.drain()[0]
        assert sorted(notices) == [(1, True), (2, True)]
        writer.released(notices)


def test_a_slab_mapped_across_a_fork_is_not_kept_mapped(channel) -> None:  # type: ignore[no-untyped-def]
    writer, recycler = slabs.SlabWriter(), recycling.SlabRecycler()
    try:
        batch = _worker_round(writer, recycler, channel, 3)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if len(recycler.mappings) == 0 else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        del batch
        gc.collect()
        assert len(recycler.mappings) == 0 and slab_maps() == []
        assert recycler.drain() == {0: [(1, False)]}
    finally:
        writer.close()
        recycler.close()


def _layouts() -> dict[str, Any]:
    base = torch.arange(20.0)
    return {
        "transposed": torch.arange(12.0).reshape(3, 4).t(),
        "expanded": torch.arange(3.0).expand(4, 3),
        "offset": base[5:9],
        "stepped": base[::3],
        "zero_size": torch.empty(0, 3).t(),
        "scalar": torch.tensor(3.0),
        "view_of_large": torch.arange(10_000.0)[5:7],
        "bfloat16": torch.arange(6.0).to(torch.bfloat16).reshape(2, 3).t(),
        "float8": torch.arange(4.0).to(torch.float8_e4m3fn),
        "complex": torch.arange(4.0).to(torch.complex64) * 1j,
        "bool": torch.tensor([True, False]).expand(3, 2),
    }


def test_tensors_keep_their_strides_and_values(channel: tuple[Connection, Connection]) -> None:
    """As DataLoader's workers send them: a transposed or expanded tensor arrives with its
    strides (it was made contiguous, and stride-0 views grew to full size)."""
    sent = _layouts()
    got = unpack(cross(pack(sent), channel))
    for name, tensor in sent.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert got[name].stride() == tensor.stride(), name
        assert _bits(got[name]) == _bits(tensor), name  # float8 and bfloat16 have no ==


def _bits(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().reshape(-1).view(torch.uint8)) if tensor.numel() else b""


def test_views_of_one_storage_still_share_it(channel: tuple[Connection, Connection]) -> None:
    base = torch.arange(20.0)
    got = unpack(cross(pack((base[:10], base[5:15])), channel))
    got[0][7] = -1.0  # element 7 of the storage: element 2 of the second view
    assert got[1][2] == -1.0


def test_conjugate_and_negative_views_arrive_as_their_values(
    channel: tuple[Connection, Connection],
) -> None:
    """The conjugate bit is a flag on the view, not in the bytes (torch's own reductions
    drop it, and DataLoader's workers then deliver the unconjugated numbers)."""
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    sent = {"conj": z.conj(), "neg": z.conj().imag}
    got = unpack(cross(pack(sent), channel))
    assert torch.equal(got["conj"], z.conj().resolve_conj())
    assert torch.equal(got["neg"], torch.tensor([-2.0, 4.0]))


def test_arrays_keep_structured_dtypes_and_fortran_order(
    channel: tuple[Connection, Connection],
) -> None:
    """A structured array's dtype string is ``|V12``: it arrived as raw bytes."""
    record = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    record["a"], record["b"] = [1, 2, 3], [0.5, 1.5, 2.5]
    fortran = np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3))
    sent = {
        "record": record,
        "fortran": fortran,
        "dates": np.array(["2026-01-01", "2026-11-27"], dtype="datetime64[D]"),
        "text": np.array(["ab", "cde"]),
        "readonly": np.frombuffer(b"\x01\x02\x03\x04", dtype=np.uint8),
    }
    got = unpack(cross(pack(sent), channel))
    for name, array in sent.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].flags.f_contiguous == array.flags.f_contiguous, name
        np.testing.assert_array_equal(got[name], array)
    assert got["record"].dtype.names == ("a", "b")


def test_a_quantized_tensor_is_pickled_not_read_as_bytes(
    channel: tuple[Connection, Connection],
) -> None:
    """Its bytes are not its values (scale and zero point live beside them); read as raw
    bytes it crashed the receiving process."""
    q = torch.quantize_per_tensor(torch.tensor([0.1, 0.5, 0.9]), 0.1, 0, torch.quint8)
    got = unpack(cross(pack({"q": q}), channel))["q"]
    assert got.is_quantized and got.q_scale() == q.q_scale()
    assert torch.equal(got.dequantize(), q.dequantize())


def test_nested_tensors_are_not_stacked_into_a_slab() -> None:
    """The arena read a nested tensor's sizes ('NestedTensorImpl doesn't support sizes')
    before torch's own collate could refuse it in DataLoader's words."""
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    assert not slabs.uniform_cpu_tensors([nested, nested])
    arena = slabs.SlabArena()
    try:
        with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently"):
            arena._stack([nested, nested])
    finally:
        arena.reset()


def test_a_bare_storage_crosses_and_still_backs_the_tensor_beside_it(
    channel: tuple[Connection, Connection],
) -> None:
    """torch's own pickling of an ``UntypedStorage`` does not load back; DataLoader's workers
    share it. It crosses as a tensor's bytes do, once for a tensor over it too."""
    tensor = torch.arange(6.0)
    got_storage, got_view = unpack(cross(pack((tensor.untyped_storage(), tensor[2:])), channel))
    assert type(got_storage) is torch.UntypedStorage
    assert bytes(got_storage) == bytes(tensor.untyped_storage())
    assert got_view.untyped_storage().data_ptr() == got_storage.data_ptr()
    assert torch.equal(got_view, tensor[2:])
    empty = unpack(cross(pack(torch.UntypedStorage(0)), channel))
    assert type(empty) is torch.UntypedStorage and empty.nbytes() == 0
    assert bytes(transport.owned([tensor.untyped_storage()])[0]) == bytes(tensor.untyped_storage())


class _Unbuildable:
    """Pickles, but cannot be unpickled: ``__setstate__`` raises."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise LookupError(f"cannot rebuild {state['value']}")


def test_a_batch_that_cannot_be_rebuilt_says_why_and_gives_its_slab_back(
    channel: tuple[Connection, Connection],
) -> None:
    released: list[bool] = []
    packed = cross(pack((torch.arange(4096), _Unbuildable(3))), channel)
    with pytest.raises(transport.RebuildError, match="LookupError: cannot rebuild 3") as caught:
        unpack(packed, release=released.append)
    assert isinstance(caught.value.error, LookupError)
    del caught
    gc.collect()
    assert released == [True]  # nothing holds the slab: it goes back to be written again
