"""Settings shared by the harness's tests: a bounded, derandomized run in the fast tier, and
campaigns in the slow tier, which explore from the seed ``tests/conftest.py`` prints
(``DRAPPS_DIFF_SEED`` replays one; ``DRAPPS_DIFF_EXAMPLES`` sets its length and
``DRAPPS_DIFF_BUDGET_S`` the wall-clock time it may take)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis.control import current_build_context
from hypothesis.errors import StopTest, UnsatisfiedAssumption

FAST_EXAMPLES = int(os.environ.get("DRAPPS_DIFF_FAST", "25"))
"""Examples per test in the fast tier."""

FAST = settings(
    max_examples=FAST_EXAMPLES,
    deadline=None,
    derandomize=True,  # the fast tier is the same run every time; the campaigns explore
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


def campaign(examples: int, **more: object) -> settings:
    """Settings of a campaign of ``examples`` examples (``DRAPPS_DIFF_EXAMPLES`` overrides)."""
    return settings(
        max_examples=int(os.environ.get("DRAPPS_DIFF_EXAMPLES", examples)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        **more,  # type: ignore[arg-type]
    )


class Budget:
    """A campaign's wall-clock time, from its first example (``DRAPPS_DIFF_BUDGET_S``; unset or
    0: no limit, the whole length). Once it is spent, the examples left are still drawn, and
    pass unrun: a slow machine runs a shorter prefix of the same seed's sequence, and the seed
    replays whatever it ran. Once an example has failed every example runs, so the failure is
    shrunk and replayed whole.

    For a test whose examples draw all they need before they run (``@given``'s arguments): one
    that stopped drawing early would change what hypothesis recorded of the sequence, and a
    state machine draws its steps as it runs."""

    def __init__(
        self, name: str, seconds: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        if seconds is None:
            seconds = float(os.environ.get("DRAPPS_DIFF_BUDGET_S") or 0)
        self.seconds, self.clock = seconds, clock
        self.started: float | None = None
        self.ended = 0.0  # as the last example that ran ended
        self.ran = self.let_go = 0
        self.failed = False
        BUDGETS.append(self)

    def admits(self) -> bool:
        """Whether the example starting now runs (False: the test returns at once)."""
        now = self.clock()
        if self.started is None:
            self.started = now
        spent = self.seconds > 0 and now - self.started > self.seconds
        if spent and not self.failed and not current_build_context().is_final:
            self.let_go += 1
            return False
        self.ran += 1
        return True

    @contextmanager
    def example(self) -> Iterator[None]:
        """Runs one admitted example, and remembers it if it failed."""
        try:
            yield
        except NOT_FAILURES:
            raise
        except BaseException:
            self.failed = True
            raise
        finally:
            self.ended = self.clock()

    def summary(self) -> str:
        took = 0.0 if self.started is None else self.ended - self.started
        line = f"{self.name}: {self.ran} examples in {took:.0f} s"
        if self.let_go:
            line += f"; {self.let_go} more drawn, unrun past the budget of {self.seconds:.0f} s"
        return line


NOT_FAILURES = (UnsatisfiedAssumption, StopTest)
"""What ends an example without failing it: an ``assume``, a draw past hypothesis's limit."""

BUDGETS: list[Budget] = []
"""The campaigns this session started, for the run's summary."""
