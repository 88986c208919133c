"""A cache entry: one sample as bytes, checked by a CRC when read back.

The sample's structure (tuples, lists, dicts, named tuples) and its small leaves (labels,
strings) are pickled into the header; every array leaf (NumPy array, CPU tensor) is encoded by
the codec, or by the lossless fallback where the codec declines it or its result misses
the PSNR floor. Layout::

    magic (4) | checksum (4) | header length (4) | header (pickle) | payloads

The checksum covers everything after it, so a torn or flipped entry is detected, dropped and
made again, never delivered. It is CRC-32C (``b"DRC2"``) where the ``crc32c`` package is installed
(the ``cache`` extra: hardware CRC, ~25 GB/s, a sixth of zlib's time on a decoded photo), else
zlib's CRC-32 (``b"DRC1"``); an entry whose checksum this process cannot compute counts as
corrupt.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from drapps.codecs.codec import Codec, Encoded, psnr

_CHECKSUMS: dict[bytes, Any] = {b"DRC1": zlib.crc32}
try:
    from crc32c import crc32c as _crc32c

    _CHECKSUMS[b"DRC2"] = _crc32c
except ImportError:  # the cache extra is not installed: zlib's CRC-32
    pass
MAGIC = b"DRC2" if b"DRC2" in _CHECKSUMS else b"DRC1"
"""The magic new entries are written with (it names their checksum)."""
_PREFIX = struct.Struct("<4sII")


class CorruptEntry(Exception):
    """An entry whose bytes do not check out."""


@dataclass(frozen=True)
class _Leaf:
    """Where an array was, and how to decode it."""

    slot: int
    codec: str
    dtype: str
    shape: tuple[int, ...]
    tensor: bool
    meta: dict[str, Any]
    nbytes: int


@dataclass(frozen=True)
class Packed:
    """A sample packed into an entry."""

    data: bytes
    exact: bool
    """Every array decodes bit for bit."""
    codecs: frozenset[str]
    """The codec asked, and the codecs that wrote the arrays (the fallback where used)."""
    raw_bytes: int
    """Bytes of the arrays before encoding."""


def pack(sample: Any, codec: Codec, fallback: Codec, min_psnr: float | None) -> Packed:
    """``sample`` as entry bytes; its arrays by ``codec``, or ``fallback`` where ``codec``
    declines one, is lossy without ``min_psnr``, or decodes below it."""
    leaves: list[_Leaf] = []
    payloads: list[bytes | memoryview] = []
    used: set[str] = set()
    raw = 0

    def encode(array: np.ndarray, tensor: bool) -> _Leaf:
        nonlocal raw
        array = np.ascontiguousarray(array)
        raw += array.nbytes
        chosen, encoded = codec, _try(codec, array, min_psnr)
        if encoded is None:
            chosen, encoded = fallback, fallback.encode(array)
            assert encoded is not None and encoded.exact, f"{fallback!r} must take any array"
        used.add(chosen.name)
        payloads.append(encoded.payload)
        leaf = _Leaf(
            len(leaves),
            chosen.name,
            array.dtype.str,
            array.shape,
            tensor,
            {**encoded.meta, "exact": encoded.exact},
            memoryview(encoded.payload).nbytes,
        )
        leaves.append(leaf)
        return leaf

    skeleton = _flatten(sample, encode)
    # The codec asked is recorded even where it declined every array, so that the cache does
    # not ask it again for this entry (see SampleCache's re-encoding on a codec change).
    header = pickle.dumps((skeleton, leaves, codec.name), protocol=pickle.HIGHEST_PROTOCOL)
    body = b"".join([header, *payloads])
    data = _PREFIX.pack(MAGIC, _CHECKSUMS[MAGIC](body), len(header)) + body
    exact = all(leaf.meta["exact"] for leaf in leaves)
    return Packed(data, exact, frozenset((*used, codec.name)), raw)


class Unpacked(NamedTuple):
    """A sample read back from an entry."""

    sample: Any
    exact: bool
    """Every array decoded bit for bit."""
    codecs: frozenset[str]
    """:attr:`Packed.codecs` of the entry."""


def unpack(data: bytearray | memoryview, codecs: dict[str, Codec]) -> Unpacked:
    """The sample back from :func:`pack`'s bytes, whether it is exact, and its codecs.

    Raises:
        CorruptEntry: the bytes are torn, flipped, or name a codec not in ``codecs``.
    """
    body, header_len = _checked(data)
    skeleton, leaves, asked = pickle.loads(body[:header_len])
    arrays: list[Any] = []
    offset = header_len
    exact = True
    for leaf in leaves:
        if leaf.codec not in codecs:
            raise CorruptEntry(f"entry was written by codec {leaf.codec!r}, which is not loaded")
        payload = body[offset : offset + leaf.nbytes]
        offset += leaf.nbytes
        array = codecs[leaf.codec].decode(payload, leaf.meta, np.dtype(leaf.dtype), leaf.shape)
        exact = exact and leaf.meta["exact"]
        arrays.append(torch.from_numpy(array) if leaf.tensor else array)
    used = frozenset((*(leaf.codec for leaf in leaves), asked))
    return Unpacked(_unflatten(skeleton, arrays), exact, used)


def _checked(data: bytearray | memoryview) -> tuple[memoryview, int]:
    """The body of an entry and its header's length.

    Raises:
        CorruptEntry: the entry is torn or fails its checksum.
    """
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise CorruptEntry(f"entry of {len(view)} bytes is shorter than its prefix")
    magic, checksum, header_len = _PREFIX.unpack_from(view)
    body = view[_PREFIX.size :]
    compute = _CHECKSUMS.get(magic)
    if compute is None or header_len > len(body) or compute(body) != checksum:
        raise CorruptEntry("entry fails its checksum")
    return body, header_len


def _try(codec: Codec, array: np.ndarray, min_psnr: float | None) -> Encoded | None:
    """``codec``'s encoding of ``array`` if it may be kept, else None."""
    encoded = codec.encode(array)
    if encoded is None or encoded.exact:
        return encoded
    if min_psnr is None:
        return None
    decoded = codec.decode(memoryview(encoded.payload), encoded.meta, array.dtype, array.shape)
    quality = psnr(array, decoded)
    if quality < min_psnr:
        return None
    return Encoded(encoded.payload, {**encoded.meta, "psnr": quality}, exact=False)


class _Slot:
    """Stands for an array leaf in the pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Any:
        return (_Slot, (self.index,))


def _flatten(value: Any, encode: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype != object:
        return _Slot(encode(value, False).slot)
    if (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and not value.requires_grad
        and value.dtype not in (torch.bfloat16,)
        and type(value) is torch.Tensor
    ):
        return _Slot(encode(value.numpy(), True).slot)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_flatten(v, encode) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_flatten(v, encode) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _flatten(v, encode) for k, v in value.items()}
    return value


def _unflatten(value: Any, arrays: list[Any]) -> Any:
    if isinstance(value, _Slot):
        return arrays[value.index]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_unflatten(v, arrays) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_unflatten(v, arrays) for v in value)
    if isinstance(value, dict):
        return {k: _unflatten(v, arrays) for k, v in value.items()}
    return value
