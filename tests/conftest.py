from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import leaks

# The seed of the Hypothesis tests that explore (the differential campaigns in the slow tier;
# the fast tier's are derandomized): chosen once per run, printed in the header and the
# summary, and replayed
# by setting DRAPPS_DIFF_SEED (or pytest's --hypothesis-seed).
os.environ.setdefault("DRAPPS_DIFF_SEED", str(random.randrange(2**32)))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("hypothesis_seed", None) is None:
        import hypothesis.core

        hypothesis.core.global_force_seed = int(os.environ["DRAPPS_DIFF_SEED"])


def _seed_line() -> str:
    return f"Hypothesis campaigns: DRAPPS_DIFF_SEED={os.environ['DRAPPS_DIFF_SEED']} replays them"


def pytest_report_header() -> str:
    return _seed_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The seed again at the end, which ``-q`` (the Makefile's) keeps: a failed campaign
    is replayed from it."""
    terminalreporter.write_line(_seed_line())


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test must leave no worker processes, drapps threads or shared-memory slabs."""
    yield
    left = leaks()
    assert not left, f"test left resources behind: {left}"


class _ErrorsLogged(logging.Handler):
    """drapps' records that carry an error itself: its traceback holds the frames it passed
    through (the training loop's, and the loader through them), and a handler that keeps
    records (pytest's own) would keep them alive. A record carries the error's text."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if any(isinstance(a, BaseException) for a in args):
            self.found.append(f"{record.name}: {record.msg!r}")


_errors_logged = _ErrorsLogged()
logging.getLogger("drapps").addHandler(_errors_logged)


@pytest.fixture(autouse=True)
def no_errors_in_log_records() -> Iterator[None]:
    _errors_logged.found.clear()
    yield
    assert not _errors_logged.found, f"a log record holds an error: {_errors_logged.found}"
