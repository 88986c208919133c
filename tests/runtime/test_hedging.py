"""Hedged copies, decided alone: which overdue parts go to which spare worker, and when."""

from __future__ import annotations

import time

from drapps.runtime.cost import SampleCosts
from drapps.runtime.hedging import HEDGE_MIN_S, Hedging
from drapps.runtime.plan import Plan
from drapps.runtime.pool import Task, Worker
from drapps.runtime.schedule import Work


def _learnt(cost_s: float = 0.001) -> SampleCosts:
    costs = SampleCosts(64)
    for start in range(0, 32, 4):
        costs.observe(list(range(start, start + 4)), [cost_s] * 4)
    return costs


def _part(batch_id: int, part: int, started_ago: float) -> Task:
    work = Work(batch_id, part, (0, 1), cost=0.002, parts=2)
    at = time.monotonic() - started_ago
    return Task(1, 0, batch_id, [2 * part, 2 * part + 1], at, work=work)


def _holding(wid: int, *tasks: Task) -> Worker:
    worker = Worker(wid, slot=wid)
    worker.assigned.extend(tasks)
    worker.last_progress = min((t.assigned_at for t in tasks), default=time.monotonic())
    return worker


def test_an_overdue_part_of_the_next_batch_is_copied_once_to_an_idle_worker() -> None:
    hedging = Hedging(_learnt())
    late = _part(0, 1, started_ago=1.0)  # far past four times 2 ms, and HEDGE_MIN_S
    holder, idle, busy = _holding(0, late), _holding(1), _holding(2, _part(3, 0, 0.0))
    in_flight = {(0, 1): holder}
    asked = {"head": 0, "waiting": True, "cut": {0}, "in_flight": in_flight}
    copies = list(hedging.copies(**asked, live=[holder, busy, idle]))
    assert [(w.wid, t.batch_id, t.part) for w, t in copies] == [(1, 0, 1)]
    assert list(idle.assigned) == [copies[0][1]]  # queued where the worker takes it
    assert list(hedging.copies(**asked, live=[holder, busy, idle])) == []  # once only
    assert hedging.report()["hedges"] == 1
    hedging.reset(Plan(64, 4, shuffle=False, drop_last=False, seed=0, epoch=1), 0)
    assert hedging.copied == set()


def test_a_part_on_time_or_with_no_cost_measured_is_not_copied() -> None:
    fresh = _part(0, 1, started_ago=HEDGE_MIN_S / 4)
    holder, idle = _holding(0, fresh), _holding(1)
    asked = {"head": 0, "waiting": True, "cut": {0}, "in_flight": {(0, 1): holder}}
    assert list(Hedging(_learnt()).copies(**asked, live=[holder, idle])) == []
    late = _part(0, 1, started_ago=1.0)
    holder = _holding(0, late)
    asked["in_flight"] = {(0, 1): holder}
    assert list(Hedging(SampleCosts(64)).copies(**asked, live=[holder, idle])) == []


def test_before_the_loop_waits_only_an_idle_worker_takes_a_copy() -> None:
    late = _part(1, 0, started_ago=1.0)
    holder = _holding(0, late)
    queued = _holding(1, _part(5, 0, 0.0))
    asked = {"head": 0, "waiting": False, "cut": {1}, "in_flight": {(1, 0): holder}}
    assert list(Hedging(_learnt()).copies(**asked, live=[holder, queued])) == []
    copies = list(Hedging(_learnt()).copies(**asked, live=[holder, queued, _holding(2)]))
    assert [w.wid for w, _ in copies] == [2]


def test_the_stretch_learns_wall_time_per_second_of_cost() -> None:
    hedging = Hedging(_learnt())
    for _ in range(20):
        hedging.note_stretch(wall_s=0.3, costs=[0.05, 0.05])  # three times the cost
    assert 2.5 < hedging.stretch <= 3.0
    hedging.note_stretch(wall_s=0.0, costs=[0.05])  # nothing to learn from
    assert hedging.report()["stretch"] == round(hedging.stretch, 2)
