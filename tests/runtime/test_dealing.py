"""Dealing decided alone: DataLoader's order for a fixed count, the least loaded otherwise."""

from __future__ import annotations

import pytest

from drapps.runtime.dealing import Dealer
from drapps.runtime.pool import Task, Worker
from drapps.runtime.schedule import Work


def _workers(*loads: int) -> list[Worker]:
    workers = []
    for slot, load in enumerate(loads):
        worker = Worker(slot, slot=slot)
        worker.assigned.extend(Task(1, 0, 99, [], 0.0) for _ in range(load))
        workers.append(worker)
    return workers


def test_round_robin_deals_batch_b_to_worker_b_mod_n_and_waits_for_it() -> None:
    dealer = Dealer("round_robin")
    live = _workers(1, 0, 0)
    assert dealer.choose(Work(4, None, ()), live, live, 3, retrying=False) is live[1]
    assert dealer.choose(Work(3, None, ()), live[1:], live, 3, retrying=False) is None  # busy
    # A retried batch, or a part, goes to the least loaded.
    assert dealer.choose(Work(3, None, ()), live[1:], live, 3, retrying=True) is live[1]
    assert dealer.choose(Work(3, 0, (0,)), live[1:], live, 3, retrying=False) is live[1]


def test_in_turn_deals_to_the_next_with_room_and_least_loaded_to_the_idlest() -> None:
    dealer = Dealer("in_turn")
    live = _workers(0, 0, 0)
    got = [dealer.choose(Work(b, None, ()), live, live, 3, False) for b in range(4)]
    assert [w.slot for w in got if w is not None] == [0, 1, 2, 0]
    assert dealer.choose(Work(5, None, ()), live[2:], live, 3, False) is live[2]
    live = _workers(2, 0, 1)
    assert Dealer("least_loaded").choose(Work(0, None, ()), live, live, 3, False) is live[1]
    with pytest.raises(ValueError, match="deal must be"):
        Dealer("random")
