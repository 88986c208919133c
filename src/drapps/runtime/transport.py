"""Shared-memory transport: a batch's tensor bytes travel in a slab that has no name.

A worker pickles the collated batch with a ``persistent_id`` hook that pulls every dense CPU
tensor and NumPy array out of the pickle: their bytes are written (one ``pwrite`` each, 64-byte
aligned) into a slab, an anonymous shared-memory file (``memfd_create``), and only a small
skeleton (structure, dtypes, shapes, offsets, and any non-array leaves) goes through the
worker's socket. The slab's descriptor follows the skeleton over the same Unix socket
(``SCM_RIGHTS``); the receiving process maps it, closes the descriptor, and rebuilds the batch
with zero-copy tensors over the mapping.

A slab is never named in ``/dev/shm`` or anywhere else: the kernel frees its pages once the
last descriptor and mapping of it are gone, so no signal to any set of drapps' processes
(SIGKILL to the whole process group included) can leave one behind.

A worker collates a batch straight into its slab (:class:`SlabArena`): torch's default collate
stacks each batch tensor into memory mapped from the slab, so the pickler only notes where it
lies, and each image is copied once after its transform instead of twice (stack, then write).
Anything else in the batch (labels, a user collate's output) is written as above.

Slabs are recycled. A worker keeps the descriptors of the slabs it sent (:class:`SlabWriter`);
once the last tensor over a slab is garbage-collected in the process that received it, a
release notice goes back to that worker (:class:`SlabRecycler`, sent by the dispatcher), which
writes a later batch into the slab instead of asking for fresh, zeroed pages. Only the process
that received a slab sends its notice (a forked child's copies of the finalizers do nothing),
and a slab that was mapped while that process forked is never written again: the child shares
its pages and may still read them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import io
import math
import mmap
import os
import pickle
import socket
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

from drapps.runtime.errors import fd_limit_error, warn_user

_ALIGN = 64
SHM_DIR = os.environ.get("DRAPPS_SHM_DIR") or (
    "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
)
"""The shared-memory filesystem: where slabs go (created and unlinked at once) on systems
without ``memfd_create``, and what the codec cache's sizing reads."""
KEEP_FREE = 2
"""Released slabs a worker keeps for reuse, in slabs of the largest size it has made; it
closes the others (their pages are freed). Smaller slabs (the parts of batches cut among
several workers) are kept as many as fit in the same bytes, up to ``_KEEP_SLABS``."""
_KEEP_SLABS = 16
_SENT_MEMORY = 64
"""Descriptors of sent slabs a worker keeps for reuse; older ones are closed (their pages stay
while the receiver maps them)."""
_HAS_MEMFD = hasattr(os, "memfd_create")


class SharedMemoryFullError(OSError):
    """Shared memory ran out while writing a batch."""


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


def create_slab(directory: str | None = None, name: str = "slab") -> int:
    """A new, empty slab: an anonymous shared-memory file, opened read-write.

    Args:
        directory: make it as a file there instead, unlinked at once (what systems without
            ``memfd_create`` get, in :data:`SHM_DIR`).
        name: what ``/proc/<pid>/fd`` shows it as (``/memfd:drapps-<name>``).
    """
    if directory is None and _HAS_MEMFD:
        return os.memfd_create(f"drapps-{name}", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix=f"drapps_{name}_", dir=directory or SHM_DIR)
    os.unlink(path)
    return fd


def slab_space() -> int | None:
    """Bytes free where slabs live, or None where only the machine's memory bounds them
    (anonymous shared memory is not counted against ``/dev/shm``'s size)."""
    if _HAS_MEMFD:
        return None
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


# ------------------------------------------------------------------------------ forks
# A slab mapped in a process that then forks is mapped in the child too; writing a later batch
# over it would change what the child reads. The count goes up before and after every fork
# (odd while one is under way), except the forks that start drapps' own workers, which never
# read the batches they inherit.
_forks = [0]
_starting_worker = threading.local()


def _count_fork() -> None:
    if not getattr(_starting_worker, "active", False):
        _forks[0] += 1


os.register_at_fork(before=_count_fork, after_in_parent=_count_fork)


@contextlib.contextmanager
def starting_worker() -> Iterator[None]:
    """Forks inside this block start drapps workers: they do not make held slabs unreusable."""
    _starting_worker.active = True
    try:
        yield
    finally:
        _starting_worker.active = False


# Slabs are mapped through libc rather than Python's mmap, which keeps a duplicate of the
# descriptor for as long as the mapping lives: one open file per batch the loop holds.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_slab(fd: int, nbytes: int) -> Any:
    """``nbytes`` of the slab ``fd``, mapped shared and writable: a ctypes array (a buffer
    NumPy and torch read without copying) that unmaps itself when collected; the descriptor
    may be closed at once."""
    address = _mmap(fd, nbytes)
    mapping = (ctypes.c_ubyte * nbytes).from_address(address)
    weakref.finalize(mapping, _libc.munmap, address, nbytes)
    return mapping


def _mmap(fd: int, nbytes: int) -> int:
    """The address of ``nbytes`` of slab ``fd`` mapped shared, writable and populated; the
    caller unmaps it."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot map a {nbytes}-byte slab: {os.strerror(code)}")
    return int(address)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


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
        self.nbytes = _aligned(offset + raw.nbytes)
        return offset

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor:
            return self._tensor_id(obj)
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            # Fortran order is kept, as pickling keeps it; any other layout arrives C-ordered.
            order = "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
            raw = np.ravel(obj, order=order).view(np.uint8)  # type: ignore[call-overload]
            # The dtype itself, not its string: a structured dtype's string names no fields.
            return ("a", self._place(raw), obj.dtype, obj.shape, order)
        return None

    def _tensor_id(self, obj: torch.Tensor) -> Any:
        if (
            obj.layout != torch.strided
            or obj.device.type != "cpu"
            or obj.requires_grad
            or obj.is_quantized
            or obj.is_nested
        ):
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
            key = (storage.data_ptr(), whole)
            offset = self._storages.get(key)
            if offset is None:
                raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
                offset = self._storages[key] = self._place(raw)
            return ("s", offset, whole, obj.dtype, shape, stride, obj.storage_offset())
        # A small view of a large storage: only the bytes it spans.
        flat = obj.as_strided((span,), (1,))
        # A uint8 view reaches dtypes NumPy lacks (bfloat16) and keeps the copy a memcpy.
        raw = flat.view(torch.uint8).numpy()
        return ("s", self._place(raw), span * itemsize, obj.dtype, shape, stride, 0)


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a non-empty strided tensor's first to its last, both included."""
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))


_WHOLE_STORAGE = 4
"""A tensor's whole storage travels (shared by its other views in the batch) when it is at
most this many times the bytes the tensor spans; a smaller view sends only its span."""


class _SlabUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, slab: Any) -> None:
        super().__init__(file)
        self.slab = slab

    def persistent_load(self, pid: Any) -> Any:
        kind, offset = pid[0], pid[1]
        if kind == "s":
            return self._strided(*pid[1:])
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
            raise _full(pickler.nbytes, directory) from exc
        raise
    closed = writer.take_closed() if writer is not None else ()
    return Packed(
        file.getvalue(), pickler.nbytes, slab, recycle=writer is not None, fd=fd, closed=closed
    )


def _full(nbytes: int, directory: str | None) -> SharedMemoryFullError:
    where = directory or ("memory" if _HAS_MEMFD else SHM_DIR)
    return SharedMemoryFullError(
        errno.ENOSPC,
        f"shared memory ({where}) ran out while writing a {nbytes / 2**20:.1f} MiB batch; free "
        "memory (docker: --shm-size, where slabs live in /dev/shm) or lower the loader's "
        "memory_budget or prefetch",
    )


PAGE = mmap.PAGESIZE
"""Bytes of a page: shared memory is allocated in whole pages."""


class SlabArena:
    """A worker's slab for the batch it is collating, mapped writable, so the default collate
    stacks each tensor straight into it (:meth:`collate_map`) and :func:`pack` writes only what
    is not there yet. One copy per image after its transform, not two.

    Space is reserved with ``fallocate`` before it is mapped, so a full shared memory is an
    error to fall back from (the tensor is then stacked in private memory and written as
    usual), never a SIGBUS on a write through the mapping. The arena's size follows the
    largest batch so far; with a ``writer``, a recycled slab keeps its mapping from the batch
    before (:meth:`SlabWriter.mapping`).

    Example:
        >>> arena = SlabArena()
        >>> x = arena.empty((2, 3), torch.int16)
        >>> arena.offset_of(x), arena.used
        (0, 64)
        >>> arena.reset()
    """

    def __init__(self, writer: SlabWriter | None = None, directory: str | None = None) -> None:
        self.writer = writer
        self.directory = directory
        self.used = 0
        """Bytes of the slab taken so far (64-byte aligned)."""
        self._slab: tuple[int, int] | None = None  # (slab id, descriptor)
        self._reserved = 0
        self._mappings: list[tuple[int, int, Any]] = []  # (address, bytes, mapping)
        self._hint = 0
        self.collate_map = {**default_collate_fn_map, torch.Tensor: self._stack}
        """torch's default collate map, stacking tensors into this arena."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in the slab, or None when shared memory is full."""
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dtype.itemsize
        offset, end = self.used, self.used + nbytes
        if end > self._reserved and not self._reserve(end):
            return None
        self.used = _aligned(end)
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        mapping = self._mappings[-1][2]  # the newest maps the slab from its start to past ``end``
        raw = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)
        return raw.view(dtype).view(shape)

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Where ``tensor``'s bytes start in the slab, when it is one of this arena's."""
        if not self._mappings or not tensor.is_contiguous() or tensor.numel() == 0:
            return None
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        for address, size, _ in self._mappings:
            if address <= start and end <= address + size:
                return start - address
        return None

    def hand_over(self) -> tuple[int, int] | None:
        """The slab (id, descriptor) :func:`pack` sends, or None when nothing was collated into
        it; the arena is empty afterwards (the batch's tensors keep their mapping alive)."""
        held = self._slab
        self._hint = max(self._hint, self.used)
        self._slab, self._mappings, self._reserved, self.used = None, [], 0, 0
        return held

    def reset(self) -> None:
        """Drop what was collated (the batch failed): the slab goes back to the writer."""
        held = self.hand_over()
        if held is None:
            return
        if self.writer is not None:
            self.writer.give_back(*held)
        else:
            os.close(held[1])

    def _reserve(self, end: int) -> bool:
        if self._slab is None:
            slab, fd = self.writer.take() if self.writer is not None else (0, None)
            try:
                self._slab = (slab, fd if fd is not None else create_slab(self.directory))
            except OSError:
                return False
        fd = self._slab[1]
        size = -(-max(end, self._hint) // PAGE) * PAGE
        try:
            if self.writer is not None:
                mapping = self.writer.mapping(fd, size)
            else:
                os.posix_fallocate(fd, 0, size)
                mapping = map_slab(fd, size)
        except OSError:
            return False
        self._mappings.append((ctypes.addressof(mapping), len(mapping), mapping))
        self._reserved = len(mapping)
        return True

    def _stack(self, batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
        first = batch[0]
        if uniform_cpu_tensors(batch):
            out = self.empty((len(batch), *first.shape), first.dtype)
            if out is not None:
                return torch.stack(batch, out=out)
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def uniform_cpu_tensors(batch: Any) -> bool:
    """Whether ``batch`` (a non-empty list) is plain, dense CPU tensors of one shape and
    dtype, none needing grad: what can be stacked into memory chosen by the caller (not a
    quantized tensor, whose bytes need their quantizer, nor a subclass)."""
    first = batch[0]
    return (
        type(first) is torch.Tensor
        and not first.is_nested
        and first.layout is torch.strided
        and first.device.type == "cpu"
        and not first.is_quantized
        and all(
            type(t) is torch.Tensor
            and t.shape == first.shape
            and t.dtype == first.dtype
            and not t.requires_grad
            for t in batch
        )
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


class SlabWriter:
    """A worker's side of slab recycling: keeps the descriptors of the slabs it sent, and
    writes a later batch into one the receiver has released (:meth:`released`).

    Writing over a slab whose pages are already allocated skips allocating and zeroing fresh
    pages for every batch (about a millisecond per 5 MB batch, see ``docs/runtime.md``). A slab
    a batch was collated into (:class:`SlabArena`) also stays mapped in the worker for as long
    as the worker holds it, so a recycled slab costs no ``mmap``, page faults or ``munmap``
    either; its file never shrinks while mapped (a write past its end would be a SIGBUS).
    """

    def __init__(self, keep: int = KEEP_FREE, memory: int = _SENT_MEMORY) -> None:
        self.keep = keep
        self.memory = memory
        self._next = 0
        self._sent: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._free: list[int] = []
        self._mapped: dict[int, tuple[int, Any]] = {}  # descriptor -> (bytes mapped, mapping)
        self._length: dict[int, int] = {}  # descriptor -> the file's length, as last set here
        self._largest = 0  # the longest slab made so far
        # Files of slabs closed since the last batch was packed (the receiver may map them).
        self._closed: collections.deque[tuple[int, int]] = collections.deque(maxlen=4096)

    def take(self) -> tuple[int, int | None]:
        """A new slab id, and a released slab's descriptor to write into (None: make one)."""
        self._next += 1
        return self._next, (self._free.pop() if self._free else None)

    def mapping(self, fd: int, nbytes: int) -> Any:
        """The first ``nbytes`` (at least) of slab ``fd``, mapped writable in this process: kept
        from an earlier batch when it is large enough, else reserved (``fallocate``, so a full
        shared memory raises OSError here rather than SIGBUS on a write) and mapped.

        Raises:
            OSError: the space or the mapping could not be had.
        """
        held = self._mapped.get(fd)
        if held is not None and held[0] >= nbytes:
            return held[1]
        os.posix_fallocate(fd, 0, nbytes)
        self._length[fd] = max(nbytes, self._length.get(fd, 0))
        self._largest = max(self._largest, nbytes)
        mapping = map_slab(fd, nbytes)
        self._mapped[fd] = (nbytes, mapping)
        return mapping

    def fit(self, fd: int, nbytes: int) -> None:
        """Make slab ``fd``'s file at least ``nbytes`` long. A slab only ever grows: one
        mapped here must not shrink under its mapping, and the receiver keeps its mapping of
        the whole file (:meth:`ReceivedMappings.map`), which then fits any later batch or
        part no larger than the largest the slab held."""
        if nbytes > self._length.get(fd, 0):
            os.ftruncate(fd, nbytes)
            self._length[fd] = nbytes
            self._largest = max(self._largest, nbytes)

    def sent(self, slab: int, fd: int) -> None:
        """Keep ``fd`` until the receiver says whether ``slab`` may be written again."""
        self._sent[slab] = fd
        while len(self._sent) > self.memory:
            self._close(self._sent.popitem(last=False)[1])

    def give_back(self, slab: int, fd: int) -> None:
        """A slab taken (:meth:`take`) but never sent: free for the next batch."""
        del slab
        if self._keeps(fd):
            self._free.append(fd)
        else:
            self._close(fd)

    def released(self, notices: list[tuple[int, bool]]) -> None:
        """The receiver has let go of these slabs: ``(slab, reusable)`` each. The receiver
        decides which are kept (:class:`ReceivedMappings`, which counts them in the memory
        budget): a reusable one is kept for a later batch, any other closed (it was mapped
        across a fork, or keeping it would pass the budget or the worker's share)."""
        for slab, reusable in notices:
            fd = self._sent.pop(slab, None)
            if fd is None:
                continue  # closed already (over the memory)
            if reusable and len(self._free) < _KEEP_SLABS:
                self._free.append(fd)
            else:
                self._close(fd)

    def _keeps(self, fd: int) -> bool:
        """Whether slab ``fd``, taken for a batch that failed, is kept for the next one (see
        :data:`KEEP_FREE`)."""
        if len(self._free) < self.keep:
            return True
        if len(self._free) >= _KEEP_SLABS:
            return False
        held = sum(self._length.get(free, 0) for free in self._free)
        return held + self._length.get(fd, 0) <= self.keep * self._largest

    def held(self) -> int:
        """Descriptors held (sent and free)."""
        return len(self._sent) + len(self._free)

    def _close(self, fd: int) -> None:
        self._mapped.pop(fd, None)  # unmapped once no tensor of this process is over it
        self._length.pop(fd, None)
        with contextlib.suppress(OSError):
            stat = os.fstat(fd)
            self._closed.append((stat.st_dev, stat.st_ino))
            os.close(fd)

    def take_closed(self) -> tuple[tuple[int, int], ...]:
        """The files of the slabs closed since the last call, for the receiver to forget."""
        closed = tuple(self._closed)
        self._closed.clear()
        return closed

    def close(self) -> None:
        for fd in [*self._sent.values(), *self._free]:
            self._close(fd)
        self._sent.clear()
        self._free.clear()


class SlabRecycler:
    """The receiver's side: release notices, gathered per worker for the dispatcher to send
    (:meth:`drain`). Finalizers add to it from any thread, the collector's included, so it
    takes no lock (a deque's append and popleft are atomic).

    Args:
        room: bytes the memory budget has left for one more kept slab (None: no budget).
    """

    def __init__(self, room: Callable[[], int] | None = None) -> None:
        self._notices: collections.deque[tuple[int, int, bool]] = collections.deque()
        self._closed = False
        self.mappings = ReceivedMappings(room=room)
        """The receiver's mappings of this recycler's released slabs, for :func:`unpack`."""

    def releaser(self, worker: int, slab: int) -> Callable[[bool], None]:
        """What to call, with whether the slab may be written again, once ``slab`` of
        ``worker`` is released."""

        def release(reusable: bool) -> None:
            if not self._closed:
                self._notices.append((worker, slab, reusable))

        return release

    def drain(self) -> dict[int, list[tuple[int, bool]]]:
        """The notices since the last call, by worker."""
        notices: dict[int, list[tuple[int, bool]]] = {}
        while self._notices:
            worker, slab, reusable = self._notices.popleft()
            notices.setdefault(worker, []).append((slab, reusable))
        return notices

    def close(self) -> None:
        """Send no more notices (the workers are stopping; their slabs go with them)."""
        self._closed = True
        self._notices.clear()
        self.mappings.close()


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
            slab: see :class:`SlabRecycler`).
        mappings: where the slab's mapping is looked up, and kept once it is released as
            reusable (:class:`ReceivedMappings`, with ``release``).
        sender: the id of the worker that wrote the slab, for :meth:`ReceivedMappings.gone`.

    Both are called only in this process: a forked child that drops its copy of the batch
    (or exits) calls neither.
    """
    slab: Any = None
    owner = os.getpid()
    if packed.buffer is not None:
        # Arrays from an object store are read-only views of it; the batch is the user's to
        # modify in place, as DataLoader's are, so it is rebuilt over one private copy.
        slab = np.empty(packed.nbytes, np.uint8)
        for offset, part in packed.buffer:
            slab[offset : offset + len(part)] = part
        if on_release is not None and packed.nbytes:
            weakref.finalize(slab, _in_owner, owner, on_release, packed.nbytes)
    elif packed.fd is not None:
        forks = _forks[0]
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
        settled = forks if forks % 2 == 0 and _forks[0] == forks else None
        if release is not None and mappings is not None:  # one finalizer: release, then keep
            retired = (owner, release, settled, mappings, key, address, size, sender)
            weakref.finalize(slab, _retire, *retired, on_release, packed.nbytes)
        else:
            if on_release is not None:
                weakref.finalize(slab, _in_owner, owner, on_release, packed.nbytes)
            if release is not None:
                weakref.finalize(slab, _release_slab, owner, release, settled)
    return _SlabUnpickler(io.BytesIO(packed.skeleton), slab).load()


def _release_slab(owner: int, release: Callable[[bool], None], forks: int | None) -> None:
    if os.getpid() == owner:
        release(forks is not None and _forks[0] == forks)


class ReceivedMappings:
    """The receiver's mappings of released slabs, kept for the slab's next batch (one set per
    :class:`SlabRecycler`, closed with it), and the decision which released slabs are kept.

    A recycled slab comes back with a new descriptor for the same file: found here by its
    inode, it is read through the mapping it had, so the training process pays no ``mmap``,
    page-table population or ``munmap`` per batch. A released slab is kept (here mapped, in
    its worker open) only while it fits both its worker's share (:data:`KEEP_FREE` slabs of
    the largest it has sent, or as many smaller ones as fit in their bytes, at most
    ``_KEEP_SLABS``) and the memory budget's ``room()``; any other is unmapped and its worker
    told to close it. So what is kept is exactly what is counted (:meth:`held_bytes`). A
    worker that closed a kept slab names it with its next batch (:meth:`forget`); a worker
    that exits sends none of its slabs again: :meth:`gone` unmaps them at once. A forked
    child unmaps its inherited copies at once.

    Args:
        keep: the worker's share, in slabs of the largest it sent (:data:`KEEP_FREE`).
        room: bytes the budget has left for one more kept slab (None: no budget).
    """

    def __init__(self, keep: int = KEEP_FREE, room: Callable[[], int] | None = None) -> None:
        self.keep = keep
        self.room = room
        # file key -> (address, bytes mapped, the sender's id or None)
        self._held: collections.OrderedDict[tuple[int, int], tuple[int, int, int | None]] = (
            collections.OrderedDict()
        )
        self._largest: dict[int | None, int] = {}  # sender -> the largest slab it sent
        # Released slabs not kept, until their worker says it closed them (its pages live
        # till then): file key -> (bytes, sender).
        self._closing: dict[tuple[int, int], tuple[int, int | None]] = {}
        self._gone: set[int] = set()  # senders that exited
        self._lock = threading.Lock()  # finalizers run in whichever thread drops a batch
        self._closed = False
        _OPEN_MAPPINGS.add(self)

    def map(self, fd: int, nbytes: int) -> tuple[tuple[int, int], int, int]:
        """(file key, address, bytes mapped) of at least ``nbytes`` of slab ``fd``: the whole
        file is mapped (a recycled slab never shrinks), so a later, smaller batch or part
        written into it is read through the same mapping."""
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            if held[1] >= nbytes:
                return key, held[0], held[1]
            _libc.munmap(held[0], held[1])
        size = max(nbytes, stat.st_size)
        return key, _mmap(fd, size), size

    def keep_mapped(
        self, key: tuple[int, int], address: int, size: int, sender: int | None = None
    ) -> bool:
        """Keep a released slab's mapping for its next batch if it fits its worker's share
        and the budget's room; else (or once closed, or once ``sender`` is :meth:`gone`)
        unmap it. Returns whether it is kept: its worker keeps the slab only then."""
        gone = []
        with self._lock:
            if (previous := self._held.pop(key, None)) is not None:
                gone.append(previous)  # mapped again meanwhile: this one is the slab's
            largest = self._largest[sender] = max(size, self._largest.get(sender, 0))
            mine = [held for held in self._held.values() if held[2] == sender]
            share = len(mine) < self.keep or (
                len(mine) < _KEEP_SLABS
                and sum(held[1] for held in mine) + size <= self.keep * largest
            )
            kept = (
                not self._closed
                and (sender is None or sender not in self._gone)
                and share
                and (self.room is None or size <= self.room())
            )
            if kept:
                self._held[key] = (address, size, sender)
            else:
                gone.append((address, size, sender))
                self._note_closing(key, size, sender)
        for old, old_size, _ in gone:
            _libc.munmap(old, old_size)
        return kept

    def let_go(self, key: tuple[int, int], address: int, size: int, sender: int | None) -> None:
        """Unmap a released slab its worker must close (it was mapped across a fork)."""
        with self._lock:
            self._note_closing(key, size, sender)
        _libc.munmap(address, size)

    def _note_closing(self, key: tuple[int, int], size: int, sender: int | None) -> None:
        if sender is not None and sender not in self._gone and not self._closed:
            self._closing[key] = (size, sender)

    def held_bytes(self) -> int:
        """Bytes of released slabs still held: kept for reuse (each mapped here, open in its
        worker), or not kept and not yet closed by their worker."""
        with self._lock:
            return self.held_bytes_unlocked()

    def held_bytes_unlocked(self) -> int:
        """:meth:`held_bytes` for ``room()``, which runs with the lock held."""
        kept = sum(size for _, size, _ in self._held.values())
        return kept + sum(size for size, _ in self._closing.values())

    def forget(self, keys: tuple[tuple[int, int], ...]) -> None:
        """Unmap the kept mappings of these files (their sender closed them: they will not
        come back, and the mapping alone holds their pages)."""
        gone = []
        with self._lock:
            for key in keys:
                self._closing.pop(key, None)
                if (held := self._held.pop(key, None)) is not None:
                    gone.append(held)
        for address, size, _ in gone:
            _libc.munmap(address, size)

    def gone(self, sender: int) -> None:
        """``sender`` exited: unmap the kept mappings of the slabs it wrote, and keep none
        of its slabs released from now on (its descriptors closed with it, so a mapping
        here would be all that holds their pages, and it will send none of them again)."""
        with self._lock:
            self._gone.add(sender)
            keys = [key for key, held in self._held.items() if held[2] == sender]
            keys += [key for key, closing in self._closing.items() if closing[1] == sender]
        self.forget(tuple(keys))

    def close(self) -> None:
        """Unmap every kept mapping and keep none from now on."""
        with self._lock:
            self._closed = True
            held, self._held = list(self._held.values()), collections.OrderedDict()
            self._closing.clear()
        for address, size, _ in held:
            _libc.munmap(address, size)

    def __len__(self) -> int:
        return len(self._held)


_OPEN_MAPPINGS: weakref.WeakSet[ReceivedMappings] = weakref.WeakSet()


def _close_in_child() -> None:
    for mappings in list(_OPEN_MAPPINGS):
        mappings._lock = threading.Lock()  # another thread may have held it at the fork
        mappings.close()


os.register_at_fork(after_in_child=_close_in_child)


def _retire(
    owner: int,
    release: Callable[[bool], None],
    forks: int | None,
    mappings: ReceivedMappings,
    key: tuple[int, int],
    address: int,
    size: int,
    sender: int | None,
    on_release: Callable[[int], None] | None,
    nbytes: int,
) -> None:
    """The last tensor over a received, recyclable slab is gone: its batch's bytes are no
    longer live; keep the mapping for the slab's next batch when it may be written again and
    fits (:meth:`ReceivedMappings.keep_mapped`), and tell its worker."""
    if os.getpid() != owner:
        _libc.munmap(address, size)  # a forked child's copy of the mapping
        return
    if on_release is not None:  # first: the budget's room then counts this slab as kept
        on_release(nbytes)
    reusable = forks is not None and _forks[0] == forks
    if reusable:
        reusable = mappings.keep_mapped(key, address, size, sender)
    else:
        mappings.let_go(key, address, size, sender)
    release(reusable)


def _in_owner(owner: int, function: Callable[..., None], *args: Any) -> None:
    """``function(*args)``, in the process ``owner`` only: finalizers are inherited by forked
    children, which run them when they drop their copies or exit."""
    if os.getpid() == owner:
        function(*args)


def discard(packed: Packed, release: Callable[[bool], None] | None = None) -> None:
    """Drop a packed batch that will never be delivered (a duplicate or a stale epoch's)."""
    if packed.fd is not None:
        os.close(packed.fd)
        if release is not None:
            release(True)


def pinner(pin_memory: bool, device: str = "") -> Callable[[Any], Any] | None:
    """The function that pins each received batch, or None (with torch's own warning when
    ``pin_memory`` is asked for and no accelerator can use it)."""
    if not pin_memory:
        return None
    accelerator = getattr(torch, "accelerator", None)
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if not available:
        warn_user(
            "'pin_memory' argument is set as true but no accelerator is found, then device "
            "pinned memory won't be used."
        )
        return None
    if device:
        warn_user(
            "pin_memory_device is deprecated, the current accelerator will be used as the "
            f"device, ignore pin_memory_device='{device}'."
        )
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin
