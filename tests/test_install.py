"""Every install line the project prints or documents installs this project, never the index's
own ``drapps`` (DataRobot's command-line client, a different package with the same import name)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from drapps import _optional
from drapps._optional import DISTRIBUTION, install_hint, require

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TEXTS = sorted(
    [
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / ".ci").glob("*"),
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "src").rglob("README.md"),
        ROOT / "README.md",
        ROOT / "Makefile",
    ]
)
# `pip install NAME[...]`, `pip install 'NAME[...]'` or a bare `pip install NAME`
INSTALL = re.compile(r"pip install (?:-\S+ )*['\"]?([A-Za-z][\w.-]*)(\[[\w,]+\])?")


def install_lines() -> list[tuple[str, str, str | None]]:
    found = []
    for path in TEXTS:
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        for name, extras in INSTALL.findall(path.read_text()):
            found.append((str(path.relative_to(ROOT)), name, extras or None))
    return found


def test_the_distribution_is_the_projects_own() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "drapps-loader"
    assert install_hint("ray") == "pip install 'drapps-loader[ray]'"


def test_every_install_line_with_extras_names_the_projects_distribution() -> None:
    lines = install_lines()
    with_extras = [(where, name) for where, name, extras in lines if extras]
    assert len(with_extras) >= 5, "the scan found too few install hints to mean anything"
    assert [(w, n) for w, n in with_extras if n != DISTRIBUTION] == []


def test_no_line_tells_a_user_to_install_the_index_drapps() -> None:
    assert [(where, name) for where, name, _ in install_lines() if name == "drapps"] == []


def test_the_scan_would_see_a_wrong_hint() -> None:
    """The pattern catches the mistakes the tests above guard against."""
    assert INSTALL.findall("pip install 'drapps[ray]'") == [("drapps", "[ray]")]
    assert INSTALL.findall("pip install drapps") == [("drapps", "")]
    assert INSTALL.findall("pip install -q 'drapps-loader[tf]'") == [("drapps-loader", "[tf]")]


def test_every_extra_a_hint_names_exists() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert sorted(set(_optional._EXTRAS.values()) - set(extras)) == []
    named = {extra.strip("[]") for _, name, extra in install_lines() if extra}
    assert (
        sorted(e for group in named for e in group.split(",") if e not in extras and e != "extra")
        == []
    )


def test_a_missing_module_names_the_distribution_and_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(_optional._EXTRAS, "drapps_no_such_module", "ray")
    with pytest.raises(ImportError, match=re.escape("pip install 'drapps-loader[ray]'")):
        require("drapps_no_such_module")
