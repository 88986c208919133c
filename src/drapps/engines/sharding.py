"""A loader under ``torch.distributed``: each rank's shard of the dataset, and its share of the
host's cores.

With no distributed sampler, each rank reads the shard ``DistributedSampler(shuffle, seed,
drop_last)`` would give it (``shard_by_rank=False`` turns that off); with ``workers="auto"``,
the ranks on one host split its cores between their worker pools.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from drapps.engines.base import Engine
from drapps.runtime.cores import HostShare
from drapps.runtime.errors import warn_once
from drapps.runtime.sampling import is_distributed, rank_shard, world

logger = logging.getLogger(__name__)


class RankShard:
    """This rank's share of a map-style dataset, when drapps shards for the user.

    Args:
        dataset: the dataset.
        user_sampler: the sampler or batch sampler the user gave (None: drapps samples).
        enabled: ``shard_by_rank``.
        shuffle, seed, batch_size, drop_last: as the loader's.
    """

    def __init__(
        self,
        dataset: Any,
        user_sampler: Any,
        *,
        enabled: bool,
        shuffle: bool,
        seed: int | None,
        batch_size: int | None,
        drop_last: bool,
    ) -> None:
        self._dataset, self._user_sampler, self._enabled = dataset, user_sampler, enabled
        self._shuffle, self._batch_size, self._drop_last = shuffle, batch_size, drop_last
        self._seed = (seed or 0) % 2**62  # DistributedSampler's default seed is 0
        self._warned = False

    def keys(self, epoch: int, *, warn: bool) -> Iterable[Any] | None:
        """The keys (or batches) this rank reads in ``epoch``; None when it reads all of them."""
        ranks = world() if self._enabled else None
        if ranks is None:
            return None
        rank, size = ranks
        if self._user_sampler is not None:
            if warn and not is_distributed(self._user_sampler):
                warn_once(
                    "sampler-not-distributed",
                    f"torch.distributed runs {size} ranks but the sampler "
                    f"{type(self._user_sampler).__name__} is not a distributed one: every "
                    "rank iterates all of it (use DistributedSampler to split it)",
                )
            return None
        if warn and not self._warned:
            self._warned = True
            logger.warning(
                "drapps: torch.distributed runs %d ranks and no DistributedSampler was given: "
                "rank %d reads its own shard, as DistributedSampler(shuffle=%s, seed=%s, "
                "drop_last=%s) would (shard_by_rank=False turns this off)",
                size,
                rank,
                self._shuffle,
                self._seed,
                self._drop_last,
            )
        return rank_shard(
            self._dataset,
            rank,
            size,
            shuffle=self._shuffle,
            seed=self._seed,
            epoch=epoch,
            batch_size=self._batch_size,
            drop_last=self._drop_last,
        )


class CoreClaim:
    """Keeps an engine's workers within this rank's share of the host (``workers="auto"``)."""

    def __init__(self, min_workers: int) -> None:
        self._share = HostShare()
        self._min_workers = min_workers

    def grant(self, wanted: int, floor: int) -> int:
        """Workers this rank may run of ``wanted`` (never below ``floor``)."""
        return self._share.grant(wanted, floor)

    def claim(self, engine: Engine) -> None:
        """Shrink ``engine`` to the share before an epoch starts."""
        if not engine.tunable:
            return
        granted = self._share.grant(engine.workers, self._min_workers)
        if granted != engine.workers:
            engine.resize(granted)

    def release(self) -> None:
        self._share.release()
