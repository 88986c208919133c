"""``drapps-static``, ``drapps-heuristic`` and ``drapps-rl``: drapps.Loader under each policy.

One class, because the three differ only in the policy they hand the Loader: static runs one
worker per usable core (what ``workers="auto"`` starts from), the others let the controller move
workers and prefetch, and choose worker processes or threads (the tables' final workers say
"threads" where a run ended on them). ``drapps-rl`` is listed once a policy named "rl" is
registered.

``drapps-static-sampler`` and ``drapps-static-pinned`` are ``drapps-static`` through the
DataLoader-compatible paths (a user's ``RandomSampler``; ``pin_memory=True``), to measure what
those paths cost; they run only when named with ``--systems``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch.utils.data import RandomSampler

import drapps
from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload
from drapps.control.policy import policy_names


class DrappsSystem(System):
    policy: ClassVar[str]

    @classmethod
    def unavailable(cls) -> str | None:
        if cls.policy not in policy_names():
            return f"no policy named {cls.policy!r} is registered yet"
        return None

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return [cores] if cls.policy == "static" else ["auto"]

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        dataset = workload.dataset(throttle)
        loader = drapps.Loader(
            dataset,
            batch_size=batch_size,
            drop_last=True,
            workers=workers,  # type: ignore[arg-type]
            persistent_workers=workers != 0,
            policy=self.policy,
            cache=None,  # the controller alone; drapps-cache adds the sample cache
            **self.order_and_options(dataset, seed),
        )
        return EpochSource(loader, lambda: ends_on(loader))

    def order_and_options(self, dataset: Any, seed: int) -> dict[str, Any]:
        """How the epoch order is given, and any other Loader options of this system."""
        return {"shuffle": True, "seed": seed}


def ends_on(loader: drapps.Loader) -> Workers:
    """The workers a run ended with: their count, and "threads" after it where the default
    count's pool ended on threads of the training process (the bench's tables then say which
    executor the controller chose)."""
    stats = loader.stats()
    return f"{stats.workers} threads" if stats.executor == "threads" else stats.workers


class DrappsStatic(DrappsSystem):
    name = "drapps-static"
    summary = "drapps.Loader with one worker per usable core (or --static-workers), fixed"
    policy = "static"

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"drapps-static-{workers}"


class DrappsHeuristic(DrappsSystem):
    name = "drapps-heuristic"
    summary = 'drapps.Loader(workers="auto"): the measured hill-climbing controller'
    policy = "heuristic"


class DrappsRl(DrappsSystem):
    name = "drapps-rl"
    summary = 'drapps.Loader(workers="auto", policy="rl"): the learned policy'
    policy = "rl"


class DrappsStaticSampler(DrappsStatic):
    name = "drapps-static-sampler"
    summary = "drapps-static with the order from a user's RandomSampler (opt-in)"
    opt_in = True

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"drapps-static-sampler-{workers}"

    def order_and_options(self, dataset: Any, seed: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(seed)
        return {"sampler": RandomSampler(dataset, generator=generator), "seed": seed}


class DrappsStaticPinned(DrappsStatic):
    name = "drapps-static-pinned"
    summary = "drapps-static with pin_memory=True (opt-in; a no-op without an accelerator)"
    opt_in = True

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"drapps-static-pinned-{workers}"

    def order_and_options(self, dataset: Any, seed: int) -> dict[str, Any]:
        return {"shuffle": True, "seed": seed, "pin_memory": True}


class DrappsFill(DrappsHeuristic):
    name = "drapps-fill"
    summary = (
        "drapps-heuristic with defer_after=0 (opt-in): batches filled from the samples made, "
        "a straggler joining a later batch"
    )
    opt_in = True

    def order_and_options(self, dataset: Any, seed: int) -> dict[str, Any]:
        return {"shuffle": True, "seed": seed, "defer_after": 0.0}
