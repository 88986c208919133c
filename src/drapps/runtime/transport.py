"""Transport: a batch pickled with its array bytes out of band, and the descriptor passing.

A worker pickles the collated batch with a ``persistent_id`` hook that pulls every dense CPU
tensor and NumPy array out of the pickle: their bytes are written (one ``pwrite`` each, 64-byte
aligned) into a slab, an anonymous shared-memory file (:mod:`drapps.runtime.slabs`), and only a
small skeleton (structure, dtypes, shapes, offsets, and any non-array leaves) goes through the
worker's socket (:func:`pack`). The slab's descriptor follows the skeleton over the same Unix
socket (``SCM_RIGHTS``, :func:`send_message` / :func:`receive_message`); the receiving process
maps it, closes the descriptor, and rebuilds the batch with zero-copy tensors over the mapping
(:func:`unpack`), whose release it hands to :mod:`drapps.runtime.recycling`. A batch collated
into its slab (:class:`~drapps.runtime.slabs.SlabArena`) is only noted where it lies; anything
else in it (labels, a user collate's output) is written as above.
"""

from __future__ import annotations

import ctypes
import errno
import io
import math
import os
import pickle
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.ma  # else imported at the first np.ma, in whichever thread: here, before any fork
import torch

from drapps.runtime.errors import fd_limit_error
from drapps.runtime.parts import in_owner, on_free, tensor_bytes
from drapps.runtime.recycling import ReceivedMappings, fork_count, release_slab, retire_slab
from drapps.runtime.slabs import (
    SlabArena,
    SlabWriter,
    aligned,
    create_slab,
    map_slab,
    shared_memory_full_error,
)


class RebuildError(Exception):
    """A batch whose bytes arrived but which could not be rebuilt in this process: unpickling
    one of its objects failed here (a ``__setstate__`` that raises, a type whose pickling
    does not round-trip). ``error`` is that failure; the slab was mapped, and is released as
    the batch's would be."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


@dataclass(frozen=True)
class Packed:
    """A batch as it crosses processes: the pickled skeleton and where its bytes lie."""

    skeleton: bytes
    """Pickle of the batch with arrays replaced by references into the slab."""
    nbytes: int
    """Size of the slab (or of ``buffer``)."""
    slab: int | None = None
    """The sender's id of the slab holding the array bytes, whose descriptor follows the
    message on the socket (:func:`send_message`); None when the batch has no array bytes or
    they travel in ``buffer``."""
    buffer: Any = None
    """The array bytes when they travel by another route than a slab: ``(offset, uint8
    array)`` pairs that Ray's object store carries (see :func:`pack_buffer`); None otherwise."""
    recycle: bool = False
    """The sender takes the slab back once the receiver releases it (see :class:`SlabWriter`)."""
    fd: int | None = None
    """The slab's descriptor in this process: the sender's after :func:`pack`, the receiver's
    after :func:`receive_message`. Never pickled (descriptors cross as ``SCM_RIGHTS``)."""
    closed: tuple[tuple[int, int], ...] = ()
    """Files (device, inode) of the slabs the sender closed since its last batch: the
    receiver lets go of the mappings it kept of them (:meth:`ReceivedMappings.forget`), so
    their pages are freed now rather than when newer mappings push them out."""
    local: tuple[Any] | None = None
    """The batch itself, made by a thread of this process (:func:`pack_local`): handed over
    as it is, with no copy; None for a batch from another process."""


class _SlabPickler(pickle.Pickler):
    """Pickles a batch with its tensors' and arrays' bytes placed in a slab.

    A tensor keeps its strides, as DataLoader's does: its bytes are placed as they lie in
    its storage, the whole storage (once, so views of one storage still share memory after
    the trip) when it is at most :data:`_WHOLE_STORAGE` times what the view spans, else only
    the span. Tensors whose bytes do not say what they hold (quantized, sparse, nested,
    tensor subclasses) are pickled the ordinary way; conjugate and negative views are
    resolved first, so their values arrive, not their unconjugated storage.
    """

    def __init__(self, file: io.BytesIO, arena: SlabArena | None = None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.buffers: list[tuple[int, memoryview]] = []
        self.arena = arena
        self.nbytes = arena.used if arena is not None else 0
        self._storages: dict[tuple[int, int], int] = {}  # (address, bytes) -> slab offset

    def _place(self, raw: np.ndarray) -> int:
        offset = self.nbytes
        if raw.nbytes:
            self.buffers.append((offset, memoryview(raw).cast("B")))  # type: ignore[arg-type]
        self.nbytes = aligned(offset + raw.nbytes)
        return offset

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor:
            return self._tensor_id(obj)
        if type(obj) is torch.UntypedStorage and obj.device.type == "cpu":
            # torch's own pickling of a bare storage does not load back (it asks the type
            # for a dtype); DataLoader's workers share it. Its bytes go as a tensor's do,
            # once, so a tensor over it in the same batch still shares it after the trip.
            return ("u", self._storage_offset(obj), obj.nbytes())
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            # Fortran order is kept, as pickling keeps it; any other layout arrives C-ordered.
            order = "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
            raw = np.ravel(obj, order=order).view(np.uint8)  # type: ignore[call-overload]
            # The dtype itself, not its string: a structured dtype's string names no fields.
            return ("a", self._place(raw), obj.dtype, obj.shape, order)
        return None

    def reducer_override(self, obj: Any) -> Any:
        # NumPy's own pickling of a masked array drops a non-native byte order (a '>i4'
        # array arrives 'int32'): its data and mask go as arrays, which keep their dtypes.
        if type(obj) is np.ma.MaskedArray and obj.baseclass is np.ndarray:
            masked: Any = obj  # its mask (or nomask) and fill value as set, not as defaulted
            return _masked_array, (obj.data, masked._mask, masked._fill_value, obj.hardmask)
        return NotImplemented

    def _tensor_id(self, obj: torch.Tensor) -> Any:
        if not _bytes_say_all(obj):
            return None  # pickled whole (or refused by pickling, naming the type)
        if obj.is_conj() or obj.is_neg():
            obj = obj.resolve_conj().resolve_neg()
        shape, stride = tuple(obj.shape), obj.stride()
        if self.arena is not None and (offset := self.arena.offset_of(obj)) is not None:
            return ("t", offset, obj.dtype, shape)  # collated in place
        if obj.numel() == 0:
            return ("s", 0, 0, obj.dtype, shape, stride, 0)
        itemsize = obj.element_size()
        span = _span(shape, stride)
        storage = obj.untyped_storage()
        whole = storage.nbytes()
        if whole <= _WHOLE_STORAGE * span * itemsize and whole % itemsize == 0:
            offset = self._storage_offset(storage)
            return ("s", offset, whole, obj.dtype, shape, stride, obj.storage_offset())
        # A small view of a large storage: only the bytes it spans.
        flat = obj.as_strided((span,), (1,))
        # A uint8 view reaches dtypes NumPy lacks (bfloat16) and keeps the copy a memcpy.
        raw = flat.view(torch.uint8).numpy()
        return ("s", self._place(raw), span * itemsize, obj.dtype, shape, stride, 0)

    def _storage_offset(self, storage: torch.UntypedStorage) -> int:
        """Where a whole storage's bytes lie in the slab (placed once per batch)."""
        key = (storage.data_ptr(), storage.nbytes())
        offset = self._storages.get(key)
        if offset is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            offset = self._storages[key] = self._place(raw)
        return offset


def _bytes_say_all(obj: torch.Tensor) -> bool:
    """Whether a tensor is its dense CPU bytes, dtype and strides, and nothing more (not
    sparse, quantized, nested or needing grad): what is copied as bytes rather than pickled."""
    return not (
        obj.layout != torch.strided
        or obj.device.type != "cpu"
        or obj.requires_grad
        or obj.is_quantized
        or obj.is_nested
    )


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a non-empty strided tensor's first to its last, both included."""
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))


_WHOLE_STORAGE = 4
"""A tensor's whole storage travels (shared by its other views in the batch) when it is at
most this many times the bytes the tensor spans; a smaller view sends only its span."""


def _masked_array(data: np.ndarray, mask: Any, fill: Any, hard: bool) -> np.ma.MaskedArray:
    """A masked array as :meth:`_SlabPickler.reducer_override` sent it."""
    return np.ma.MaskedArray(data, mask=mask, fill_value=fill, hard_mask=hard, copy=False)


class _SlabUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, slab: Any) -> None:
        super().__init__(file)
        self.slab = slab

    def persistent_load(self, pid: Any) -> Any:
        kind, offset = pid[0], pid[1]
        if kind == "s":
            return self._strided(*pid[1:])
        if kind == "u":
            nbytes = pid[2]
            if nbytes == 0:
                return torch.UntypedStorage(0)
            self._check(offset, nbytes)
            return torch.frombuffer(
                self.slab, dtype=torch.uint8, count=nbytes, offset=offset
            ).untyped_storage()
        if kind == "t":
            dtype, shape = pid[2], pid[3]
            count = math.prod(shape)
            if count == 0:  # no bytes in any slab: a batch of only these has none
                return torch.empty(shape, dtype=dtype)
            self._check(offset, count * dtype.itemsize)
            return torch.frombuffer(self.slab, dtype=dtype, count=count, offset=offset).view(shape)
        array_dtype, shape, order = np.dtype(pid[2]), pid[3], pid[4]
        count = math.prod(shape)
        if count == 0 or array_dtype.itemsize == 0:
            return np.empty(shape, dtype=array_dtype, order=order)
        self._check(offset, count * array_dtype.itemsize)
        flat = np.frombuffer(self.slab, dtype=array_dtype, count=count, offset=offset)
        return flat.reshape(shape, order=order)

    def _strided(
        self,
        offset: int,
        nbytes: int,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        storage_offset: int,
    ) -> torch.Tensor:
        if math.prod(shape) == 0:
            return torch.empty_strided(shape, stride, dtype=dtype)
        count = nbytes // dtype.itemsize
        last = storage_offset + _span(shape, stride) - 1
        if last >= count or storage_offset < 0 or min(stride, default=0) < 0:
            raise pickle.UnpicklingError(
                f"a tensor of shape {shape} and stride {stride} reaches past its {nbytes} bytes"
            )
        self._check(offset, nbytes)
        base = torch.frombuffer(self.slab, dtype=dtype, count=count, offset=offset)
        return base.as_strided(shape, stride, storage_offset)

    def _check(self, offset: int, nbytes: int) -> None:
        if self.slab is None:
            raise pickle.UnpicklingError("batch refers to shared memory but came without a slab")
        if offset < 0 or offset + nbytes > len(self.slab):
            raise pickle.UnpicklingError(
                f"batch refers to bytes {offset}..{offset + nbytes} of a {len(self.slab)}-byte slab"
            )


def pack(
    batch: Any,
    writer: SlabWriter | None = None,
    directory: str | None = None,
    arena: SlabArena | None = None,
) -> Packed:
    """Write ``batch``'s array bytes into a slab and return its skeleton, with the slab's
    descriptor in :attr:`Packed.fd` (:func:`send_message` sends it and then closes it, or
    hands it to ``writer``).

    Args:
        writer: the worker's :class:`SlabWriter`: a slab it was told is released is written
            over when there is one, and the batch is marked for recycling.
        directory: see :func:`create_slab`.
        arena: the slab the batch was collated into (:class:`SlabArena`): its tensors stay where
            they are, the rest is written after them, and the arena is emptied.

    Raises:
        SharedMemoryFullError: shared memory ran out while writing.
    """
    file = io.BytesIO()
    pickler = _SlabPickler(file, arena)
    try:
        pickler.dump(batch)
        held = arena.hand_over() if arena is not None else None
    except BaseException:
        if arena is not None:
            arena.reset()
        raise
    if held is None and not pickler.buffers:
        return Packed(file.getvalue(), 0)
    slab, fd = held if held is not None else writer.take() if writer is not None else (0, None)
    try:
        if fd is None:
            fd = create_slab(directory)
        if writer is not None:
            writer.fit(fd, pickler.nbytes)
        else:
            os.ftruncate(fd, pickler.nbytes)
        for offset, view in pickler.buffers:
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], offset + written)
    except OSError as exc:
        if fd is not None:
            if writer is not None:
                writer._close(fd)
            else:
                os.close(fd)
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise shared_memory_full_error(pickler.nbytes, directory) from exc
        raise
    closed = writer.take_closed() if writer is not None else ()
    return Packed(
        file.getvalue(), pickler.nbytes, slab, recycle=writer is not None, fd=fd, closed=closed
    )


def send_message(conn: Connection, message: Any, writer: SlabWriter | None = None) -> None:
    """Send ``message`` (a tuple, named or not) on a socket connection, followed by the
    descriptor of the
    slab of any :class:`Packed` in it; that descriptor is then closed here, or kept by
    ``writer`` for reuse."""
    packed = _packed_with_fd(message)
    if packed is None:
        conn.send(message)
        return
    assert packed.fd is not None and packed.slab is not None
    try:
        conn.send(_with_packed(message, packed, replace(packed, fd=None)))
        sock = socket.socket(fileno=conn.fileno())
        try:
            socket.send_fds(sock, [b"s"], [packed.fd])
        finally:
            sock.detach()  # the connection still owns the descriptor
    except BaseException:
        os.close(packed.fd)
        raise
    if writer is not None:
        writer.sent(packed.slab, packed.fd)
    else:
        os.close(packed.fd)


def receive_message(conn: Connection) -> Any:
    """The next message from :func:`send_message`, with the descriptor of its slab (if it
    has one) in :attr:`Packed.fd`.

    Raises:
        EOFError: the sender closed the socket (or died) before the descriptor came.
        RuntimeError: this process is at its open-file limit (``ulimit -n``).
    """
    message = conn.recv()
    if not isinstance(message, tuple):
        return message
    packed = next((p for p in message if isinstance(p, Packed) and p.slab is not None), None)
    if packed is None:
        return message
    sock = socket.socket(fileno=conn.fileno())
    try:
        data, fds, flags, _ = socket.recv_fds(sock, 1, 1)
    finally:
        sock.detach()
    if not data or len(fds) != 1 or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        if data and flags & socket.MSG_CTRUNC:  # the kernel had no descriptor left to give us
            raise fd_limit_error()
        raise EOFError("the sender's socket closed before the batch's slab came")
    return _with_packed(message, packed, replace(packed, fd=fds[0]))


def _with_packed(message: tuple[Any, ...], old: Packed, new: Packed) -> tuple[Any, ...]:
    """``message`` of the same type (a named tuple stays one) with ``new`` in ``old``'s place."""
    items = [new if item is old else item for item in message]
    make = getattr(type(message), "_make", None)
    return make(items) if make is not None else tuple(items)


def _packed_with_fd(message: Any) -> Packed | None:
    if isinstance(message, tuple):
        for item in message:
            if isinstance(item, Packed) and item.fd is not None:
                return item
    return None


def pack_buffer(batch: Any) -> Packed:
    """``batch``'s skeleton and its arrays as uint8 views, each with its offset in the slab
    :func:`unpack` will rebuild it over.

    For transports that move NumPy arrays without pickling them: Ray writes the views into
    its object store (their only copy on the sending side), and :func:`unpack` gathers them
    into one private slab (the only copy on the receiving side).
    """
    file = io.BytesIO()
    pickler = _SlabPickler(file)
    pickler.dump(batch)
    views = tuple((offset, np.frombuffer(view, np.uint8)) for offset, view in pickler.buffers)
    return Packed(file.getvalue(), pickler.nbytes, buffer=views)


def pack_local(batch: Any) -> Packed:
    """A batch made by a thread worker, for the training process's own threads: no slab and
    no pickle. ``nbytes`` counts its tensors' bytes, live for the memory budget until its
    largest tensor is collected (:func:`~drapps.runtime.parts.on_free`)."""
    return Packed(b"", tensor_bytes(batch), local=(batch,))


def owned(batch: Any) -> Any:
    """``batch`` as it arrives from a worker process: rebuilt, with its tensors and arrays
    gathered into memory of its own (one copy, :func:`pack_buffer` then :func:`unpack`), so
    that it shares no memory, list or dict with what the dataset keeps and returned. For a
    batch made in this process that may hold the dataset's own objects (``batch_size=None``,
    a ``collate_fn`` that keeps samples): a loop that writes into it changes no sample, as
    with DataLoader's workers. A batch that cannot be pickled is returned as it is (it could
    not come from a worker process at all).

    A batch of plain values (tuples, lists and dicts of contiguous CPU tensors, numbers and
    strings, no storage twice) is cloned instead: the same result without a pickle, which
    costs ~25 us where a sample of ``batch_size=None`` is a small tensor.
    """
    try:
        return _cloned(batch, set())
    except _NotPlain:
        pass
    try:
        packed = pack_buffer(batch)
    except Exception:  # pickle raises PicklingError, TypeError, AttributeError
        return batch
    try:
        return unpack(packed)
    except RebuildError as exc:  # as crossing a process would fail: the caller names it
        raise exc.error from None


class _NotPlain(Exception):
    """A value :func:`_cloned` leaves to the pickler."""


_IMMUTABLE = (int, float, bool, str, bytes, type(None))


def _cloned(value: Any, storages: set[int]) -> Any:
    """``value`` rebuilt with its tensors cloned; raises :class:`_NotPlain` for anything a
    clone would not give as pickling gives it (a subclass, a named tuple, a view sharing a
    storage with another, a tensor that is not a plain contiguous one)."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is torch.Tensor:
        if not _bytes_say_all(value) or value.is_conj() or value.is_neg():
            raise _NotPlain
        if not value.is_contiguous():
            raise _NotPlain  # a clone packs a stepped or expanded view; the pickler keeps it
        storage = value.untyped_storage().data_ptr()
        if storage in storages:
            raise _NotPlain  # views of one storage share it after a pickle too
        storages.add(storage)
        return value.clone()
    if kind is tuple:
        return tuple(_cloned(item, storages) for item in value)
    if kind is list:
        return [_cloned(item, storages) for item in value]
    if kind is dict:
        return {key: _cloned(item, storages) for key, item in value.items()}
    raise _NotPlain


def pack_owned(batch: Any) -> Packed:
    """:func:`pack_local` of :func:`owned`: a thread worker's batch that may hold the
    dataset's own objects."""
    return pack_local(owned(batch))


def pack_inline(batch: Any) -> Packed:
    """The whole batch pickled for the pipe: the fallback when shared memory is full."""
    return Packed(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), 0)


def unpack(
    packed: Packed,
    on_release: Callable[[int], None] | None = None,
    release: Callable[[bool], None] | None = None,
    mappings: ReceivedMappings | None = None,
    sender: int | None = None,
) -> Any:
    """Map the slab of a received batch and rebuild the batch (zero-copy); the slab's
    descriptor is closed.

    Args:
        on_release: called with the slab's size once the last tensor over it is gone.
        release: called then too, with whether the slab may be written again (a recyclable
            slab: see :class:`~drapps.runtime.recycling.SlabRecycler`).
        mappings: where the slab's mapping is looked up, and kept once it is released as
            reusable (:class:`ReceivedMappings`, with ``release``).
        sender: the id of the worker that wrote the slab, for :meth:`ReceivedMappings.gone`.

    Both are called only in this process: a forked child that drops its copy of the batch
    (or exits) calls neither.

    Raises:
        OSError, ValueError: the slab cannot be mapped.
        RebuildError: it was, but the batch cannot be rebuilt over it.
    """
    if packed.local is not None:
        batch = packed.local[0]
        if on_release is not None and packed.nbytes:
            nbytes = packed.nbytes
            on_free(batch, lambda: on_release(nbytes))
        return batch
    slab: Any = None
    owner = os.getpid()
    if packed.buffer is not None:
        # Arrays from an object store are read-only views of it; the batch is the user's to
        # modify in place, as DataLoader's are, so it is rebuilt over one private copy.
        slab = np.empty(packed.nbytes, np.uint8)
        for offset, part in packed.buffer:
            slab[offset : offset + len(part)] = part
        if on_release is not None and packed.nbytes:
            weakref.finalize(slab, in_owner, owner, on_release, packed.nbytes)
    elif packed.fd is not None:
        forks = fork_count()
        try:
            if release is None or mappings is None:
                slab = map_slab(packed.fd, packed.nbytes)
            else:
                if packed.closed:
                    mappings.forget(packed.closed)
                key, address, size = mappings.map(packed.fd, packed.nbytes)
                slab = (ctypes.c_ubyte * packed.nbytes).from_address(address)
        except BaseException:
            if release is not None:
                release(False)
            raise
        finally:
            os.close(packed.fd)
        # A fork during the mapping may or may not have copied it: not reusable either way.
        settled = forks if forks % 2 == 0 and fork_count() == forks else None
        if release is not None and mappings is not None:  # one finalizer: release, then keep
            retired = (owner, release, settled, mappings, key, address, size, sender)
            weakref.finalize(slab, retire_slab, *retired, on_release, packed.nbytes)
        else:
            if on_release is not None:
                weakref.finalize(slab, in_owner, owner, on_release, packed.nbytes)
            if release is not None:
                weakref.finalize(slab, release_slab, owner, release, settled)
    try:
        return _SlabUnpickler(io.BytesIO(packed.skeleton), slab).load()
    except Exception as exc:
        raise RebuildError(exc) from exc


def discard(packed: Packed, release: Callable[[bool], None] | None = None) -> None:
    """Drop a packed batch that will never be delivered (a duplicate or a stale epoch's)."""
    if packed.fd is not None:
        os.close(packed.fd)
        if release is not None:
            release(True)
