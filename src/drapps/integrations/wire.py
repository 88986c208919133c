"""A batch as bytes for a network queue, without pickle: a JSON header and raw array bytes.

Pickle would let whoever can write to the queue run code in the training process, so batches
that cross machines use this format instead. It holds what collated batches are made of:
tensors and NumPy arrays (plain dtypes), numbers, strings, bytes, None, and dicts (str keys),
lists and tuples of them. Decoding checks every length and offset against the bytes it was
given before it allocates anything, and refuses what it does not know.

Layout: ``b"DRW1"``, the header's length (uint32, little-endian), the header (UTF-8 JSON), zero
padding to a 64-byte boundary, then each array's bytes at the offset its header entry names.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import torch

MAGIC = b"DRW1"
_LENGTH = struct.Struct("<I")
_ALIGN = 64
_MAX_HEADER = 16 * 2**20
_MAX_DEPTH = 32

# The dtypes a batch may carry (NumPy names); torch-only ones travel as their torch name.
_NUMPY_DTYPES = {
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float16", "float32", "float64", "complex64", "complex128",
}  # fmt: skip
_TORCH_DTYPES = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "uint16": torch.uint16, "int32": torch.int32, "uint32": torch.uint32, "int64": torch.int64,
    "uint64": torch.uint64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float32": torch.float32, "float64": torch.float64, "complex64": torch.complex64,
    "complex128": torch.complex128,
}  # fmt: skip
_TORCH_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}


class WireError(ValueError):
    """Bytes that are not a well-formed batch (or a batch that cannot be written)."""


def encode(batch: Any) -> bytearray:
    """``batch`` as bytes (see the module docstring for what it may hold).

    Raises:
        WireError: it holds something else (a custom object, a GPU tensor, ...).
    """
    arrays: list[np.ndarray] = []
    offset = 0

    def place(raw: np.ndarray) -> tuple[int, int]:
        nonlocal offset
        start = offset
        arrays.append(raw)
        offset = _aligned(start + raw.nbytes)
        return start, raw.nbytes

    def walk(obj: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise WireError(f"the batch nests deeper than {_MAX_DEPTH} levels")
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"v": obj}
        if isinstance(obj, bytes):
            start, size = place(np.frombuffer(obj, np.uint8))
            return {"b": [start, size]}
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.device.type != "cpu":
                raise WireError(f"only dense CPU tensors can be sent, got one on {obj.device}")
            name = _TORCH_NAMES.get(obj.dtype)
            if name is None:
                raise WireError(f"tensors of dtype {obj.dtype} cannot be sent")
            flat = obj.detach().contiguous().reshape(-1)
            raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
            start, size = place(raw)
            return {"t": [name, list(obj.shape), start, size]}
        if isinstance(obj, np.ndarray):
            if obj.dtype.name not in _NUMPY_DTYPES:
                raise WireError(f"arrays of dtype {obj.dtype} cannot be sent")
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
            start, size = place(raw)
            return {"a": [obj.dtype.name, list(obj.shape), start, size]}
        if isinstance(obj, np.generic):
            return walk(obj.item(), depth)
        if isinstance(obj, dict):
            if not all(isinstance(k, str) for k in obj):
                raise WireError("only dicts with str keys can be sent")
            return {"d": {k: walk(v, depth + 1) for k, v in obj.items()}}
        if isinstance(obj, (list, tuple)):
            kind = "l" if isinstance(obj, list) else "u"
            return {kind: [walk(v, depth + 1) for v in obj]}
        raise WireError(
            f"a {type(obj).__name__} cannot be sent through the queue (tensors, arrays, numbers, "
            "strings, bytes, None, and dicts, lists and tuples of them can)"
        )

    tree = walk(batch, 0)
    header = json.dumps(tree, separators=(",", ":")).encode()
    start = _aligned(len(MAGIC) + _LENGTH.size + len(header))
    out = bytearray(start + offset)
    out[: len(MAGIC)] = MAGIC
    _LENGTH.pack_into(out, len(MAGIC), len(header))
    out[len(MAGIC) + _LENGTH.size : len(MAGIC) + _LENGTH.size + len(header)] = header
    view = memoryview(out)
    cursor = 0
    for raw in arrays:
        view[start + cursor : start + cursor + raw.nbytes] = raw.data
        cursor = _aligned(cursor + raw.nbytes)
    return out


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The batch :func:`encode` wrote; tensors and arrays are writable, over one copy of
    ``data``.

    Raises:
        WireError: ``data`` is not a well-formed batch.
    """
    buffer = bytearray(data)  # one copy: the batch is the caller's to modify
    if len(buffer) < len(MAGIC) + _LENGTH.size or bytes(buffer[: len(MAGIC)]) != MAGIC:
        raise WireError("not a drapps batch (bad magic)")
    (length,) = _LENGTH.unpack_from(buffer, len(MAGIC))
    begin = len(MAGIC) + _LENGTH.size
    if length > _MAX_HEADER or begin + length > len(buffer):
        raise WireError(f"header of {length} bytes does not fit in {len(buffer)} bytes")
    try:
        tree = json.loads(bytes(buffer[begin : begin + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"unreadable header: {exc}") from None
    start = _aligned(begin + length)
    body = memoryview(buffer)[start:]

    def span(start_size: Any, itemsize: int, shape: Any) -> tuple[int, int]:
        if not (isinstance(start_size, list) and len(start_size) == 2):
            raise WireError("malformed array entry")
        offset, size = start_size
        if not (isinstance(offset, int) and isinstance(size, int) and offset >= 0 and size >= 0):
            raise WireError("malformed array entry")
        if offset + size > len(body):
            raise WireError(f"an array of {size} bytes at {offset} overruns the batch")
        if shape is not None:
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise WireError(f"malformed shape {shape!r}")
            if int(np.prod(shape, dtype=np.int64)) * itemsize != size:
                raise WireError(f"shape {shape} does not match {size} bytes")
        return offset, size

    def build(node: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
            raise WireError("malformed header")
        ((kind, value),) = node.items()
        if kind == "v":
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise WireError("malformed value")
            return value
        if kind == "b":
            offset, size = span(value, 1, None)
            return bytes(body[offset : offset + size])
        if kind in ("t", "a"):
            if not (isinstance(value, list) and len(value) == 4):
                raise WireError("malformed array entry")
            name, shape, offset, size = value
            if kind == "t":
                dtype = _TORCH_DTYPES.get(name) if isinstance(name, str) else None
                if dtype is None:
                    raise WireError(f"unknown tensor dtype {name!r}")
                offset, size = span([offset, size], dtype.itemsize, shape)
                if size == 0:
                    return torch.empty(shape, dtype=dtype)
                return torch.frombuffer(body, dtype=dtype, count=size // dtype.itemsize,
                                        offset=offset).view(shape)  # fmt: skip
            if name not in _NUMPY_DTYPES:
                raise WireError(f"unknown array dtype {name!r}")
            np_dtype = np.dtype(name)
            offset, size = span([offset, size], np_dtype.itemsize, shape)
            return np.frombuffer(body, np_dtype, size // np_dtype.itemsize, offset).reshape(shape)
        if kind == "d" and isinstance(value, dict):
            return {str(k): build(v, depth + 1) for k, v in value.items()}
        if kind in ("l", "u") and isinstance(value, list):
            items = [build(v, depth + 1) for v in value]
            return items if kind == "l" else tuple(items)
        raise WireError(f"unknown entry kind {kind!r}")

    return build(tree, 0)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
