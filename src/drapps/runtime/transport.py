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
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_ALIGN = 64
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
SLAB_PREFIX = "drapps_"


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
    """Size of the slab file."""


def slab_prefix(session: str, worker_id: int | None = None) -> str:
    """Path prefix of the slabs of a loader session, or of one worker of it."""
    base = os.path.join(SHM_DIR, f"{SLAB_PREFIX}{session}_")
    return base if worker_id is None else f"{base}w{worker_id}_"


def remove_slabs(prefix: str) -> int:
    """Unlink every slab whose path starts with ``prefix``; returns how many were removed."""
    directory, name = os.path.split(prefix)
    removed = 0
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.startswith(name):
            try:
                os.unlink(os.path.join(directory, entry))
                removed += 1
            except FileNotFoundError:
                pass
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
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
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


def unpack(packed: Packed) -> Any:
    """Map a slab written by :func:`pack`, unlink its name and rebuild the batch (zero-copy)."""
    slab = None
    if packed.path is not None:
        fd = os.open(packed.path, os.O_RDWR)
        try:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            slab = mmap.mmap(fd, packed.nbytes, flags=flags)
        finally:
            os.close(fd)
            os.unlink(packed.path)
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
