"""Lost tasks decided alone: made again until ``max_attempts``, then given up; timeouts."""

from __future__ import annotations

import time

from drapps.runtime.plan import Plan
from drapps.runtime.pool import Task, Worker
from drapps.runtime.retries import Retries


def test_a_lost_task_is_made_again_until_its_attempts_are_spent() -> None:
    retries = Retries(max_attempts=3, timeout=None)
    assert retries.again(4, None) and retries.again(4, None)  # attempts 2 and 3
    assert not retries.again(4, None)  # a fourth: give it up
    assert retries.again(4, 0)  # each part of a batch counts on its own
    retries.reset(Plan(8, 2, shuffle=False, drop_last=False, seed=0, epoch=1), 0)
    assert retries.again(4, None)  # a new epoch starts over


def test_a_given_up_batch_says_why_in_dataloaders_words_first() -> None:
    retries = Retries(max_attempts=2, timeout=1.5)
    task = Task(1, 0, 7, [14, 15], 0.0)
    reason, lead = retries.timeout_words()
    message = retries.given_up(task, reason, lead)
    assert message.startswith("DataLoader timed out after 1.5 seconds; batch 7 (indices")
    assert message.endswith("exceeded timeout=1.5s on each of 2 attempts")


def test_only_a_worker_past_the_timeout_is_overdue_and_the_wait_ends_by_then() -> None:
    retries = Retries(max_attempts=2, timeout=10.0)
    now = time.monotonic()
    stuck, busy, idle = Worker(0), Worker(1), Worker(2)
    stuck.assigned.append(Task(1, 0, 0, [0], now - 30.0))
    stuck.last_progress = now - 30.0
    busy.assigned.append(Task(1, 0, 1, [1], now - 8.0))
    busy.last_progress = now - 8.0
    assert list(retries.overdue([stuck, busy, idle])) == [stuck]
    assert retries.counters["timeouts"] == 1
    assert 1.0 < retries.wait_s([busy, idle], tick=5.0) <= 2.0  # busy's deadline comes first
    assert Retries(2, timeout=None).wait_s([stuck], tick=0.5) == 0.5
    assert list(Retries(2, timeout=None).overdue([stuck])) == []


def test_by_default_the_limit_follows_the_slowest_batch_made() -> None:
    """timeout=0 (DataLoader's default): 10 minutes before any batch came back, then ten
    times the slowest, and at least 60 s; a number is that many seconds; None, no limit."""
    retries = Retries(max_attempts=2, timeout=0)
    now = time.monotonic()
    starting = Worker(0)
    starting.assigned.append(Task(1, 0, 0, [0], now - 300.0))
    starting.last_progress = now - 300.0
    assert retries.timeout == 600.0 and list(retries.overdue([starting])) == []
    retries.limit.note(2.0)  # batches take 2 s: one at 300 s is a hung worker
    assert retries.timeout == 60.0 and list(retries.overdue([starting])) == [starting]
    assert retries.timeout_words()[0] == "exceeded timeout=60s"
    retries.limit.note(45.0)  # one took 45 s: 300 s is within ten times that
    assert retries.timeout == 450.0 and list(retries.overdue([starting])) == []
    retries.limit.note(1.0)  # the slowest stays the mark
    assert retries.timeout == 450.0
    assert Retries(2, timeout=30).timeout == 30.0 and Retries(2, timeout=None).timeout is None
