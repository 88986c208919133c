"""``learned``: a small convolutional autoencoder for uint8 images, trained on the user's data.

The encoder ``f`` maps an image to a latent 8x smaller on each side; the latent is quantised
to 8 bits (``bits=8``) or 16 and entropy-coded with zstd; the decoder ``g`` maps it back.
Training (``drapps codec train``, :func:`train_codec`) minimises::

    ||x - g(q(f(x)))||^2 + lambda * mean |f(x)|

with ``q`` replaced by uniform noise of one quantisation step while training (so gradients
pass), and the L1 norm of the latent as a differentiable stand-in for its coded size (small
values are cheaper after quantisation and zstd). The trained codec is a file
(:meth:`LearnedCodec.save`); ``Cache(codecs=(..., LearnedCodec.load(path)), min_psnr=...)``
offers it to the controller, which uses it only where its measured cost wins. On a CPU it
is far slower than JPEG (see ``docs/cache.md``): a GPU decoding latents in the device stage is
where it could pay.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from drapps._optional import require
from drapps.cache.codec import Codec, Encoded
from drapps.cache.jpeg import from_hwc, image_layout, to_hwc

_STRIDE = 8  # three stride-2 convolutions
_RANGE = 4.0  # latents are clipped to [-_RANGE, _RANGE] before quantisation


def autoencoder(latent: int, width: int = 32) -> tuple[nn.Module, nn.Module]:
    """(encoder, decoder): 3 -> ``latent`` channels at 1/8 the size, and back."""
    encoder = nn.Sequential(
        nn.Conv2d(3, width, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv2d(width, width, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv2d(width, latent, 5, stride=2, padding=2),
    )
    decoder = nn.Sequential(
        nn.ConvTranspose2d(latent, width, 5, stride=2, padding=2, output_padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(width, width, 5, stride=2, padding=2, output_padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(width, 3, 5, stride=2, padding=2, output_padding=1),
    )
    return encoder, decoder


class LearnedCodec(Codec):
    """An autoencoder codec for RGB uint8 images (HWC or CHW); declines anything else.

    Args:
        encoder, decoder: from :func:`autoencoder` (trained).
        latent: latent channels.
        bits: 8 or 16 bits per latent value.
        level: zstd level of the entropy coder.
    """

    lossy = True
    name = "learned"

    def __init__(
        self, encoder: nn.Module, decoder: nn.Module, latent: int, bits: int = 8, level: int = 3
    ) -> None:
        if bits not in (8, 16):
            raise ValueError(f"bits must be 8 or 16, got {bits!r}")
        self.encoder, self.decoder = encoder.eval(), decoder.eval()
        self.latent, self.bits, self.level = latent, bits, level

    @property
    def step(self) -> float:
        """One quantisation step of the latent."""
        return 2 * _RANGE / ((1 << self.bits) - 1)

    @torch.no_grad()
    def encode(self, array: np.ndarray) -> Encoded | None:
        layout = image_layout(array)
        if layout not in ("HWC", "CHW") or array.shape[2 if layout == "HWC" else 0] != 3:
            return None
        image = to_hwc(array, layout)
        h, w = image.shape[:2]
        x = _padded(torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255)
        z = self.encoder(x).clamp(-_RANGE, _RANGE)
        store = torch.uint8 if self.bits == 8 else torch.int16
        q = torch.round((z + _RANGE) / self.step)
        if self.bits == 16:
            q = q - 32768
        payload = (
            require("zstandard")
            .ZstdCompressor(level=self.level)
            .compress(q.to(store).numpy().tobytes())
        )
        return Encoded(
            payload, {"layout": layout, "latent": list(z.shape[1:]), "hw": [h, w]}, exact=False
        )

    @torch.no_grad()
    def decode(
        self, payload: memoryview, meta: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...]
    ) -> np.ndarray:
        raw = require("zstandard").ZstdDecompressor().decompress(payload)
        store = np.uint8 if self.bits == 8 else np.int16
        q = torch.from_numpy(np.frombuffer(raw, dtype=store).astype(np.float32))
        if self.bits == 16:
            q = q + 32768
        z = (q * self.step - _RANGE).reshape(1, *meta["latent"])
        h, w = meta["hw"]
        x = self.decoder(z)[0, :, :h, :w]
        image = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        return from_hwc(np.ascontiguousarray(image), meta["layout"]).reshape(shape)

    def save(self, path: str | os.PathLike[str]) -> None:
        torch.save(
            {
                "encoder": self.encoder.state_dict(),
                "decoder": self.decoder.state_dict(),
                "latent": self.latent,
                "bits": self.bits,
                "level": self.level,
            },
            path,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LearnedCodec:
        """A codec saved by :meth:`save` (or ``drapps codec train``).

        Raises:
            ValueError: the file is not a saved learned codec.
        """
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            encoder, decoder = autoencoder(int(state["latent"]))
            encoder.load_state_dict(state["encoder"])
            decoder.load_state_dict(state["decoder"])
        except (OSError, KeyError, RuntimeError, TypeError, pickle.UnpicklingError) as exc:
            raise ValueError(
                f"{os.fspath(path)!r} is not a learned codec saved by drapps: {exc}"
            ) from None
        return cls(encoder, decoder, int(state["latent"]), int(state["bits"]), int(state["level"]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__}

    def __repr__(self) -> str:
        return f"LearnedCodec(latent={self.latent}, bits={self.bits})"


def _padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` (N, C, H, W) padded on the bottom and right to multiples of the stride."""
    h, w = x.shape[-2:]
    pad_h, pad_w = -h % _STRIDE, -w % _STRIDE
    if pad_h or pad_w:
        x = nn.functional.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
    return x


def crops(
    images: Sequence[np.ndarray], size: int, batch: int, rng: np.random.Generator
) -> Iterator[torch.Tensor]:
    """Endless batches of random ``size`` x ``size`` crops (N, 3, size, size) in [0, 1]."""
    while True:
        out = []
        for _ in range(batch):
            image = images[int(rng.integers(len(images)))]
            top = int(rng.integers(image.shape[0] - size + 1))
            left = int(rng.integers(image.shape[1] - size + 1))
            out.append(image[top : top + size, left : left + size])
        yield torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255


def train_codec(
    images: Sequence[np.ndarray],
    *,
    latent: int = 8,
    lmbda: float = 0.01,
    steps: int = 2000,
    batch: int = 16,
    crop: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    bits: int = 8,
) -> tuple[LearnedCodec, list[float]]:
    """Train an autoencoder codec on random crops of ``images`` (HWC uint8 RGB).

    Returns:
        The codec, and the loss every 100 steps.

    Raises:
        ValueError: no images, or one smaller than ``crop``.
    """
    if not images:
        raise ValueError("train_codec needs at least one image")
    small = [i for i, im in enumerate(images) if min(im.shape[:2]) < crop or im.ndim != 3]
    if small:
        raise ValueError(f"images {small[:5]} are not RGB images of at least {crop} x {crop}")
    torch.manual_seed(seed)
    encoder, decoder = autoencoder(latent)
    params = [*encoder.parameters(), *decoder.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    step_size = 2 * _RANGE / ((1 << bits) - 1)
    losses, running = [], 0.0
    source = crops(images, crop, batch, np.random.default_rng(seed))
    for step in range(steps):
        x = next(source)
        z = encoder(x).clamp(-_RANGE, _RANGE)
        noisy = z + (torch.rand_like(z) - 0.5) * step_size  # quantisation, differentiably
        loss = nn.functional.mse_loss(decoder(noisy), x) + lmbda * z.abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        running += loss.item()
        if (step + 1) % 100 == 0:
            losses.append(running / 100)
            running = 0.0
    return LearnedCodec(encoder, decoder, latent, bits), losses
