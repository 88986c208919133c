"""Which worker gets a batch: dealt as DataLoader deals for a fixed count, or least loaded.

:class:`Dealer` owns the rule and, for ``"in_turn"``, whose turn it is. Parts of a batch cut
among workers, and retried batches, go to the least loaded worker whatever the rule.
"""

from __future__ import annotations

from drapps.runtime.pool import Worker
from drapps.runtime.schedule import Work

DEALS = ("round_robin", "in_turn", "least_loaded")


class Dealer:
    """Deals batches to workers.

    Args:
        deal: ``"round_robin"``: batch ``b`` to the worker whose ``get_worker_info().id`` is
            ``b % workers``, waiting for it when it is busy, as DataLoader does for a fixed
            count; ``"in_turn"``: the next in id order after the last one dealt that has room,
            as DataLoader's ``in_order=False``; ``"least_loaded"``: the least loaded
            (``workers="auto"``).
    """

    def __init__(self, deal: str) -> None:
        if deal not in DEALS:
            raise ValueError(
                f"deal must be 'round_robin', 'in_turn' or 'least_loaded', got {deal!r}"
            )
        self.deal = deal
        self._turn = 0  # "in_turn": the slot after the last one dealt

    @staticmethod
    def round_robin_slot(batch_id: int, target: int) -> int:
        """The ``get_worker_info().id`` of the worker ``"round_robin"`` deals ``batch_id`` to,
        with ``target`` workers."""
        return batch_id % max(1, target)

    def choose(
        self,
        work: Work,
        candidates: list[Worker],
        live: list[Worker],
        target: int,
        retrying: bool,
    ) -> Worker | None:
        """The worker among ``candidates`` (the live ones with room) that gets ``work``;
        None: the one it is dealt to is busy, and it waits for it."""
        worker = min(candidates, key=lambda w: len(w.assigned))
        if work.part is not None:
            return worker
        if self.deal == "round_robin" and not retrying:
            slot = self.round_robin_slot(work.batch_id, target)
            dealt = next((w for w in live if w.slot == slot), None)
            if dealt is not None and dealt not in candidates:
                return None  # its worker is busy: wait for it, as DataLoader's queues do
            return dealt or worker  # gone (being replaced): the least loaded instead
        if self.deal == "in_turn":
            # The first with room from the slot after the last one dealt, in id order.
            size = max(1, target, *(w.slot + 1 for w in candidates))
            worker = min(candidates, key=lambda w: (w.slot - self._turn) % size)
            self._turn = (worker.slot + 1) % size
        return worker
