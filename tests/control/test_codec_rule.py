"""The heuristic's codec rule: the cheapest modelled codec, only when it pays, then held."""

from __future__ import annotations

from dataclasses import replace

from helpers import GIB, state

from drapps.control import HeuristicPolicy, State
from drapps.control.codec_rule import CodecRule

MIB = 2**20
# [stored bytes per sample, encode ms, decode ms]: zstd halves the entries for 0.8 ms a decode.
PROFILE = {
    "none": [600_000.0, 0.1, 0.05],
    "lz4": [520_000.0, 1.5, 0.4],
    "zstd": [300_000.0, 2.0, 0.8],
}


class CacheWorld:
    """A loader whose throughput follows the codec's modelled cost; workers fixed."""

    def __init__(self, samples: int, budget: int, make_ms: float = 10.0, cpu: float = 0.97,
                 wait: float = 0.3, available: int = 20 * GIB) -> None:  # fmt: skip
        self.samples, self.budget, self.make_ms = samples, budget, make_ms
        self.cpu, self.wait, self.available = cpu, wait, available
        self.codec = "none"
        self.history: list[str] = []

    def observe(self) -> State:
        stored = PROFILE[self.codec][0]
        hit = min(1.0, self.budget / (stored * self.samples))
        held = int(min(self.budget, stored * self.samples))
        return state(
            cores=2, cpu_util=self.cpu, idle_cores=2 * (1 - self.cpu), wait_fraction=self.wait,
            throughput=1000 / (hit * PROFILE[self.codec][2] + (1 - hit) * self.make_ms),
            workers=2, max_workers=4, available_bytes=self.available, total_bytes=32 * GIB,
            codec=self.codec, cache_hit_rate=hit, cache_read_ms=PROFILE[self.codec][2],
            cache_make_ms=self.make_ms if hit < 1 else 0.0, cache_samples=self.samples,
            cache_budget_bytes=self.budget, cache_held_bytes=held,
            cache_profile=PROFILE,
        )  # fmt: skip

    def run(self, ticks: int) -> list[str]:
        policy = HeuristicPolicy()
        policy.bind(("codec",))
        reasons = []
        for _ in range(ticks):
            action = policy.decide(self.observe())
            if action.codec is not None:
                self.codec = action.codec
                reasons.append(action.reason)
            self.history.append(self.codec)
        return reasons


def test_a_dataset_that_fits_keeps_the_cheapest_decode() -> None:
    world = CacheWorld(samples=1000, budget=1000 * 600_000)
    assert world.run(100) == [] and world.codec == "none"


def test_a_dataset_four_times_the_budget_moves_to_smaller_entries_once() -> None:
    world = CacheWorld(samples=4000, budget=1000 * 600_000)
    reasons = world.run(200)
    assert world.codec == "zstd" and len(reasons) == 1
    assert "codec zstd" in reasons[0] and "modelled against" in reasons[0]


def test_nothing_changes_while_the_loop_does_not_wait_and_the_cpu_has_room() -> None:
    world = CacheWorld(samples=4000, budget=1000 * 600_000, cpu=0.4, wait=0.0)
    assert world.run(100) == [] and world.codec == "none"


def test_a_cheap_to_make_sample_is_not_worth_a_slow_decode() -> None:
    world = CacheWorld(samples=4000, budget=1000 * 600_000, make_ms=0.5)
    assert world.run(100) == [] and world.codec == "none"


def test_memory_pressure_counts_only_what_the_cache_holds() -> None:
    rule = CodecRule()
    world = CacheWorld(samples=1000, budget=1000 * 600_000)
    roomy = world.observe()
    tight = CacheWorld(samples=1000, budget=1000 * 600_000, available=GIB).observe()
    tight = replace(tight, cache_held_bytes=500 * 600_000)
    rule.observe(replace(tight, cache_make_ms=10.0))
    assert rule.costs(roomy)["none"] < rule.costs(tight)["none"]
    assert min(rule.costs(tight), key=rule.costs(tight).__getitem__) == "zstd"
