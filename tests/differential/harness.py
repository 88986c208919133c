"""Settings shared by the harness's tests: a bounded, derandomized run in the fast tier, and
campaigns in the slow tier, which explore from the seed ``tests/conftest.py`` prints
(``DRAPPS_DIFF_SEED`` replays one; ``DRAPPS_DIFF_EXAMPLES`` sets its length and
``DRAPPS_DIFF_BUDGET_S`` the wall-clock time it may take)."""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import hypothesis.core
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


TRAIL = os.environ.get("DRAPPS_DIFF_TRAIL")
"""A file each state machine's case and steps are written to as they run (unset: none): a
campaign that kills the test process (a crash in native code) leaves there what it ran last,
which ``make test-slow`` prints."""

F = TypeVar("F", bound=Callable[..., Any])


def trail(line: str, *, new: bool = False) -> None:
    """Write ``line`` to :data:`TRAIL` (``new``: the file starts over with it)."""
    if TRAIL:
        with open(TRAIL, "w" if new else "a") as file:
            file.write(line + "\n")


def traced(step: F) -> F:
    """A state machine's step, written to :data:`TRAIL` with its arguments as it begins."""

    @functools.wraps(step)
    def traced_step(machine: Any, *args: Any, **kwargs: Any) -> Any:
        if TRAIL:
            shown = [*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]
            trail(f"{step.__name__}({', '.join(shown)})")
        return step(machine, *args, **kwargs)

    return traced_step  # type: ignore[return-value]


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

    ``admits`` is for a test whose examples draw all they need before they run (``@given``'s
    arguments): one that stopped drawing early would change what hypothesis recorded of the
    sequence. A state machine draws its steps as it runs: ``in_chunks`` bounds it by whole
    runs instead."""

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

    def spent(self) -> bool:
        """Whether the time is spent (the first call starts it)."""
        now = self.clock()
        if self.started is None:
            self.started = now
        return self.seconds > 0 and now - self.started > self.seconds

    def has_room(self, examples: int) -> bool:
        """Whether ``examples`` more fit in what is left of the time, at the time per example
        of those run so far (no limit, or none run yet: True)."""
        if self.seconds <= 0 or not self.ran or self.started is None:
            return True
        per_example = (self.ended - self.started) / self.ran
        return self.clock() - self.started + per_example * examples <= self.seconds

    def admits(self) -> bool:
        """Whether the example starting now runs (False: the test returns at once)."""
        if self.spent() and not self.failed and not current_build_context().is_final:
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
            line += f"; {self.let_go} more not run, past the budget of {self.seconds:.0f} s"
        return line


def in_chunks(
    budget: Budget,
    examples: int,
    chunk: int,
    run: Callable[[int, int], None],
    seed: int | None = None,
) -> None:
    """A campaign of ``examples`` examples (``DRAPPS_DIFF_EXAMPLES`` overrides) as whole
    hypothesis runs of ``chunk`` examples each: ``run(seed, examples)`` runs one, its seed drawn
    from the campaign's (``seed``, else the one ``tests/conftest.py`` set) and its place in the
    campaign. The first run always starts; a later one starts only where ``budget`` has room for
    it at the time the runs before it took per example, so the campaign ends near its budget,
    not a whole run past it, and a slow machine runs fewer of the same seed's runs. Each run
    starts again from simple examples."""
    examples = int(os.environ.get("DRAPPS_DIFF_EXAMPLES", examples))
    base = hypothesis.core.global_force_seed if seed is None else seed
    sizes = [min(chunk, examples - start) for start in range(0, examples, chunk)]
    for place, size in enumerate(sizes):
        if budget.spent() or (place and not budget.has_room(size)):
            budget.let_go = sum(sizes[place:])
            return
        budget.ran += size
        seeded = random.Random(f"{base}/{place}").getrandbits(64)
        with budget.example():
            try:
                run(seeded, size)
            except BaseException as failure:
                if not isinstance(failure, NOT_FAILURES):
                    failure.add_note(
                        f"{budget.name}: in its run {place + 1} of {len(sizes)} (seed {seeded},"
                        f" from the campaign's {base}), which the campaign's seed replays"
                        " without a budget"
                    )
                raise


NOT_FAILURES = (UnsatisfiedAssumption, StopTest)
"""What ends an example without failing it: an ``assume``, a draw past hypothesis's limit."""

BUDGETS: list[Budget] = []
"""The campaigns this session started, for the run's summary."""
