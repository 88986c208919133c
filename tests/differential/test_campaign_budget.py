"""A campaign's time budget: past it the examples left pass unrun, and a failure found before it
is still shrunk and replayed whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest
from harness import BUDGETS, Budget, campaign, in_chunks
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test


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
    assert "6 examples in 6 s; 34 more not run, past the budget of 5 s" in budget.summary()


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


def test_a_campaign_in_runs_starts_none_past_the_budget(clock: Clock) -> None:
    budget, runs = Budget("probe", seconds=5, clock=clock), []

    def run(seeded: int, examples: int) -> None:
        runs.append((seeded, examples))
        clock.now += 2

    in_chunks(budget, 23, 5, run, seed=7)
    # Started at 0 and 2 s; a third, at 4 s, would end at 6 s, past the budget.
    assert [examples for _, examples in runs] == [5, 5]
    assert len({seeded for seeded, _ in runs}) == 2
    assert (budget.ran, budget.let_go) == (10, 13)
    assert "probe: 10 examples in 4 s; 13 more not run, past the budget of 5 s" in budget.summary()

    again: list[tuple[int, int]] = []
    in_chunks(Budget("probe", seconds=0, clock=clock), 23, 5, lambda *a: again.append(a), seed=7)
    assert again[:2] == runs and [examples for _, examples in again] == [5, 5, 5, 5, 3]


def test_a_campaign_in_runs_ends_within_its_budget_when_its_runs_take_alike(clock: Clock) -> None:
    """The campaign of events once ran 510 s on a budget of 240: its second run of 15 examples
    started just inside the budget. A run starts only where the budget has room for it."""
    budget, lengths = Budget("probe", seconds=240, clock=clock), []

    def run(seeded: int, examples: int) -> None:
        clock.now += 17 * examples * (1.1 if len(lengths) % 2 else 0.9)  # about 17 s an example
        lengths.append(examples)

    in_chunks(budget, 75, 5, run, seed=5)
    assert clock.now <= 240 and len(lengths) == 2, (clock.now, lengths)
    assert "probe: 10 examples in 170 s; 65 more not run, past the budget of 240 s" in (
        budget.summary()
    )


def test_the_first_run_starts_though_it_takes_longer_than_the_budget(clock: Clock) -> None:
    budget, runs = Budget("probe", seconds=5, clock=clock), []

    def run(seeded: int, examples: int) -> None:
        runs.append(examples)
        clock.now += 9

    in_chunks(budget, 20, 5, run, seed=1)
    assert runs == [5] and (budget.ran, budget.let_go) == (5, 15)


class Draws(RuleBasedStateMachine):
    drawn: ClassVar[list[int]] = []

    @rule(x=st.integers(0, 2**32))
    def draw(self, x: int) -> None:
        self.drawn.append(x)


def test_each_run_of_a_state_machine_draws_from_its_own_seed(clock: Clock) -> None:
    def run(seeded: int, examples: int) -> None:
        Draws.drawn = []
        machine = seed(seeded)(lambda: Draws())
        run_state_machine_as_test(machine, settings=settings(campaign(examples), max_examples=2))
        runs.append(Draws.drawn)

    campaigns: list[list[list[int]]] = []
    for _ in range(2):
        campaigns.append(runs := [])
        in_chunks(Budget("probe", seconds=0, clock=clock), 4, 2, run, seed=11)
    first, second = campaigns[0]
    assert campaigns[0] == campaigns[1]  # the campaign's seed replays it
    assert first != second  # and its two runs drew apart


def test_a_failure_names_its_run_and_seed(clock: Clock) -> None:
    def run(seeded: int, examples: int) -> None:
        assert seeded != seeds[1]

    seeds: list[int] = []
    in_chunks(Budget("probe", clock=clock), 6, 2, lambda s, _: seeds.append(s), seed=3)
    with pytest.raises(AssertionError) as raised:
        in_chunks(Budget("probe", clock=clock), 6, 2, run, seed=3)
    assert f"probe: in its run 2 of 3 (seed {seeds[1]}, from the campaign's 3)" in "\n".join(
        raised.value.__notes__
    )
