"""An epoch left early, its persistent workers kept for the next, at the dispatcher: each
worker is sent of it what DataLoader's is (every batch up to where the loop left it, plus the
prefetch depth) and no more, however the loop's thread and the dispatcher's interleave.

The dispatcher is driven here by hand, one step at a time, over a pool that only records what
it is sent, so that each interleaving is the one named, not the machine's."""

from __future__ import annotations

from typing import Any

import torch
from helpers import BarePool
from torch.utils.data import default_collate

from drapps.runtime.config import PoolSettings
from drapps.runtime.dispatcher import Dispatcher
from drapps.runtime.messages import BatchTask
from drapps.runtime.plan import Plan
from drapps.runtime.reorder import Entry
from drapps.runtime.worker import BatchRecipe


def _dispatcher(pool: BarePool) -> Dispatcher:
    """Two workers, one batch each ahead (``prefetch_factor=1``), batches dealt round-robin
    and samples drawing on from each worker's RNGs: DataLoader's fixed count."""
    data = [torch.tensor([i]) for i in range(12)]
    recipe = BatchRecipe(data, None, default_collate, "raise", reseed=False)
    settings = PoolSettings(
        workers=2, memory_budget=2**24, prefetch_per_worker=1, deal="round_robin"
    )
    return Dispatcher(recipe, settings, pool=pool)


def _plan(epoch: int) -> Plan:
    return Plan(12, 2, shuffle=False, drop_last=False, seed=0, epoch=epoch)


def _begin(d: Dispatcher, generation: int, epoch: int, *, fresh: bool, left_at: int) -> None:
    """What ``iter(loader)`` does: the buffer is the new epoch's at once (the loop's thread),
    its command applied by the dispatcher's thread after."""
    plan = _plan(epoch)
    d.buffer.reset(generation, 0, len(plan))
    d._set("epoch", (generation, plan, 0, fresh, left_at))


def _sent(pool: BarePool, generation: int) -> list[tuple[int, int]]:
    """(worker, batch) of each task of ``generation`` sent, in order."""
    return [
        (slot, m.batch_id)
        for slot, m in pool.sent
        if isinstance(m, BatchTask) and m.generation == generation
    ]


def _answer(d: Dispatcher, batch_id: int) -> None:
    """The worker holding ``batch_id`` made it, and it reached the buffer."""
    worker = next(w for w in d.pool.workers if any(t.batch_id == batch_id for t in w.assigned))
    task = next(t for t in worker.assigned if t.batch_id == batch_id)
    worker.assigned.remove(task)
    d._deliver(task.generation, batch_id, Entry(batch=torch.tensor([batch_id])))


def _take(d: Dispatcher) -> Any:
    entry = d.buffer.get()
    assert entry is not None
    return entry.batch


def test_the_next_epoch_begun_mid_pass_opens_nothing_more_of_the_left_one() -> None:
    """The loop takes batches 0 and 1, batch 2 is made, and the dispatcher opens batch 3; as
    it sends it, the loop leaves and calls ``iter()`` again. DataLoader had sent batches 0-3
    (the two taken plus its prefetch of two): the pass must stop there, not read the next
    epoch's empty buffer as room for batch 4, which would leave worker 0 a batch of draws
    ahead of DataLoader's."""
    pool = BarePool()
    d = _dispatcher(pool)
    _begin(d, 1, 0, fresh=True, left_at=0)
    d._keep_pool_size()
    d._dispatch()
    assert _sent(pool, 1) == [(0, 0), (1, 1)]
    _answer(d, 0)
    _answer(d, 1)
    assert _take(d).tolist() == [0]
    d._dispatch()
    assert _take(d).tolist() == [1]
    _answer(d, 2)
    assert _sent(pool, 1) == [(0, 0), (1, 1), (0, 2)]

    send = pool.send

    def send_then_begin(worker: Any, message: Any) -> None:
        send(worker, message)
        if d.buffer.generation == 1:
            d.buffer.reset(2, 0, 6)  # the loop's next iter(), between two sends of a pass

    pool.send = send_then_begin  # type: ignore[method-assign]
    d._dispatch()
    pool.send = send  # type: ignore[method-assign]
    d._set("epoch", (2, _plan(1), 0, False, 2))
    assert _sent(pool, 1) == [(0, 0), (1, 1), (0, 2), (1, 3)]
    d._dispatch()
    assert _sent(pool, 2) == [(0, 0)], "worker 1 makes batch 3 of the left epoch first"
    _answer(d, 3)
    d._dispatch()
    assert _sent(pool, 2) == [(0, 0), (1, 1)]


def test_an_epoch_left_before_its_workers_started_sends_them_what_dataloader_did() -> None:
    """``iter(loader)`` twice, before the dispatcher's thread has acted on the first: no worker
    has started yet. DataLoader's had each been sent its first batch (its prefetch), and make
    it before the next epoch's; the workers are started then and sent theirs."""
    pool = BarePool()
    d = _dispatcher(pool)
    _begin(d, 1, 0, fresh=True, left_at=0)
    _begin(d, 2, 1, fresh=False, left_at=0)
    assert _sent(pool, 1) == [(0, 0), (1, 1)]
    d._keep_pool_size()
    d._dispatch()
    assert _sent(pool, 2) == []
    _answer(d, 0)
    d._dispatch()
    assert _sent(pool, 2) == [(0, 0)]
