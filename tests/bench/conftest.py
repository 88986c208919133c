from __future__ import annotations

from pathlib import Path

import pytest

SENTENCE = (
    "the loader keeps a training loop fed while workers decode images and tokenise text "
    "for every batch that the model asks for in each epoch of the run"
)
WORDS = SENTENCE.split(" ")


@pytest.fixture()
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small folder of *.txt documents, used as the text workload's corpus."""
    root = tmp_path / "corpus"
    root.mkdir()
    for doc in range(6):
        lines = [
            " ".join(WORDS[(doc + i + j) % len(WORDS)] for j in range(12)) + f" ({doc}.{i})."
            for i in range(160)
        ]
        (root / f"doc{doc}.rst.txt").write_text("\n".join(lines))
    monkeypatch.setenv("DRAPPS_TEXT_CORPUS", str(root))
    return root
