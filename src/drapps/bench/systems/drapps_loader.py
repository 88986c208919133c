"""``drapps-static``, ``drapps-heuristic`` and ``drapps-rl``: drapps.Loader under each policy.

One class, because the three differ only in the policy they hand the Loader: static runs one
worker per usable core (what ``workers="auto"`` starts from), the others let the controller move
workers and prefetch. ``drapps-rl`` is listed once a policy named "rl" is registered.
"""

from __future__ import annotations

from typing import ClassVar

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
        loader = drapps.Loader(
            workload.dataset(throttle),
            batch_size=batch_size,
            shuffle=True,
            seed=seed,
            drop_last=True,
            workers=workers,  # type: ignore[arg-type]
            policy=self.policy,
        )
        return EpochSource(loader, lambda: loader.stats().workers)


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
