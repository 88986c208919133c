"""Batches made in parts, collected alone: parts in any order make one batch in plan order; a
failed part fails it, a given-up part skips or fails its samples."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch.utils.data import default_collate

from drapps.runtime.admission import Admission
from drapps.runtime.collector import Collector
from drapps.runtime.errors import SampleError
from drapps.runtime.messages import BatchFailed, BatchMade
from drapps.runtime.plan import Plan
from drapps.runtime.pool import Task, Worker
from drapps.runtime.reorder import Entry, ReorderBuffer
from drapps.runtime.schedule import Work
from drapps.runtime.transport import pack_inline
from drapps.runtime.worker import BatchRecipe

PLAN = Plan(8, 4, shuffle=False, drop_last=False, seed=0, epoch=0)
PARTS = [Work(0, 0, (0, 1)), Work(0, 1, (2, 3))]


def _collector() -> tuple[Collector, list[tuple[int, Entry]]]:
    recipe = BatchRecipe(list(range(8)), None, default_collate, "raise")
    counters = dict.fromkeys(("fetch_s", "transform_s", "collate_s", "transport_s"), 0.0)
    counters["assemble_s"] = 0.0
    collector = Collector(recipe, Admission(2**20), ReorderBuffer(), None, None, counters, deque())
    collector.reset(PLAN, 0)
    collector.open(0, [10, 11, 12, 13], PARTS, None, now=0.0)
    return collector, []


def _made(part: int, samples: list[Any]) -> BatchMade:
    packed = pack_inline(samples)
    return BatchMade(1, 0, packed, [], (0.0, 0.0, 0.0), [0.001] * 2, part, [0, 1])


def _never(*args: Any) -> None:
    raise AssertionError("no slab is unreadable here")


def test_parts_in_any_order_make_one_batch_in_plan_order() -> None:
    collector, delivered = _collector()
    deliver = lambda g, b, e: delivered.append((b, e))  # noqa: E731
    worker = Worker(0)
    collector.on_part(worker, _made(1, [12, 13]), True, None, deliver, _never)
    assert delivered == [] and 0 in collector.partial
    collector.on_part(worker, _made(1, [12, 13]), True, None, deliver, _never)  # a duplicate
    collector.on_part(worker, _made(0, [10, 11]), True, None, deliver, _never)
    assert [b for b, _ in delivered] == [0] and collector.partial == {}
    assert torch.equal(delivered[0][1].batch, torch.tensor([10, 11, 12, 13]))


def test_a_failed_part_fails_its_batch_and_a_given_up_one_skips_its_samples() -> None:
    collector, delivered = _collector()
    deliver = lambda g, b, e: delivered.append((b, e))  # noqa: E731
    error = SampleError("sample 12 failed", indices=[12])
    collector.on_part(Worker(0), BatchFailed(1, 0, error, 1), True, None, deliver, _never)
    collector.on_part(Worker(0), _made(0, [10, 11]), True, None, deliver, _never)
    assert delivered[0][1].error is error

    collector, delivered = _collector()
    collector.on_part(Worker(0), _made(0, [10, 11]), True, None, deliver, _never)
    lost = Task(1, 0, 0, [12, 13], 0.0, work=PARTS[1])
    collector.give_up(lost, "its worker died on each of 3 attempts", True, deliver)
    entry = delivered[0][1]
    assert torch.equal(entry.batch, torch.tensor([10, 11]))
    assert [index for index, _ in entry.skipped] == [12, 13]


def test_a_whole_batch_is_delivered_once_and_a_late_copy_or_stale_one_is_not() -> None:
    collector, delivered = _collector()
    deliver = lambda g, b, e: (delivered.append((b, e)), collector._buffer.put(g, b, e))  # noqa: E731
    collector._buffer.reset(1, 0, len(PLAN))
    whole = BatchMade(
        1, 1, pack_inline(torch.tensor([4, 5, 6, 7])), [], (0.0, 0.0, 0.0), [0.001] * 4, None, None
    )
    task = Task(1, 0, 1, [4, 5, 6, 7], 0.0)
    collector.on_whole(Worker(0), whole, True, task, None, deliver, _never)
    assert [b for b, _ in delivered] == [1]
    assert torch.equal(delivered[0][1].batch, torch.tensor([4, 5, 6, 7]))
    assert len(collector._latencies) == 1
    collector.on_whole(Worker(1), whole, True, None, None, deliver, _never)  # a hedged copy
    collector.on_whole(Worker(1), whole, False, None, None, deliver, _never)  # another epoch's
    assert len(delivered) == 1
    error = SampleError("sample 1 failed", indices=[1])
    collector.on_whole(Worker(0), BatchFailed(1, 2, error, None), True, None, None, deliver, _never)
    assert delivered[1][1].error is error
