"""Slabs: the nameless shared-memory files a batch's bytes travel in, and the worker's side of
writing them.

A slab is an anonymous shared-memory file (``memfd_create``, :func:`create_slab`), mapped
through libc (:func:`map_slab`). It is never named in ``/dev/shm`` or anywhere else: the kernel
frees its pages once the last descriptor and mapping of it are gone, so no signal to any set of
drapps' processes (SIGKILL to the whole process group included) can leave one behind.

A worker collates a batch straight into its slab (:class:`SlabArena`): torch's default collate
stacks each batch tensor into memory mapped from the slab, so the pickler only notes where it
lies, and each image is copied once after its transform instead of twice (stack, then write).

A worker keeps the descriptors of the slabs it sent (:class:`SlabWriter`) and writes a later
batch into one the training process released instead of asking for fresh, zeroed pages; what
the training process keeps and releases is :mod:`drapps.runtime.recycling`'s, how a batch is
pickled into a slab and crosses to it :mod:`drapps.runtime.transport`'s.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

_ALIGN = 64
SHM_DIR = os.environ.get("DRAPPS_SHM_DIR") or (
    "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
)
"""The shared-memory filesystem: where slabs go (created and unlinked at once) on systems
without ``memfd_create``, and what the codec cache's sizing reads."""
KEEP_FREE = 2
"""Released slabs a worker keeps for reuse, in slabs of the largest size it has made; it
closes the others (their pages are freed). Smaller slabs (the parts of batches cut among
several workers) are kept as many as fit in the same bytes, up to :data:`KEEP_SLABS`."""
KEEP_SLABS = 16
"""The most released slabs a worker keeps, however small (see :data:`KEEP_FREE`)."""
_SENT_MEMORY = 64
"""Descriptors of sent slabs a worker keeps for reuse; older ones are closed (their pages stay
while the receiver maps them)."""
_HAS_MEMFD = hasattr(os, "memfd_create")


class SharedMemoryFullError(OSError):
    """Shared memory ran out while writing a batch."""


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
    address = map_slab_address(fd, nbytes)
    mapping = (ctypes.c_ubyte * nbytes).from_address(address)
    weakref.finalize(mapping, _libc.munmap, address, nbytes)
    return mapping


def map_slab_address(fd: int, nbytes: int) -> int:
    """The address of ``nbytes`` of slab ``fd`` mapped shared, writable and populated; the
    caller unmaps it (:func:`unmap_slab`)."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot map a {nbytes}-byte slab: {os.strerror(code)}")
    return int(address)


def unmap_slab(address: int, nbytes: int) -> None:
    """Unmap ``nbytes`` at ``address``, mapped by :func:`map_slab_address`."""
    _libc.munmap(address, nbytes)


def aligned(n: int) -> int:
    """``n`` rounded up to where the next array in a slab starts (64-byte aligned)."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def shared_memory_full_error(nbytes: int, directory: str | None) -> SharedMemoryFullError:
    """The error for shared memory that ran out while writing an ``nbytes`` batch."""
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
    stacks each tensor straight into it (:meth:`collate_map`) and
    :func:`~drapps.runtime.transport.pack` writes only what is not there yet. One copy per image
    after its transform, not two.

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

    def __init__(
        self,
        writer: SlabWriter | None = None,
        directory: str | None = None,
        *,
        first_dtype: bool = False,
    ) -> None:
        self.writer = writer
        self.first_dtype = first_dtype
        """Stack a batch's tensors at its first sample's dtype, as DataLoader's workers do
        (a fixed worker count); False: at the dtype they promote to, as DataLoader without
        workers does."""
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
        self.used = aligned(end)
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
        """The slab (id, descriptor) :func:`~drapps.runtime.transport.pack` sends, or None when
        nothing was collated into it; the arena is empty afterwards (the batch's tensors keep
        their mapping alive)."""
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
        if uniform_cpu_tensors(batch, one_dtype=not self.first_dtype):
            # With first_dtype, DataLoader's workers stack into memory of the first sample's
            # dtype: torch.stack casts the others to it where it may (int8 into uint8) and
            # raises where it may not (an integer into bool).
            out = self.empty((len(batch), *first.shape), first.dtype)
            if out is not None:
                return torch.stack(batch, out=out)
        if self.first_dtype:  # no room in the slab: in private memory, by the same rule
            return stack_at_first_dtype(batch, collate_fn_map=collate_fn_map)
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def stack_at_first_dtype(
    batch: Any, *, collate_fn_map: Any = None, otherwise: Callable[..., Any] = collate_tensor_fn
) -> torch.Tensor:
    """``torch.stack(batch)`` into a tensor of the first's dtype where the tensors' dtypes
    differ, as DataLoader's workers stack (casting where torch may, raising where not);
    otherwise ``otherwise(batch, collate_fn_map=...)`` (torch's own stack)."""
    first = batch[0]
    if uniform_cpu_tensors(batch, one_dtype=False) and any(t.dtype != first.dtype for t in batch):
        return torch.stack(batch, out=torch.empty((len(batch), *first.shape), dtype=first.dtype))
    return otherwise(batch, collate_fn_map=collate_fn_map)


def uniform_cpu_tensors(batch: Any, *, one_dtype: bool = True) -> bool:
    """Whether ``batch`` (a non-empty list) is plain, dense CPU tensors of one shape (and,
    with ``one_dtype``, one dtype), none needing grad: what can be stacked into memory chosen
    by the caller (not a quantized tensor, whose bytes need their quantizer, nor a
    subclass)."""
    first = batch[0]
    return (
        type(first) is torch.Tensor
        and not first.is_nested
        and first.layout is torch.strided
        and first.device.type == "cpu"
        and all(
            type(t) is torch.Tensor
            and t.shape == first.shape
            and (t.dtype == first.dtype if one_dtype else not t.is_quantized)
            and not t.requires_grad
            for t in batch
        )
        and not first.is_quantized
    )


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
        the whole file (:meth:`~drapps.runtime.recycling.ReceivedMappings.map`), which then fits
        any later batch or part no larger than the largest the slab held."""
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
        decides which are kept (:class:`~drapps.runtime.recycling.ReceivedMappings`, which
        counts them in the memory budget): a reusable one is kept for a later batch, any other
        closed (it was mapped across a fork, or keeping it would pass the budget or the
        worker's share)."""
        for slab, reusable in notices:
            fd = self._sent.pop(slab, None)
            if fd is None:
                continue  # closed already (over the memory)
            if reusable and len(self._free) < KEEP_SLABS:
                self._free.append(fd)
            else:
                self._close(fd)

    def _keeps(self, fd: int) -> bool:
        """Whether slab ``fd``, taken for a batch that failed, is kept for the next one (see
        :data:`KEEP_FREE`)."""
        if len(self._free) < self.keep:
            return True
        if len(self._free) >= KEEP_SLABS:
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
