"""Shared-memory transport: a batch's tensor bytes travel in a slab file, not through a pipe.

A worker pickles the collated batch with a ``persistent_id`` hook that pulls every dense CPU
tensor and NumPy array out of the pickle: their bytes are written (one ``pwrite`` each, 64-byte
aligned) into a file on tmpfs (``/dev/shm``), and only a small skeleton (structure, dtypes, shapes,
offsets, and any non-array leaves) goes through the worker's pipe. The receiving process maps the
slab and rebuilds the batch with zero-copy tensors over the mapping. A worker's slabs are
recycled: once the last tensor of a batch is garbage-collected, the training process renames its
slab ``<name>.free`` (at most :data:`KEEP_FREE` per worker; the others are unlinked), and that
worker writes a later batch into it (:class:`SlabWriter`) instead of asking tmpfs for fresh,
zeroed pages. Slabs from producers that do not recycle are unlinked as soon as they are mapped.

Slab names carry the owning loader's session and the producing worker's id, so a killed worker's
half-written slabs (and any left after a crash) can be found by prefix and removed.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import mmap
import os
import pickle
import secrets
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_ALIGN = 64
SHM_DIR = os.environ.get("DRAPPS_SHM_DIR") or (
    "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
)
"""Where slabs live: ``$DRAPPS_SHM_DIR``, else ``/dev/shm``, else the temporary directory."""
SLAB_PREFIX = "drapps_"
FREE_SUFFIX = ".free"
"""A released slab's name is its own plus this: its writer may take it back."""
KEEP_FREE = 2
"""Released slabs kept per worker for reuse; more are unlinked (their pages freed)."""
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


class SharedMemoryFullError(OSError):
    """The shared-memory filesystem ran out of space while writing a batch."""


@dataclass(frozen=True)
class Packed:
    """A batch as it crosses processes: the pickled skeleton and where its bytes lie."""

    skeleton: bytes
    """Pickle of the batch with arrays replaced by references into the slab."""
    path: str | None
    """Slab file, or None when the batch holds no array bytes."""
    nbytes: int
    """Size of the slab file (or of ``buffer``)."""
    buffer: Any = None
    """The array bytes when they travel by another route than a slab file: ``(offset,
    uint8 array)`` pairs that Ray's object store carries (see :func:`pack_buffer`); None
    otherwise."""
    recycle: bool = False
    """The writer takes the slab back once released (see :class:`SlabWriter`): the receiver
    keeps its name until then, and hands it to :meth:`SlabRecycler.release`."""


def slab_prefix(session: str, worker_id: int | None = None) -> str:
    """Path prefix of the slabs of a loader session, or of one worker of it."""
    base = os.path.join(SHM_DIR, f"{SLAB_PREFIX}{session}_")
    return base if worker_id is None else f"{base}w{worker_id}_"


def slab_name(prefix: str) -> str:
    """A new slab path under ``prefix``: a random suffix, so no other user can guess it."""
    return f"{prefix}{secrets.token_hex(8)}"


def remove_slabs(prefix: str) -> int:
    """Unlink every slab of ours whose path starts with ``prefix``; returns how many.

    Files of other users (``/dev/shm`` is world-writable) are never touched.
    """
    directory, name = os.path.split(prefix)
    removed = 0
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return 0
    uid = os.getuid()
    for entry in entries:
        if entry.startswith(name):
            path = os.path.join(directory, entry)
            try:
                if os.lstat(path).st_uid != uid:
                    continue
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def remove_orphan_slabs(min_age_s: float = 60.0) -> int:
    """Unlink our slabs whose loader process is gone (killed with its whole process group,
    so nobody removed them); returns how many.

    A slab lives as a file only between a worker's write and the loader's read (well under a
    second), so one older than ``min_age_s`` whose pid is not running is an orphan even if
    another PID namespace shares this ``/dev/shm``.
    """
    import psutil

    removed = 0
    now = time.time()
    alive: dict[int, bool] = {}
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return 0
    for entry in entries:
        # drapps_<pid>_<hex>_...: the owning loader's pid comes first.
        pid_text = entry[len(SLAB_PREFIX) :].split("_", 1)[0]
        if not entry.startswith(SLAB_PREFIX) or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid not in alive:
            alive[pid] = psutil.pid_exists(pid)
        path = os.path.join(SHM_DIR, entry)
        try:
            old = now - os.lstat(path).st_mtime > min_age_s
        except FileNotFoundError:
            continue
        if old and not alive[pid]:
            removed += remove_slabs(path)
    return removed


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _SlabPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.buffers: list[tuple[int, memoryview]] = []
        self.nbytes = 0

    def _place(self, raw: np.ndarray) -> int:
        offset = self.nbytes
        if raw.nbytes:
            self.buffers.append((offset, memoryview(raw).cast("B")))  # type: ignore[arg-type]
        self.nbytes = _aligned(offset + raw.nbytes)
        return offset

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor:
            if obj.layout != torch.strided or obj.device.type != "cpu" or obj.requires_grad:
                return None
            flat = obj.detach().contiguous().reshape(-1)
            # A uint8 view reaches dtypes NumPy lacks (bfloat16) and keeps the copy a memcpy.
            raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
            return ("t", self._place(raw), obj.dtype, tuple(obj.shape))
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
            return ("a", self._place(raw), obj.dtype.str, obj.shape)
        return None


class _SlabUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, slab: mmap.mmap | None) -> None:
        super().__init__(file)
        self.slab = slab

    def persistent_load(self, pid: Any) -> Any:
        kind, offset, dtype, shape = pid
        if self.slab is None:
            raise pickle.UnpicklingError("batch refers to shared memory but came without a slab")
        if kind == "t":
            count = 1
            for dim in shape:
                count *= dim
            if count == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(self.slab, dtype=dtype, count=count, offset=offset).view(shape)
        array_dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.empty(shape, dtype=array_dtype)
        return np.frombuffer(self.slab, dtype=array_dtype, count=count, offset=offset).reshape(
            shape
        )


def pack(batch: Any, path: str, writer: SlabWriter | None = None) -> Packed:
    """Write ``batch``'s array bytes to a slab at ``path`` and return its skeleton.

    Args:
        writer: the worker's :class:`SlabWriter`: a slab it released is written over
            (renamed to ``path``) when there is one, and the batch is marked for recycling.

    Raises:
        SharedMemoryFullError: the filesystem holding ``path`` is full.
    """
    file = io.BytesIO()
    pickler = _SlabPickler(file)
    pickler.dump(batch)
    if not pickler.buffers:
        return Packed(file.getvalue(), None, 0)
    fd = writer.reclaim(path) if writer is not None else None
    for _ in range(0 if fd is not None else 8):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NO_FOLLOW, 0o600)
            break
        except FileExistsError:  # taken (by chance, or planted by someone else): a new name
            path = f"{path}_{secrets.token_hex(4)}"
    if fd is None:
        raise FileExistsError(errno.EEXIST, "no free slab name after 8 tries", path)
    try:
        os.ftruncate(fd, pickler.nbytes)
        for offset, view in pickler.buffers:
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], offset + written)
    except OSError as exc:
        os.unlink(path)
        if exc.errno == errno.ENOSPC:
            usage = os.statvfs(os.path.dirname(path))
            size_mib = usage.f_blocks * usage.f_frsize / 2**20
            raise SharedMemoryFullError(
                errno.ENOSPC,
                f"shared memory at {os.path.dirname(path)} ({size_mib:.0f} MiB) is full while "
                f"writing a {pickler.nbytes / 2**20:.1f} MiB batch; enlarge it (docker: "
                "--shm-size) or lower the loader's memory_budget or prefetch",
            ) from exc
        raise
    finally:
        os.close(fd)
    if writer is not None:
        writer.sent(path)
    return Packed(file.getvalue(), path, pickler.nbytes, recycle=writer is not None)


class SlabWriter:
    """A worker's side of slab recycling: remembers the slabs it sent and takes one back
    (renamed to the new batch's name) once the training process has released it.

    Writing over a slab whose pages tmpfs already holds skips allocating and zeroing fresh
    pages for every batch (about a millisecond per 5 MB batch, see ``docs/runtime.md``).
    """

    def __init__(self, memory: int = 64) -> None:
        self._sent: collections.deque[str] = collections.deque(maxlen=memory)

    def sent(self, path: str) -> None:
        self._sent.append(path)

    def reclaim(self, path: str) -> int | None:
        """A released slab renamed to ``path`` and opened for writing, or None if none is."""
        for old in list(self._sent):
            try:
                os.rename(old + FREE_SUFFIX, path)
            except FileNotFoundError:
                continue  # not released yet (or unlinked: over the keep limit, or closed)
            self._sent.remove(old)
            try:
                fd = os.open(path, os.O_WRONLY | _NO_FOLLOW)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                return None
            if os.fstat(fd).st_uid != os.getuid():  # planted under our name: not ours to fill
                os.close(fd)
                return None
            return fd
        return None


class SlabRecycler:
    """The training process's side: a released slab goes back to its worker as
    ``<name>.free`` while that worker has fewer than ``keep`` waiting, else it is unlinked.
    After :meth:`close` every released slab is unlinked."""

    def __init__(self, keep: int = KEEP_FREE) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._closed = False
        self._free: dict[str, list[str]] = {}

    def release(self, path: str) -> None:
        owner = path.rsplit("_", 1)[0]  # the worker's slab prefix, less its last "_"
        with self._lock:
            waiting = [name for name in self._free.get(owner, ()) if os.path.exists(name)]
            try:
                if self._closed or len(waiting) >= self.keep:
                    os.unlink(path)
                else:
                    os.rename(path, path + FREE_SUFFIX)
                    waiting.append(path + FREE_SUFFIX)
            except FileNotFoundError:
                pass  # its worker was stopped and its slabs removed
            self._free[owner] = waiting

    def close(self) -> None:
        """Unlink every slab released from now on (the pool removes those waiting)."""
        with self._lock:
            self._closed = True
            self._free.clear()


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
    return Packed(file.getvalue(), None, pickler.nbytes, views)


def pack_inline(batch: Any) -> Packed:
    """The whole batch pickled for the pipe: the fallback when shared memory is full."""
    return Packed(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), None, 0)


def unpack(
    packed: Packed,
    on_release: Callable[[int], None] | None = None,
    recycler: SlabRecycler | None = None,
) -> Any:
    """Map a slab written by :func:`pack` and rebuild the batch (zero-copy).

    Args:
        on_release: called with the slab's size once the last tensor over it is gone, which is
            when its pages return to the shared-memory filesystem (or to its worker).
        recycler: takes a recyclable slab back to its worker once released; without one (or
            for a slab not marked ``recycle``) the slab's name is unlinked at once.
    """
    slab: Any = None
    if packed.buffer is not None:
        # Arrays from an object store are read-only views of it; the batch is the user's to
        # modify in place, as DataLoader's are, so it is rebuilt over one private copy.
        slab = np.empty(packed.nbytes, np.uint8)
        for offset, part in packed.buffer:
            slab[offset : offset + len(part)] = part
        if on_release is not None and packed.nbytes:
            weakref.finalize(slab, on_release, packed.nbytes)
    elif packed.path is not None:
        fd = os.open(packed.path, os.O_RDWR | _NO_FOLLOW)
        try:
            if os.fstat(fd).st_uid != os.getuid():
                raise PermissionError(f"slab {packed.path} is not ours; refusing to map it")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            slab = mmap.mmap(fd, packed.nbytes, flags=flags)
        finally:
            os.close(fd)
            # A recyclable slab keeps its name until released; one that was not mapped
            # (not ours, or the map failed) will never be released, so it goes now.
            keep = packed.recycle and recycler is not None and slab is not None
            if not keep:
                os.unlink(packed.path)
        if on_release is not None:
            weakref.finalize(slab, on_release, packed.nbytes)
        if keep:
            assert recycler is not None
            weakref.finalize(slab, recycler.release, packed.path)
    return _SlabUnpickler(io.BytesIO(packed.skeleton), slab).load()


def discard(packed: Packed) -> None:
    """Drop a packed batch that will never be delivered (a duplicate or a stale epoch's)."""
    if packed.path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(packed.path)


def pinner(pin_memory: bool, device: str = "") -> Callable[[Any], Any] | None:
    """The function that pins each received batch, or None (with torch's own warning when
    ``pin_memory`` is asked for and no accelerator can use it)."""
    if not pin_memory:
        return None
    accelerator = getattr(torch, "accelerator", None)
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if not available:
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, then device "
            "pinned memory won't be used.",
            stacklevel=3,
        )
        return None
    if device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the "
            f"device, ignore pin_memory_device='{device}'.",
            stacklevel=3,
        )
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin
