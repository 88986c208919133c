"""A corpus packed into fixed-length token samples, and writing such a corpus.

Documents are joined by ``<|endoftext|>`` into one UTF-8 file; each sample tokenises a window
of it with GPT-2's BPE (:func:`drapps.ops.text.gpt2_encoding`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from drapps.datasets._fingerprint import file_fingerprint
from drapps.ops.text import EOT, gpt2_encoding


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
