"""The differential harness: its helpers import by their own names (``cases``, ``compare``,
``harness``), here and in the spawned workers that unpickle its datasets."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What each campaign ran, and what its time budget let go of."""
    from harness import BUDGETS

    for budget in BUDGETS:
        if budget.started is not None:
            terminalreporter.write_line(budget.summary())
