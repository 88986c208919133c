"""Each codec's round trip, the entry format, and the registry."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from drapps.cache import CODECS, Cache, available, psnr
from drapps.cache.entry import CorruptEntry, pack, unpack
from drapps.cache.none import Raw


def photo(h: int = 64, w: int = 48) -> np.ndarray:
    """A smooth colour image (what JPEG is made for)."""
    y, x = np.mgrid[0:h, 0:w]
    channels = [128 + 100 * np.sin(x / 7 + k) * np.cos(y / 9 - k) for k in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


ARRAYS = {
    "image": photo(),
    "tokens": np.random.default_rng(0).integers(0, 50257, 1025).astype(np.int64),
    "floats": np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32),
    "scalar": np.array(3.5),
}
LOSSLESS = ["none", "lz4", "zstd", "zstd-1", "zstd-9"]


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("kind", list(ARRAYS))
def test_lossless_codecs_round_trip_exactly(name: str, kind: str) -> None:
    codec, array = CODECS.get(name), ARRAYS[kind]
    encoded = codec.encode(array)
    assert encoded is not None and encoded.exact
    back = codec.decode(memoryview(bytes(encoded.payload)), encoded.meta, array.dtype, array.shape)
    assert back.dtype == array.dtype and np.array_equal(back, array)
    assert back.flags.writeable or name == "none"


def test_quantize_narrows_token_ids_exactly_and_declines_what_does_not_fit() -> None:
    tokens = ARRAYS["tokens"]
    encoded = CODECS.get("quantize-16").encode(tokens)
    assert encoded is not None and encoded.exact
    assert len(encoded.payload) == tokens.size * 2  # a quarter of int64
    back = CODECS.get("quantize-16").decode(
        memoryview(encoded.payload), encoded.meta, tokens.dtype, tokens.shape
    )
    assert np.array_equal(back, tokens)
    assert CODECS.get("quantize-8").encode(tokens) is None  # 50,257 ids do not fit in 8 bits
    assert CODECS.get("quantize-16").encode(ARRAYS["image"]) is None  # uint8 is narrower


@pytest.mark.parametrize("bits", [8, 16])
def test_quantize_keeps_floats_within_its_declared_bound(bits: int) -> None:
    codec, floats = CODECS.get(f"quantize-{bits}"), ARRAYS["floats"]
    encoded = codec.encode(floats)
    assert encoded is not None and not encoded.exact
    back = codec.decode(memoryview(encoded.payload), encoded.meta, floats.dtype, floats.shape)
    assert back.dtype == np.float32
    assert np.abs(back - floats).max() <= encoded.meta["max_error"] * 1.0001
    assert encoded.meta["max_error"] == pytest.approx(np.ptp(floats) / (2 * (2**bits - 1)))


@pytest.mark.parametrize("layout", ["HWC", "CHW", "HW"])
def test_jpeg_round_trips_images_in_each_layout_and_declines_the_rest(layout: str) -> None:
    image = photo()
    array = {"HWC": image, "CHW": image.transpose(2, 0, 1).copy(), "HW": image[:, :, 0].copy()}[
        layout
    ]
    codec = CODECS.get("jpeg")
    encoded = codec.encode(array)
    assert encoded is not None and not encoded.exact
    assert len(encoded.payload) < array.nbytes
    back = codec.decode(memoryview(encoded.payload), encoded.meta, array.dtype, array.shape)
    assert back.shape == array.shape and psnr(array, back) > 30
    assert codec.encode(ARRAYS["floats"]) is None
    assert codec.encode(ARRAYS["tokens"]) is None


def test_psnr_is_infinite_for_equal_arrays_and_uses_255_as_the_peak_of_bytes() -> None:
    a = photo()
    assert psnr(a, a) == float("inf")
    b = a.astype(np.int16) + 1
    assert psnr(a, np.clip(b, 0, 255).astype(np.uint8)) == pytest.approx(48.13, abs=0.2)


Pair = namedtuple("Pair", ["image", "meta"])


def test_an_entry_keeps_the_structure_and_kinds_of_a_sample() -> None:
    sample = (Pair(torch.from_numpy(photo()), {"label": 3, "name": "x"}), [np.arange(5)], b"raw")
    packed = pack(sample, CODECS.get("zstd"), Raw(), None)
    assert packed.exact and packed.codecs == {"zstd"}
    codecs = {"zstd": CODECS.get("zstd"), "none": Raw()}
    back, exact, written_by = unpack(bytearray(packed.data), codecs)
    assert written_by == {"zstd"}
    assert exact
    assert isinstance(back, tuple) and isinstance(back[0], Pair)
    assert isinstance(back[0].image, torch.Tensor) and torch.equal(back[0].image, sample[0].image)
    assert back[0].meta == {"label": 3, "name": "x"}
    assert isinstance(back[1], list) and np.array_equal(back[1][0], np.arange(5))
    assert back[2] == b"raw"


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_an_entry_keeps_the_shape_of_scalars_and_strided_arrays(codec: str) -> None:
    sample = {
        "index": torch.tensor(7),  # 0-d: a sample's label or index, as datasets return them
        "score": np.float32(0.5),
        "column": np.arange(12).reshape(3, 4)[:, 1],  # not contiguous
    }
    raw = Raw()
    codecs = {codec: CODECS.get(codec), "none": raw}
    back, _, _ = unpack(bytearray(pack(sample, codecs[codec], raw, None).data), codecs)
    assert back["index"].shape == () and back["index"].item() == 7
    assert np.shape(back["score"]) == () and float(back["score"]) == 0.5
    assert np.array_equal(back["column"], [1, 5, 9])


def test_a_flipped_or_torn_entry_is_refused() -> None:
    data = bytearray(pack((photo(), 1), Raw(), Raw(), None).data)
    codecs = {"none": Raw()}
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(CorruptEntry):
        unpack(flipped, codecs)
    with pytest.raises(CorruptEntry):
        unpack(data[: len(data) - 10], codecs)
    with pytest.raises(CorruptEntry):
        unpack(data[:5], codecs)
    unpack(data, codecs)  # the intact entry reads


def test_a_lossy_codec_is_used_only_above_the_psnr_floor() -> None:
    jpeg, image = CODECS.get("jpeg"), photo()
    without = pack((image,), jpeg, Raw(), None)
    written_by = unpack(bytearray(without.data), {"jpeg": jpeg, "none": Raw()}).codecs
    assert without.exact and written_by == {"jpeg", "none"}  # asked, declined
    allowed = pack((image,), jpeg, Raw(), 30.0)
    assert not allowed.exact and "none" not in allowed.codecs
    too_strict = pack((image,), jpeg, Raw(), 80.0)
    assert too_strict.exact


def test_the_registry_names_its_codecs_and_lists_them_for_an_unknown_one() -> None:
    assert {"none", "lz4", "zstd", "quantize-16", "quantize-8", "jpeg"} <= set(CODECS.names())
    assert {"none", "lz4", "zstd"} <= set(available())
    with pytest.raises(ValueError, match=r"codec must be one of \[.*'zstd'.*\], got 'brotli'"):
        CODECS.get("brotli")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codec": "jpeg"}, "codec 'jpeg' is lossy; allow it with min_psnr"),
        ({"codecs": ("none", "quantize-8", "jpeg")}, "'jpeg' is lossy"),
        ({"memory": "lots"}, "Cache.memory"),
        ({"disk_bytes": -1}, "Cache.disk_bytes"),
        ({"min_psnr": 0}, "min_psnr must be a positive number"),
        ({"codec": "brotli"}, "codec must be one of"),
        ({"codecs": ()}, "at least one codec"),
    ],
)
def test_bad_cache_settings_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Cache(**kwargs)


def test_default_codecs_are_lossless_unless_a_psnr_floor_allows_jpeg() -> None:
    assert [c.name for c in Cache().choices()] == ["none", "quantize-16", "lz4", "zstd"]
    assert "jpeg" in [c.name for c in Cache(min_psnr=35).choices()]
    assert [c.name for c in Cache(codec="lz4").choices()] == ["lz4"]
