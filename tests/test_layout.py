"""Each subpackage's README names every module in it (and in its folders)."""

from __future__ import annotations

from pathlib import Path

import pytest

import drapps

ROOT = Path(drapps.__file__).parent
PACKAGES = sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_the_package_readme_names_every_module(package: Path) -> None:
    readme = package / "README.md"
    assert readme.is_file(), f"{package.name} has no README.md"
    text = readme.read_text()
    missing = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "__init__.py" and path.name not in text
    ]
    assert missing == []


def test_the_top_readme_names_every_subpackage() -> None:
    text = (ROOT.parents[1] / "README.md").read_text()
    assert [p.name for p in PACKAGES if f"src/drapps/{p.name}/" not in text] == []
