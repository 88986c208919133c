"""WikiText-2 (or -103) from its raw token files, as GPT-2 BPE training windows.

The published layout is ``wikitext-2-raw/wiki.{train,valid,test}.raw`` (the ``.tokens`` files
of the non-raw variant are read the same way). Nothing is downloaded: point ``root`` at the
folder or its parent.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

SPLITS = ("train", "valid", "test")


def _find(root: Path, split: str) -> Path:
    for folder in (root, root / "wikitext-2-raw", root / "wikitext-2", root / "wikitext-103-raw"):
        for suffix in (".raw", ".tokens"):
            path = folder / f"wiki.{split}{suffix}"
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"no WikiText {split} split under {root}: expected wikitext-2-raw/wiki.{split}.raw"
    )


class WikiText:
    """One split tokenised once with GPT-2's BPE, cut into ``seq_len + 1``-token windows.

    Item ``i`` is ``(input_ids, labels)``: tokens ``[i*seq_len, (i+1)*seq_len)`` and the same
    shifted by one, int64, the standard language-modelling layout with no padding. The tokens
    are held as uint16 (GPT-2's 50,257 ids fit), about 4 MB for WikiText-2's train split.

    Args:
        root: the ``wikitext-2-raw`` folder or its parent.
        split: ``"train"``, ``"valid"`` or ``"test"``.
        seq_len: tokens per window.

    Example:
        >>> import tempfile
        >>> scratch = tempfile.TemporaryDirectory()
        >>> root = write_wikitext(scratch.name, {"valid": " = Intro = \\n" * 200})
        >>> ds = WikiText(root, "valid", seq_len=16)  # or the folder of the published files
        >>> x, y = ds[0]
        >>> x.shape, bool((x[1:] == y[:-1]).all())
        (torch.Size([16]), True)
        >>> scratch.cleanup()
    """

    def __init__(self, root: str | os.PathLike[str], split: str = "train", seq_len: int = 1024):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
        from drapps.ops.text import gpt2_encoding

        self.path = _find(Path(root), split)
        text = self.path.read_text(encoding="utf-8", errors="replace")
        ids = gpt2_encoding().encode_ordinary(text)
        self.tokens = np.asarray(ids, dtype=np.uint16)
        self.seq_len = seq_len
        if len(self) == 0:
            raise ValueError(
                f"{self.path} has {self.tokens.size} tokens, fewer than one window of "
                f"{seq_len + 1}; use a shorter seq_len"
            )

    def __len__(self) -> int:
        return max(0, (self.tokens.size - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        start = index * self.seq_len
        window = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


def write_wikitext(root: str | os.PathLike[str], splits: dict[str, str]) -> Path:
    """Write ``{split: text}`` as ``root/wikitext-2-raw/wiki.{split}.raw``; returns the folder."""
    folder = Path(root) / "wikitext-2-raw"
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in splits.items():
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        (folder / f"wiki.{split}.raw").write_text(text, encoding="utf-8")
    return folder
