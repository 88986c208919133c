"""A campaign's time budget: past it the examples left pass unrun, and a failure found before it
is still shrunk and replayed whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import BUDGETS, Budget, campaign
from hypothesis import given, settings
from hypothesis import strategies as st


class Clock:
    """Time that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    listed = len(BUDGETS)
    yield Clock()
    del BUDGETS[listed:]  # not the run's campaigns


def test_examples_past_the_budget_pass_unrun(clock: Clock) -> None:
    budget, ran = Budget("probe", seconds=5, clock=clock), []

    @settings(campaign(40), derandomize=True)
    @given(st.integers())
    def probe(x: int) -> None:
        if budget.admits():
            with budget.example():
                ran.append(x)
                clock.now += 1  # each example takes a second

    probe()
    assert len(ran) == 6, ran  # started at 0, 1, ..., 5 s; the one at 6 s is past the budget
    assert (budget.ran, budget.let_go) == (6, 34)
    assert "6 examples in 6 s; 34 more drawn, unrun past the budget of 5 s" in budget.summary()


def test_no_budget_runs_the_whole_length(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAPPS_DIFF_BUDGET_S", raising=False)
    budget = Budget("probe", clock=clock)

    @settings(campaign(30), derandomize=True)
    @given(st.integers())
    def probe(x: int) -> None:
        assert budget.admits()
        clock.now += 100

    probe()
    assert (budget.ran, budget.let_go) == (30, 0)


def test_a_failure_is_shrunk_though_the_budget_is_spent(clock: Clock) -> None:
    budget = Budget("probe", seconds=5, clock=clock)

    @settings(campaign(200), derandomize=True)
    @given(st.integers(0, 10_000))
    def probe(x: int) -> None:
        if not budget.admits():
            return
        with budget.example():
            if x > 100:
                clock.now += 100  # the budget is spent as the failure is found
            assert x <= 100

    with pytest.raises(AssertionError) as raised:
        probe()
    assert budget.failed
    # Shrunk to its least value: every shrink and the final replay ran past the budget.
    assert "probe(\n    x=101,\n)" in "\n".join(getattr(raised.value, "__notes__", [])), raised
