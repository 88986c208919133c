"""The Python examples of the README and of the design notes (docs/) run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
DOC_BLOCKS = [
    (f"{path.stem}{k}", code)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for k, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL))
]


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


def test_the_seams_note_has_its_examples() -> None:
    assert sum(name.startswith("seams") for name, _ in DOC_BLOCKS) == 5


@pytest.mark.parametrize(
    "code",
    [*BLOCKS, *(code for _, code in DOC_BLOCKS)],
    ids=[*(f"block{i}" for i in range(len(BLOCKS))), *(name for name, _ in DOC_BLOCKS)],
)
def test_readme_example_runs(code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
