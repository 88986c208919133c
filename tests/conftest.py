from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import leaks


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test must leave no worker processes, drapps threads or shared-memory slabs."""
    yield
    left = leaks()
    assert not left, f"test left resources behind: {left}"
