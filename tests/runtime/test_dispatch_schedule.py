"""The dispatch schedule: cutting batches into parts, least slack first, retries first."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.runtime.cost import SampleCosts
from drapps.runtime.plan import Plan
from drapps.runtime.schedule import PARTS_PER_WORKER, Schedule, balance


def plan(batches: int = 8, batch_size: int = 4) -> Plan:
    return Plan(batches * batch_size, batch_size, shuffle=False, drop_last=False, seed=0, epoch=0)


def measured(costs: dict[int, float], n: int = 32, base: float = 0.001) -> SampleCosts:
    """Costs with every index of ``range(n)`` measured once (``costs`` overrides ``base``)."""
    model = SampleCosts(n)
    model.observe(list(range(n)), [costs.get(i, base) for i in range(n)])
    return model


def drain(schedule: Schedule, head: int = 0, workers: int = 2) -> list[tuple[int, int | None]]:
    order = []
    while (work := schedule.peek(head, workers, depth=8, may_open=lambda b: True)) is not None:
        schedule.take(work)
        order.append((work.batch_id, work.part))
    return order


def test_balance_puts_the_costly_sample_alone_and_keeps_positions_in_order() -> None:
    assert balance(np.array([1.0, 1.0, 9.0, 1.0]), 2) == [[2], [0, 1, 3]]
    assert balance(np.zeros(6), 3) == [[0, 3], [1, 4], [2, 5]]
    groups = balance(np.random.default_rng(0).random(20), 4)
    assert sorted(p for g in groups for p in g) == list(range(20))


def test_uniform_costs_leave_batches_whole_in_plan_order() -> None:
    schedule = Schedule(measured({}), mode="auto")
    schedule.reset(plan(), 0)
    assert drain(schedule) == [(b, None) for b in range(8)]
    assert schedule.cut_batches == 0


def test_samples_mode_cuts_every_batch_and_hands_out_each_sample_once() -> None:
    schedule = Schedule(measured({}), mode="samples")
    schedule.reset(plan(), 0)
    seen: dict[int, list[int]] = {}
    while (work := schedule.peek(0, 2, depth=8, may_open=lambda b: True)) is not None:
        schedule.take(work)
        assert work.part is not None
        seen.setdefault(work.batch_id, []).extend(work.positions)
    assert {b: sorted(p) for b, p in seen.items()} == {b: [0, 1, 2, 3] for b in range(8)}


def test_a_predicted_straggler_of_a_later_batch_starts_before_the_next_batch() -> None:
    # Sample 13 (batch 3) costs 100x the others: with 2 workers a batch takes 2 ms, so its
    # part must start ~3 batches early to be ready when batch 3 is due.
    schedule = Schedule(measured({13: 0.1}), mode="samples")
    schedule.reset(plan(), 0)
    first = schedule.peek(0, 2, depth=8, may_open=lambda b: True)
    assert first is not None and first.batch_id == 3 and first.positions == (1,)


def test_each_pick_is_the_least_slack_of_every_work_not_sent() -> None:
    # The schedule scores one work per batch (its costliest not sent): the pick must still be
    # the least slack over every work of every batch in the window, as if all were scored.
    rng = np.random.default_rng(3)
    costs = {i: float(rng.pareto(1.5) * 0.002) for i in range(64)}
    schedule = Schedule(measured(costs, n=64), mode="samples")
    schedule.reset(plan(batches=8, batch_size=8), 0)
    seen = [schedule._parts_for(b, 3) for b in range(8)]  # every batch looked at, none sent
    interval = schedule.costs.mean * schedule.batch_len / 3
    while (work := schedule.peek(0, 3, depth=8, may_open=lambda b: True)) is not None:
        waiting = [w for parts in seen for w in parts.works if w.part not in parts.sent]
        best = min(waiting, key=lambda w: schedule._score(w, 0, interval))
        assert work == best
        schedule.take(work)
    assert all(len(parts.sent) == len(parts.works) for parts in seen)


def test_the_lookahead_bounds_how_far_ahead_work_starts() -> None:
    schedule = Schedule(measured({29: 0.1}), mode="samples", lookahead=2)
    schedule.reset(plan(), 0)
    first = schedule.peek(0, 2, depth=8, may_open=lambda b: True)
    assert first is not None and first.batch_id == 0  # batch 7 is beyond the lookahead
    schedule.set_lookahead(8)
    first = schedule.peek(0, 2, depth=8, may_open=lambda b: True)
    assert first is not None and first.batch_id == 7


def test_no_batch_opens_beyond_what_may_open_allows_but_the_head() -> None:
    schedule = Schedule(measured({}), mode="batches")
    schedule.reset(plan(), 0)
    work = schedule.peek(0, 2, depth=8, may_open=lambda b: b == 0)
    assert work is not None and work.batch_id == 0
    schedule.take(work)
    assert schedule.peek(0, 2, depth=8, may_open=lambda b: b == 0) is None


def test_requeued_work_goes_out_first() -> None:
    schedule = Schedule(measured({}), mode="batches")
    schedule.reset(plan(), 0)
    lost = schedule.peek(0, 2, depth=8, may_open=lambda b: True)
    assert lost is not None
    schedule.take(lost)
    schedule.requeue(lost)
    again = schedule.peek(0, 2, depth=8, may_open=lambda b: True)
    assert again is lost and schedule.retrying(again)
    schedule.take(again)
    assert drain(schedule) == [(b, None) for b in range(1, 8)]


def test_heavy_tailed_costs_switch_auto_to_parts() -> None:
    rng = np.random.default_rng(0)
    costs = np.where(rng.random(512) < 0.05, 0.06, 0.001)
    model = SampleCosts(512)
    model.observe(list(range(512)), costs.tolist())
    assert model.tail_ratio() > 8
    schedule = Schedule(model, mode="auto")
    schedule.reset(plan(), 0)
    assert schedule.cutting and all(part is not None for _, part in drain(schedule))
    assert Schedule(model, mode="auto", splittable=False).cutting is False
    # Workers that make several samples at once: a slow one holds only itself, whole
    # batches go out ("samples" still cuts, as asked).
    concurrent = Schedule(model, mode="auto")
    concurrent.samples_at_once = 8
    concurrent.reset(plan(), 0)
    assert not concurrent.cutting and all(part is None for _, part in drain(concurrent))
    asked = Schedule(model, mode="samples")
    asked.samples_at_once = 8
    assert asked.cutting


def parts_per_batch(schedule: Schedule, batch_id: int, workers: int = 2) -> int:
    """Hands out every work up to ``batch_id``; the parts ``batch_id`` was cut into."""
    works = []
    while (work := schedule.peek(batch_id, workers, 1, lambda b: b <= batch_id)) is not None:
        schedule.take(work)
        works.append(work)
    return max(w.parts for w in works if w.batch_id == batch_id)


def test_a_starved_loop_gets_one_part_per_worker_and_two_again_once_fed() -> None:
    schedule = Schedule(measured({}), mode="samples")
    schedule.reset(plan(batches=8, batch_size=8), 0)
    schedule.note_wait(0.0, now=100.0)
    assert parts_per_batch(schedule, 0) == 4  # two per worker
    assert schedule.peek(1, 2, 1, lambda b: b == 1) is not None  # batch 1 is cut now
    schedule.note_wait(0.6, now=100.5)  # half a window: not read yet
    assert schedule.parts_per_worker == PARTS_PER_WORKER
    schedule.note_wait(0.8, now=101.0)  # waited 80% of the second: loader-bound
    assert parts_per_batch(schedule, 1) == 4  # a batch already cut keeps its parts
    assert parts_per_batch(schedule, 2) == 2
    schedule.note_wait(1.2, now=102.0)  # 40%: between the two shares, the cut stays
    assert parts_per_batch(schedule, 3) == 2
    schedule.note_wait(1.3, now=103.0)  # 10%: the loop has slack again
    assert parts_per_batch(schedule, 4) == 4


def test_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="dispatch must be one of"):
        Schedule(SampleCosts(4), mode="fast")
