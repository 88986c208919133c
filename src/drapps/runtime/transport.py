"""Shared-memory transport: a batch's tensor bytes travel in a slab file, not through a pipe.

A worker pickles the collated batch with a ``persistent_id`` hook that pulls every dense CPU
tensor and NumPy array out of the pickle: their bytes are written (one ``pwrite`` each, 64-byte
aligned) into a file on tmpfs (``/dev/shm``), and only a small skeleton (structure, dtypes, shapes,
offsets, and any non-array leaves) goes through the worker's pipe. The receiving process maps the
slab, unlinks its name at once, and rebuilds the batch with zero-copy tensors over the mapping; the
memory is freed when the last tensor of the batch is garbage-collected.

Slab names carry the owning loader's session and the producing worker's id, so a killed worker's
half-written slabs (and any left after a crash) can be found by prefix and removed.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import pickle
import secrets
import tempfile
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


def pack(batch: Any, path: str) -> Packed:
    """Write ``batch``'s array bytes to a new slab at ``path`` and return its skeleton.

    Raises:
        SharedMemoryFullError: the filesystem holding ``path`` is full.
    """
    file = io.BytesIO()
    pickler = _SlabPickler(file)
    pickler.dump(batch)
    if not pickler.buffers:
        return Packed(file.getvalue(), None, 0)
    for _ in range(8):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NO_FOLLOW, 0o600)
            break
        except FileExistsError:  # taken (by chance, or planted by someone else): a new name
            path = f"{path}_{secrets.token_hex(4)}"
    else:
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
    return Packed(file.getvalue(), path, pickler.nbytes)


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


def unpack(packed: Packed, on_release: Callable[[int], None] | None = None) -> Any:
    """Map a slab written by :func:`pack`, unlink its name and rebuild the batch (zero-copy).

    Args:
        on_release: called with the slab's size once the last tensor over it is gone, which is
            when its pages return to the shared-memory filesystem.
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
            os.unlink(packed.path)
        if on_release is not None:
            weakref.finalize(slab, on_release, packed.nbytes)
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
