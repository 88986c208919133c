from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drapps.datasets.packed_text import PackedText, write_corpus
from drapps.ops.text import EOT_ID, gpt2_encoding


def test_gpt2_encoding_matches_gpt2() -> None:
    encoding = gpt2_encoding()
    assert encoding.n_vocab == 50257
    assert encoding.encode("Hello world") == [15496, 995]
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [EOT_ID]


def test_packed_samples_are_shifted_windows(tmp_path: Path) -> None:
    sources = []
    for i in range(3):
        sources.append(tmp_path / f"{i}.txt")
        sources[-1].write_text(f"Document {i}. " + "Words follow words. " * 400)
    corpus = write_corpus(sources, tmp_path / "corpus.txt")
    assert corpus.read_text().count("<|endoftext|>") == 3
    data = PackedText(corpus, seq_len=64, stride=1000)
    assert len(data) == corpus.stat().st_size // 1000
    x, y = data[1]
    assert x.shape == y.shape == (64,) and x.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])  # labels are the next tokens
    assert (
        data.tokens(1)[:3]
        == gpt2_encoding().encode(corpus.read_bytes()[1000:1100].decode(), allowed_special="all")[
            :3
        ]
    )
    last = data.tokens(len(data) - 1)  # reads past the end: wraps to the start
    assert len(last) == 65
    with pytest.raises(IndexError, match="index 999 out of range"):
        data[999]


def test_small_corpora_and_bad_sizes_are_named(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short")
    with pytest.raises(ValueError, match="fewer than one sample's stride"):
        PackedText(tiny)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        PackedText(tiny, seq_len=0)
    with pytest.raises(ValueError, match="needs at least one source"):
        write_corpus([], tmp_path / "out.txt")
