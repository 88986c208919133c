"""The learned codec: trains, round-trips images at a measurable quality, saves and loads, and
is used through the cache like any codec; its commands write what they say."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from test_codecs import photo

from drapps.cache import psnr
from drapps.cache.entry import pack, unpack
from drapps.cache.learned import LearnedCodec, train_codec
from drapps.cache.none import Raw
from drapps.cli import main

# The learned codec measures with scikit-image (the bench extra): the integration tier.
pytestmark = pytest.mark.extras
pytest.importorskip("skimage")


@pytest.fixture(scope="module")
def trained() -> LearnedCodec:
    images = [np.roll(photo(96, 96), shift, axis=1) for shift in range(0, 60, 6)]
    codec, losses = train_codec(images, latent=8, steps=300, batch=8, crop=32)
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns
    return codec


def test_it_round_trips_an_image_smaller_and_close(trained: LearnedCodec) -> None:
    image = photo(70, 90)  # not a multiple of the stride: padded, then cropped back
    encoded = trained.encode(image)
    assert encoded is not None and not encoded.exact
    back = trained.decode(memoryview(encoded.payload), encoded.meta, image.dtype, image.shape)
    assert back.shape == image.shape and back.dtype == np.uint8
    assert len(encoded.payload) < image.nbytes / 4
    assert psnr(image, back) > 20
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))
    enc = trained.encode(chw)
    assert enc is not None
    assert (
        trained.decode(memoryview(enc.payload), enc.meta, chw.dtype, chw.shape).shape == chw.shape
    )
    assert (
        trained.encode(image[:, :, 0]) is None and trained.encode(image.astype(np.float32)) is None
    )


def test_it_saves_loads_and_serves_cache_entries(trained: LearnedCodec, tmp_path: Path) -> None:
    trained.save(tmp_path / "ae.pt")
    loaded = LearnedCodec.load(tmp_path / "ae.pt")
    image = photo(64, 64)
    first, second = trained.encode(image), loaded.encode(image)
    assert first is not None and second is not None and first.payload == second.payload
    entry = pack((image, 7), loaded, Raw(), min_psnr=15.0)
    (back, label), exact, _ = unpack(bytearray(entry.data), {"learned": loaded, "none": Raw()})
    assert not exact and label == 7 and psnr(image, back) > 15
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="is not a learned codec saved by drapps"):
        LearnedCodec.load(tmp_path / "junk.pt")


def test_codec_train_and_compare_write_a_model_and_the_tables(tmp_path: Path) -> None:
    folder = tmp_path / "images" / "a"
    folder.mkdir(parents=True)
    for i in range(4):
        (folder / f"{i}.jpg").write_bytes(
            simplejpeg.encode_jpeg(np.roll(photo(72, 80), 9 * i, axis=0), quality=90)
        )
    model = tmp_path / "ae.pt"
    assert (
        main(
            [
                "codec",
                "train",
                "--data",
                str(tmp_path / "images"),
                "--out",
                str(model),
                "--steps",
                "100",
                "--images",
                "4",
            ]
        )
        == 0
    )
    out = tmp_path / "out"
    args = [
        "codec",
        "compare",
        "--data",
        str(tmp_path / "images"),
        "--images",
        "4",
        "--codecs",
        "none,zstd,jpeg",
        "--learned",
        str(model),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    result = json.loads((out / "codecs.json").read_text())
    names = [row["codec"] for row in result["codecs"]]
    assert names == ["none", "zstd", "jpeg", "learned (ae.pt)"]
    assert result["codecs"][0]["psnr"] == float("inf") and result["codecs"][0]["ratio"] < 1.01
    curve = result["jpeg_curve"]
    assert [r["quality"] for r in curve][:2] == [10, 20]
    assert curve[-1]["psnr"] > curve[0]["psnr"] and curve[-1]["bpp"] > curve[0]["bpp"]
    assert "JPEG rate-distortion" in (out / "codecs.md").read_text()
    assert main(["codec", "compare", "--data", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
