"""What a user writes: ``drapps.Cache(...)``, the sample cache's settings."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drapps.cache.codec import Codec
from drapps.cache.registry import CODECS, available
from drapps.runtime.config import parse_bytes


@dataclass(frozen=True)
class Cache:
    """Settings of the sample cache (``drapps.Loader(..., cache=Cache(...))``).

    Example:
        >>> import drapps
        >>> cache = drapps.Cache(memory="1GiB", codec="zstd")
        >>> cache.codec
        'zstd'
    """

    memory: int | str = "auto"
    """Bytes of shared memory the entries may hold: an int, "512MB"/"2GiB", or "auto" (a
    quarter of the machine's memory, at most half of what ``/dev/shm`` has free)."""
    disk: str | os.PathLike[str] | None = None
    """A directory for the disk tier, used when shared memory is full; its entries outlive
    the run (keys name the dataset and the pipeline, so a changed one never reads them).
    None: no disk tier."""
    disk_bytes: int | str = "auto"
    """Bytes the disk tier may hold ("auto": half the free space of its file system)."""
    codec: str | Codec = "auto"
    """Codec for new entries: a registered name (``drapps.cache.CODECS``), a :class:`Codec`,
    or "auto" (the controller picks one of ``codecs`` from the measured state; "none" until
    it does)."""
    codecs: tuple[str | Codec, ...] | None = None
    """What "auto" may choose from. Default: the lossless codecs installed (``none``,
    ``quantize-16``, ``lz4``, ``zstd``), and ``jpeg`` when ``min_psnr`` allows lossy ones."""
    min_psnr: float | None = None
    """Allow lossy codecs, keeping a lossy encoding only where it decodes at this PSNR (dB) or
    better; elsewhere the entry is stored losslessly. None: every entry is exact."""
    tiers: tuple[Any, ...] = ()
    """Further tiers after memory and disk (:class:`drapps.cache.tier.Tier`, e.g. a cache
    shared between machines), tried in order."""
    key: str | None = None
    """The dataset's identity in entry keys. Default: ``dataset.cache_fingerprint()`` where
    the dataset has one (drapps' datasets: files, sizes and mtimes), else a hash of the
    pickled dataset."""
    shared_group: bool = False
    """Share the disk tier with the other members of its directory's group: its folders are
    made 2770 (setgid, so entries take the group) and its entries 0660, and entries written by
    the group's members are read (each is still checked). False: the disk tier is this user's
    alone (folders 0700, entries 0600), and a directory other users can write into is
    refused."""

    def __post_init__(self) -> None:
        for name in ("memory", "disk_bytes"):
            value = getattr(self, name)
            if value != "auto":
                try:
                    budget_bytes(value, name)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"Cache.{name}: {exc}") from None
        if not isinstance(self.shared_group, bool):
            raise ValueError(f"Cache.shared_group must be a bool, got {self.shared_group!r}")
        if self.shared_group and self.disk is None:
            raise ValueError(
                "Cache.shared_group applies to the disk tier; name its directory with disk=..."
            )
        if self.min_psnr is not None and not (
            isinstance(self.min_psnr, (int, float)) and self.min_psnr > 0
        ):
            raise ValueError(
                f"Cache.min_psnr must be a positive number of dB, got {self.min_psnr!r}"
            )
        for codec in (*(self.codecs or ()), self.codec):
            if codec == "auto":
                continue
            resolved = codec if isinstance(codec, Codec) else CODECS.get(codec)
            if resolved.lossy and self.min_psnr is None and not _exact_for_integers(resolved):
                raise ValueError(
                    f"Cache: codec {resolved.name!r} is lossy; allow it with min_psnr=... "
                    "(for example Cache(min_psnr=40)) or pick a lossless codec"
                )
        if self.codecs is not None and not self.codecs:
            raise ValueError("Cache.codecs must name at least one codec, got ()")

    def choices(self) -> tuple[Codec, ...]:
        """The codecs this cache may use, resolved."""
        if self.codecs is not None:
            names: Sequence[str | Codec] = self.codecs
        elif self.codec != "auto":
            names = (self.codec,)
        else:
            names = [n for n in ("none", "quantize-16", "lz4", "zstd") if n in available()]
            if self.min_psnr is not None and "jpeg" in available():
                names.append("jpeg")
        codecs = [c if isinstance(c, Codec) else CODECS.get(c) for c in names]
        if self.codec != "auto" and self.codecs is not None:
            first = self.codec if isinstance(self.codec, Codec) else CODECS.get(self.codec)
            codecs = [first, *(c for c in codecs if c.name != first.name)]
        return tuple(codecs)


def _exact_for_integers(codec: Codec) -> bool:
    """Quantisation is exact on integer data whose range fits: allowed without a PSNR floor
    (it declines float data then)."""
    return codec.name.startswith("quantize")


def budget_bytes(value: int | str, name: str) -> int:
    """A tier's budget: 0 (the tier is not used) or a size :func:`parse_bytes` reads."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0
    return parse_bytes(value, name)
