"""WikiText raw files as GPT-2 BPE windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drapps.datasets import WikiText, write_wikitext
from drapps.ops.text import gpt2_encoding

TEXT = (
    " = Valkyria Chronicles III = \n\n Senjō no Valkyria 3 : Unrecorded Chronicles is a game . \n"
    * 20
)


def test_windows_are_the_bpe_stream_shifted_by_one(tmp_path: Path) -> None:
    write_wikitext(tmp_path, {"train": TEXT, "valid": TEXT[:400]})
    ds = WikiText(tmp_path, "train", seq_len=16)
    ids = gpt2_encoding().encode_ordinary(TEXT)
    assert len(ds) == (len(ids) - 1) // 16
    x, y = ds[2]
    assert x.dtype == torch.int64 and x.shape == (16,)
    assert x.tolist() == ids[32:48] and y.tolist() == ids[33:49]
    assert len(WikiText(tmp_path / "wikitext-2-raw", "valid", seq_len=8)) > 0


def test_tokens_files_and_errors_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    (folder / "wiki.test.tokens").write_text(TEXT)
    assert len(WikiText(tmp_path, "test", seq_len=32)) > 0
    with pytest.raises(FileNotFoundError, match=r"wiki\.valid\.raw"):
        WikiText(tmp_path, "valid")
    with pytest.raises(ValueError, match="split"):
        WikiText(tmp_path, "dev")
    with pytest.raises(ValueError, match="fewer than one window"):
        WikiText(tmp_path, "test", seq_len=100_000)
    with pytest.raises(IndexError):
        WikiText(tmp_path, "test", seq_len=32)[10_000]
