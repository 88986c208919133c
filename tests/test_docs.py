"""The Python examples in the design notes run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCKS = [
    (f"{path.name}-{k}", code)
    for path in sorted(DOCS.glob("*.md"))
    for k, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL))
]


def test_the_seams_note_has_its_examples() -> None:
    assert sum(name.startswith("seams.md") for name, _ in BLOCKS) == 3


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[n for n, _ in BLOCKS])
def test_docs_example_runs(code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
