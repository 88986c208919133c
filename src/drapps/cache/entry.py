"""A cache entry: one sample as bytes, checked by a CRC when read back, with no pickle.

The sample's structure (tuples, lists, dicts, named tuples) and its small leaves (numbers,
strings, bytes, None, NumPy scalars) are written into a JSON header; every array leaf (NumPy
array, CPU tensor) is encoded by the codec, or by the lossless fallback where the codec declines
it or its result misses the PSNR floor. Layout::

    magic (4) | checksum (4) | header length (4) | header (UTF-8 JSON) | payloads

Each payload starts a multiple of 16 bytes from the entry's start (the header and the payloads
before it padded), so that an array decoded in place (the ``none`` codec's view of the read
buffer) is aligned for its dtype: torch assumes it is, and a misaligned complex tensor crashes
its kernels. An array that comes back misaligned all the same (a buffer that does not start
aligned, an entry of an earlier format, which packed them end to end) is copied.

Entries may be read from places other processes can write (a shared disk directory, Redis),
so reading one never runs code: the header is JSON, checked field by field; a named tuple is
rebuilt only as a type already loaded in this process under the name and fields the header
gives; anything else is refused as corrupt. A sample holding other objects is not cached
(:class:`Uncacheable`).

The checksum covers everything after it, so a torn or flipped entry is detected, dropped and
made again, never delivered. It is CRC-32C (``b"DRJ4"``) where the ``crc32c`` package is installed
(the ``cache`` extra: hardware CRC, ~25 GB/s, a sixth of zlib's time on a decoded photo), else
zlib's CRC-32 (``b"DRJ3"``); an entry whose checksum this process cannot compute, or of a
format it does not know, counts as corrupt. Entries of the format before aligned payloads
(``b"DRJ2"``, ``b"DRJ1"``) are still read.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from drapps.cache.codec import Codec, Encoded, psnr

_CHECKSUMS: dict[bytes, Any] = {b"DRJ1": zlib.crc32, b"DRJ3": zlib.crc32}
try:
    from crc32c import crc32c as _crc32c

    _CHECKSUMS[b"DRJ2"] = _CHECKSUMS[b"DRJ4"] = _crc32c
except ImportError:  # the cache extra is not installed: zlib's CRC-32
    pass
MAGIC = b"DRJ4" if b"DRJ4" in _CHECKSUMS else b"DRJ3"
"""The magic new entries are written with (it names their checksum)."""
_ALIGNED = frozenset({b"DRJ3", b"DRJ4"})
"""The formats whose payloads start aligned (``DRJ1`` and ``DRJ2`` packed them end to end)."""
_ALIGN = 16
"""Bytes a payload's start is a multiple of, from the entry's start: a complex128's alignment,
the largest of any dtype an entry holds."""
_PREFIX = struct.Struct("<4sII")
_MAX_DEPTH = 32


class CorruptEntry(Exception):
    """An entry whose bytes do not check out."""


class Uncacheable(ValueError):
    """A sample holding something an entry cannot carry (an object other than arrays,
    numbers, strings, bytes, None, and lists, tuples, named tuples and dicts of them)."""


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

    def fields(self) -> list[Any]:
        return [
            self.slot, self.codec, self.dtype, list(self.shape), self.tensor, self.meta,
            self.nbytes,
        ]  # fmt: skip


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
    declines one, is lossy without ``min_psnr``, or decodes below it.

    Raises:
        Uncacheable: the sample holds an object an entry cannot carry.
    """
    leaves: list[_Leaf] = []
    payloads: list[bytes | memoryview] = []
    used: set[str] = set()
    raw = 0

    def encode(array: np.ndarray, tensor: bool) -> int:
        nonlocal raw
        # np.ascontiguousarray makes a 0-d array 1-d: a scalar tensor would come back (1,).
        array = array if array.flags.c_contiguous else np.ascontiguousarray(array)
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
        return leaf.slot

    skeleton = _flatten(sample, encode, 0)
    # The codec asked is recorded even where it declined every array, so that the cache does
    # not ask it again for this entry (see SampleCache's re-encoding on a codec change).
    header = json.dumps(
        {"skeleton": skeleton, "leaves": [leaf.fields() for leaf in leaves], "codec": codec.name},
        default=_plain,
        separators=(",", ":"),
    ).encode()
    header += b" " * _padding(len(header))  # JSON allows the spaces: the first payload aligned
    parts: list[bytes | memoryview] = [header]
    end = len(header)
    for payload in payloads:
        gap = _padding(end)
        parts += [bytes(gap), payload]
        end += gap + memoryview(payload).nbytes
    body = b"".join(parts)
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
        CorruptEntry: the bytes are torn, flipped, malformed, or name a codec not in
            ``codecs``.
    """
    body, header_len, aligned = _checked(data)
    try:
        header = json.loads(bytes(body[:header_len]))
        skeleton, leaves, asked = header["skeleton"], header["leaves"], header["codec"]
        leaves = [_leaf(fields) for fields in leaves]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntry(f"entry header is malformed: {exc}") from None
    if not isinstance(asked, str):
        raise CorruptEntry("entry header is malformed: its codec is not a name")
    arrays: list[Any] = []
    offset = header_len
    exact = True
    for slot, leaf in enumerate(leaves):
        if leaf.codec not in codecs:
            raise CorruptEntry(f"entry was written by codec {leaf.codec!r}, which is not loaded")
        if aligned:
            offset += _padding(offset)
        if leaf.slot != slot or offset + leaf.nbytes > len(body):
            raise CorruptEntry("entry header does not match its payloads")
        payload = body[offset : offset + leaf.nbytes]
        offset += leaf.nbytes
        try:
            decoded = codecs[leaf.codec].decode(
                payload, leaf.meta, np.dtype(leaf.dtype), leaf.shape
            )
            array = np.asarray(decoded)  # arithmetic on a 0-d array gives a NumPy scalar
            if array.shape != leaf.shape:
                raise ValueError(f"decoded to shape {array.shape}, not {leaf.shape}")
            if array.ctypes.data % min(array.itemsize, _ALIGN):
                array = array.copy()  # torch's kernels assume an element's alignment
        except Exception as exc:  # a payload its header does not describe
            raise CorruptEntry(f"entry's array {slot} does not decode: {exc}") from None
        exact = exact and bool(leaf.meta.get("exact"))
        arrays.append(torch.from_numpy(array) if leaf.tensor else array)
    used = frozenset((*(leaf.codec for leaf in leaves), asked))
    return Unpacked(_unflatten(skeleton, arrays, 0), exact, used)


def _checked(data: bytearray | memoryview) -> tuple[memoryview, int, bool]:
    """The body of an entry, its header's length, and whether its payloads start aligned.

    Raises:
        CorruptEntry: the entry is torn or fails its checksum.
    """
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise CorruptEntry(f"entry of {len(view)} bytes is shorter than its prefix")
    magic, checksum, header_len = _PREFIX.unpack_from(view)
    body = view[_PREFIX.size :]
    compute = _CHECKSUMS.get(magic)
    if compute is None:
        raise CorruptEntry(f"entry format {bytes(magic)!r} is not one this process reads")
    if header_len > len(body) or compute(body) != checksum:
        raise CorruptEntry("entry fails its checksum")
    return body, header_len, magic in _ALIGNED


def _padding(offset: int) -> int:
    """Bytes from ``offset`` in an entry's body to the next aligned start of a payload."""
    return -(_PREFIX.size + offset) % _ALIGN


# ------------------------------------------------------------------------------ the header
# A node is a one-key object: {"v": JSON value}, {"y": base64 bytes}, {"g": [dtype, value]}
# (a NumPy scalar), {"a": slot} (an array leaf), {"h": slot} (a bfloat16 tensor's bits as
# int16), {"x": [slot, dtype]} (a float8 tensor's bits as uint8), {"p": [node, order]} (a
# node's array or tensor with its dimensions permuted: a transposed layout), {"s": [node,
# sizes, strides]} (a tensor viewed with those strides into the node's 1-D span of storage: a
# stepped, expanded or overlapping view), {"l": [...]},
# {"t": [...]}, {"d": [[key, value], ...]} or {"n": [module, qualname, fields, [...]]} (a
# named tuple).

_DTYPE_KINDS = frozenset("biufc")


def _plain(value: Any) -> Any:
    """JSON for the NumPy numbers and tuples codecs put in their meta."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _flatten(value: Any, encode: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise Uncacheable(f"the sample nests deeper than {_MAX_DEPTH} levels")
    if type(value) is np.ndarray and value.dtype.kind in _DTYPE_KINDS and not value.dtype.fields:
        if value.ndim > 1 and value.flags.f_contiguous and not value.flags.c_contiguous:
            # Fortran order comes back as it was: the C-ordered transpose, transposed back.
            order = list(range(value.ndim))[::-1]
            return {"p": [{"a": encode(value.transpose(order), False)}, order]}
        steps = _steps(value)
        if steps is not None:  # a stepped view comes back with its strides, as a tensor's
            span = np.lib.stride_tricks.as_strided(
                value, (_span(list(value.shape), steps),), (value.itemsize,)
            )
            return {"s": [{"a": encode(np.array(span), False)}, list(value.shape), steps]}
        return {"a": encode(value, False)}
    if (
        type(value) is torch.Tensor
        and value.device.type == "cpu"
        and not value.requires_grad
        and value.layout == torch.strided
        and not value.is_quantized
    ):
        value = value.resolve_conj().resolve_neg()
        dense = _dense_order(value)
        if dense is not None:  # a transposed layout comes back with its strides
            inner = _flatten(value.permute(dense).contiguous(), encode, depth + 1)
            return {"p": [inner, _inverse(dense)]}
        if not value.is_contiguous() and value.numel() > 1:
            # Any other view (stepped, expanded, overlapping) keeps the span of storage it
            # looks into, from its first element, and comes back with its strides, as
            # DataLoader's shared memory gives it back.
            extent = _span(list(value.shape), list(value.stride()))
            inner = _flatten(value.as_strided((extent,), (1,)), encode, depth + 1)
            return {"s": [inner, list(value.shape), list(value.stride())]}
        if value.dtype == torch.bfloat16:  # NumPy has no bfloat16: its bits, as int16
            return {"h": encode(value.contiguous().view(torch.int16).numpy(), True)}
        name = str(value.dtype).removeprefix("torch.")
        if name in _BITS_DTYPES:  # nor float8: its bits, as uint8
            return {"x": [encode(value.contiguous().view(torch.uint8).numpy(), True), name]}
        return {"a": encode(value.numpy(), True)}
    if value is None or type(value) in (bool, int, float, str):  # not their subclasses
        return {"v": value}
    if type(value) is bytes:
        return {"y": base64.b64encode(value).decode()}
    if isinstance(value, np.generic) and value.dtype.kind in _DTYPE_KINDS:
        return {"g": [value.dtype.str, value.item()]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        cls = type(value)
        named = [cls.__module__, cls.__qualname__, list(cls._fields)]
        try:
            found = _named_tuple(*named)
        except CorruptEntry:
            found = None
        if found is not cls:  # defined in a function: no reader could name it
            raise Uncacheable(f"named tuple {cls.__qualname__} cannot be found by its name")
        return {"n": [*named, [_flatten(v, encode, depth + 1) for v in value]]}
    if type(value) in (list, tuple):
        key = "l" if type(value) is list else "t"
        return {key: [_flatten(v, encode, depth + 1) for v in value]}
    if type(value) is dict:
        return {
            "d": [
                [_flatten(k, encode, depth + 1), _flatten(v, encode, depth + 1)]
                for k, v in value.items()
            ]
        }
    raise Uncacheable(
        f"a cache entry cannot hold a {type(value).__module__}.{type(value).__name__}"
    )


_BITS_DTYPES = frozenset(
    name for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)  # fmt: skip
"""torch dtypes NumPy lacks whose bits an entry keeps as uint8 (``{"x": [slot, name]}``)."""


def _dense_order(tensor: torch.Tensor) -> list[int] | None:
    """The order of dimensions that lays a dense, non-overlapping but non-contiguous
    tensor out contiguously (a transposed one); None for any other."""
    if tensor.dim() < 2 or tensor.is_contiguous():
        return None
    strides, sizes = tensor.stride(), tensor.shape
    order = sorted(range(tensor.dim()), key=lambda d: (-strides[d], d))
    step = 1
    for dim in reversed(order):  # innermost first: each stride spans the dimensions inside it
        if sizes[dim] != 1 and strides[dim] != step:
            return None
        step *= sizes[dim]
    return order


def _steps(array: np.ndarray) -> list[int] | None:
    """A non-contiguous array's strides in elements, where they can come back (none
    negative, each a whole number of elements); None for any other array."""
    if array.size < 2 or array.flags.c_contiguous or array.flags.f_contiguous:
        return None
    if any(st < 0 or st % array.itemsize for st in array.strides):
        return None
    return [st // array.itemsize for st in array.strides]


def _span(sizes: list[int], strides: list[int]) -> int:
    """Elements of storage a view of ``sizes`` and ``strides`` spans, from its first."""
    return 1 + sum((n - 1) * step for n, step in zip(sizes, strides, strict=True))


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse


def _unflatten(node: Any, arrays: list[Any], depth: int) -> Any:
    if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
        raise CorruptEntry("entry header holds a malformed node")
    ((kind, value),) = node.items()
    try:
        if kind == "v" and (value is None or type(value) in (bool, int, float, str)):
            return value
        if kind == "a" and type(value) is int and 0 <= value < len(arrays):
            return arrays[value]
        if kind == "h" and type(value) is int and 0 <= value < len(arrays):
            return arrays[value].view(torch.bfloat16)
        if kind == "x" and isinstance(value, list) and len(value) == 2 and value[1] in _BITS_DTYPES:
            slot = value[0]
            if type(slot) is int and 0 <= slot < len(arrays):
                return arrays[slot].view(getattr(torch, value[1]))
        if kind == "p" and isinstance(value, list) and len(value) == 2:
            inner, order = _unflatten(value[0], arrays, depth + 1), value[1]
            if not (
                isinstance(order, list)
                and sorted(order) == list(range(len(order)))
                and all(type(d) is int for d in order)
                and isinstance(inner, torch.Tensor | np.ndarray)
                and inner.ndim == len(order)
            ):
                raise CorruptEntry("entry header holds a malformed 'p' node")
            return (
                inner.permute(order) if isinstance(inner, torch.Tensor) else inner.transpose(order)
            )
        if kind == "s" and isinstance(value, list) and len(value) == 3:
            inner, sizes, strides = _unflatten(value[0], arrays, depth + 1), value[1], value[2]
            if not (
                isinstance(inner, torch.Tensor | np.ndarray)
                and inner.ndim == 1
                and isinstance(sizes, list)
                and isinstance(strides, list)
                and len(sizes) == len(strides)
                and all(type(n) is int and n > 0 for n in sizes)
                and all(type(step) is int and step >= 0 for step in strides)
                and _span(sizes, strides) <= len(inner)
            ):
                raise CorruptEntry("entry header holds a malformed 's' node")
            if isinstance(inner, np.ndarray):
                steps = tuple(step * inner.itemsize for step in strides)
                return np.lib.stride_tricks.as_strided(inner, tuple(sizes), steps)
            return inner.as_strided(sizes, strides)
        if kind == "y" and isinstance(value, str):
            return base64.b64decode(value, validate=True)
        if kind == "g" and isinstance(value, list) and len(value) == 2:
            return _dtype(value[0]).type(value[1])
        if kind in ("l", "t") and isinstance(value, list):
            items = [_unflatten(v, arrays, depth + 1) for v in value]
            return items if kind == "l" else tuple(items)
        if kind == "d" and isinstance(value, list):
            return {
                _hashable(_unflatten(k, arrays, depth + 1)): _unflatten(v, arrays, depth + 1)
                for k, v in value
            }
        if kind == "n" and isinstance(value, list) and len(value) == 4:
            module, qualname, fields, items = value
            cls = _named_tuple(module, qualname, fields)
            return cls._make(_unflatten(v, arrays, depth + 1) for v in items)
    except CorruptEntry:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise CorruptEntry(f"entry header holds a malformed {kind!r} node: {exc}") from None
    raise CorruptEntry(f"entry header holds a malformed {kind!r} node")


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise CorruptEntry("entry header holds an unhashable dict key")
    return key


def _dtype(name: Any) -> np.dtype:
    """A plain numeric dtype (no objects, no fields), or CorruptEntry."""
    if not isinstance(name, str):
        raise CorruptEntry("entry header names a dtype that is not a string")
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise CorruptEntry(f"entry header names an unknown dtype {name!r}") from None
    if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CorruptEntry(f"entry header names dtype {name!r}, which entries never hold")
    return dtype


def _named_tuple(module: Any, qualname: Any, fields: Any) -> Any:
    """The named tuple type ``module.qualname`` with ``fields``, if this process has loaded
    it; nothing is imported."""
    loaded = sys.modules.get(module) if isinstance(module, str) else None
    cls: Any = loaded
    for part in qualname.split(".") if isinstance(qualname, str) and loaded else ["<"]:
        cls = getattr(cls, part, None) if part != "<locals>" else None
    if not (
        isinstance(cls, type)
        and issubclass(cls, tuple)
        and list(getattr(cls, "_fields", ())) == fields
        and callable(getattr(cls, "_make", None))
    ):
        raise CorruptEntry(f"entry names a named tuple {module}.{qualname} not loaded here")
    return cls


def _leaf(fields: Any) -> _Leaf:
    slot, codec, dtype, shape, tensor, meta, nbytes = fields
    if not (
        type(slot) is int
        and isinstance(codec, str)
        and isinstance(shape, list)
        and all(type(d) is int and d >= 0 for d in shape)
        and type(tensor) is bool
        and isinstance(meta, dict)
        and type(nbytes) is int
        and nbytes >= 0
    ):
        raise ValueError("a leaf's fields are not what entries write")
    return _Leaf(slot, codec, _dtype(dtype).str, tuple(shape), tensor, meta, nbytes)


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
