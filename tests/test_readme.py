"""The Python examples of the README and of the design notes (docs/) run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts real engines or interpreters

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
DOC_BLOCKS = [
    (f"{path.stem}{k}", code)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for k, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL))
]


def test_the_readme_has_its_quickstart() -> None:
    assert len(BLOCKS) >= 1
    assert "drapps.Loader(" in BLOCKS[0] and "report()" in BLOCKS[0]


def test_the_readme_is_a_front_door() -> None:
    """Short, and no issue numbers or commit narration in what a user reads."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    user_facing = [README, *sorted((ROOT / "docs").glob("*.md"))]
    narrated = [
        f"{path.name}: {line.strip()}"
        for path in user_facing
        for line in path.read_text().splitlines()
        if re.search(r"\bissues?\b|#\d{2,}\b", line, flags=re.IGNORECASE)
    ]
    assert narrated == []


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


CORE_PYTHON = ROOT / ".venv-core" / "bin" / "python"  # `make core`: drapps with no extras
NEEDS = re.compile(r"pip install 'drapps-loader\[(\w+)\]'|No module named '(\w+)")


def blocks_with_context() -> list[tuple[str, str, str]]:
    """(id, the text between the previous block and this one, code) for every Python block."""
    found = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        previous_end = 0
        for k, match in enumerate(re.finditer(r"```python\n(.*?)```", text, re.DOTALL)):
            found.append((f"{path.stem}{k}", text[previous_end : match.start()], match[1]))
            previous_end = match.end()
    return found


@pytest.mark.skipif(not CORE_PYTHON.exists(), reason="needs the no-extras install: make core")
@pytest.mark.parametrize(
    ("context", "code"),
    [(context, code) for _, context, code in blocks_with_context()],
    ids=[name for name, _, _ in blocks_with_context()],
)
def test_every_example_names_the_extra_it_needs(context: str, code: str, tmp_path: Path) -> None:
    """Run with no extras installed, an example either works or the words before it name the
    extra that its error asks for."""
    from drapps._optional import _EXTRAS

    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [str(CORE_PYTHON), str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    if done.returncode == 0:
        return
    needs = NEEDS.search(done.stderr)
    assert needs is not None, done.stderr[-2000:]  # it failed for another reason than an extra
    extra = needs[1] or _EXTRAS.get(needs[2], needs[2])
    assert re.search(rf"`{extra}`|\[[\w,]*\b{extra}\b[\w,]*\]", context), (
        f"the example fails without the {extra!r} extra, and the text before it does not name it"
    )
