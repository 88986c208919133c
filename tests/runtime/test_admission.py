"""Admission decided alone: what may open under the depth and the memory budget, what a worker
may queue, and the live bytes a held batch counts until the loop lets it go."""

from __future__ import annotations

import gc
import time

import torch

from drapps.runtime.admission import TASKS_PER_WORKER, Admission
from drapps.runtime.cost import SampleCosts
from drapps.runtime.plan import Plan
from drapps.runtime.pool import Task, Worker
from drapps.runtime.schedule import Work


def test_the_head_always_opens_the_rest_within_the_depth_and_the_budget() -> None:
    admission = Admission(budget=10_000)
    asked = {"ready": 0, "pooled": 0, "workers": 2}
    assert admission.may_open(0, depth=4, head=0, **asked)
    # Before the first batch's size is known: one batch per worker.
    admission.open.update({0, 1})
    assert not admission.may_open(2, depth=4, head=0, **asked)
    assert admission.may_open(1, depth=4, head=0, **asked)  # started already
    admission.note_batch(3_000)  # three batches under way would pass 10,000 with a fourth
    assert admission.may_open(2, depth=4, head=0, **asked)
    admission.open.add(2)
    assert not admission.may_open(3, depth=8, head=0, **asked)
    assert not admission.may_open(3, depth=3, head=0, **{**asked, "workers": 8})
    admission.reset(Plan(8, 2, shuffle=False, drop_last=False, seed=0, epoch=1), 0)
    assert admission.open == set()


def test_a_held_batch_counts_against_the_budget_until_it_is_let_go() -> None:
    admission = Admission(budget=4 * 4096)
    batch = admission.hold(torch.zeros(4096, dtype=torch.uint8), 4096, finish=None)
    assert admission.room_to_keep() == 3 * 4096
    del batch
    gc.collect()
    assert admission.room_to_keep() == 4 * 4096


def test_a_worker_queues_two_tasks_and_none_behind_a_part_predicted_slow() -> None:
    costs = SampleCosts(64)
    for start in range(0, 32, 4):
        costs.observe(list(range(start, start + 4)), [0.001] * 4)
    worker = Worker(0)
    slow = Work(0, 0, (0, 1), cost=1.0, parts=2)
    worker.assigned.append(Task(1, 0, 0, [0, 1], time.monotonic(), work=slow))
    assert Admission.may_queue(worker, cutting=False, costs=costs)
    assert not Admission.may_queue(worker, cutting=True, costs=costs)
    worker.assigned.extend([worker.assigned[0]] * (TASKS_PER_WORKER - 1))
    assert not Admission.may_queue(worker, cutting=False, costs=costs)
