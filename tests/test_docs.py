"""The guide's full signature of drapps.Loader is the constructor's, every argument in order."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import drapps

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def test_the_full_signature_lists_every_argument_with_its_default() -> None:
    block = re.search(r"```\n(drapps\.Loader\(.*?\))\n```", GUIDE.read_text(), re.DOTALL)
    assert block is not None, "docs/guide.md has no full signature block"
    documented = re.findall(r"(\w+)=([^,)\s]+)", block[1])
    parameters = [
        p for p in inspect.signature(drapps.Loader.__init__).parameters.values() if p.name != "self"
    ]
    assert [name for name, _ in documented] == [p.name for p in parameters[1:]]  # after dataset
    for (name, text), parameter in zip(documented, parameters[1:], strict=True):
        default = parameter.default
        assert text == (f'"{default}"' if isinstance(default, str) else repr(default)), name
