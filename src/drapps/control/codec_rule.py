"""The heuristic's codec rule: pick the cache codec with the lowest modelled cost per sample.

A cached sample costs its read and decode; a sample the cache has no room for costs making it
again (fetch, decode, the cached ops). A smaller codec fits more of the dataset, so more samples
are hits, but each hit decodes more slowly. With each codec's measured stored size, encode and
decode time (the cache profiles them on its first samples), the measured time to make a sample,
and the budget, the expected CPU milliseconds per sample in the epochs after the first are::

    hit(c)  = min(1, budget / (stored(c) * samples))       # share of the dataset that fits
    cost(c) = hit(c) * (decode(c) + io * stored(c)) + (1 - hit(c)) * make
              + hit(c) * encode(c) / HORIZON                # re-encoding, paid once

``io`` is the measured read time per stored byte beyond decoding (the disk tier), so I/O-bound
reads favour smaller entries, CPU-bound ones cheaper decodes. Under memory pressure the budget
counts only what the cache already holds. The rule moves to the cheapest codec when it beats the
current one by ``min_gain``, and only while the loop waits or the CPU is busy (otherwise the
change would buy nothing and cost a re-encode of every entry); then it holds ``hold`` ticks,
since a change takes an epoch to reach every entry. It never turns the cache off: a hit has cost
less than a remake in every workload we measured (an in-memory dataset, where it would not, is
not cached by ``cache="auto"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from drapps.control.state import State

HORIZON = 4.0
"""Epochs a codec change is amortised over."""


@dataclass
class CodecRule:
    """The codec choice (state kept between ticks: the last measured costs, the last change)."""

    min_gain: float = 0.05
    hold: int = 20
    memory_floor: float = 0.10
    make_ms: float = 0.0
    io_ms_per_byte: float = 0.0
    last_change: int = -(10**9)

    def observe(self, state: State) -> None:
        """Keep the latest measured make and read times (misses stop once all fits)."""
        if state.cache_make_ms > 0:
            self.make_ms = state.cache_make_ms
        profile = state.cache_profile.get(state.codec or "")
        if state.cache_read_ms > 0 and profile:
            stored, _, decode = profile
            self.io_ms_per_byte = max(0.0, state.cache_read_ms - decode) / max(stored, 1.0)

    def costs(self, state: State) -> dict[str, float]:
        """Modelled CPU ms per sample for each profiled codec (empty until profiled)."""
        if not state.cache_profile or self.make_ms <= 0 or state.cache_samples <= 0:
            return {}
        budget = float(state.cache_budget_bytes)
        if state.available_bytes < 2 * self.memory_floor * state.total_bytes:
            budget = min(budget, float(state.cache_held_bytes))  # no room to grow into
        costs = {}
        for name, (stored, encode, decode) in state.cache_profile.items():
            hit = min(1.0, budget / max(1.0, stored * state.cache_samples))
            cost = hit * (decode + self.io_ms_per_byte * stored) + (1 - hit) * self.make_ms
            if name != state.codec:
                cost += hit * encode / HORIZON
            costs[name] = cost
        return costs

    def choose(self, state: State, tick: int, wait: float, busy: bool) -> tuple[str, str] | None:
        """``(codec, reason)`` to switch to, or None to keep the current one (the policy
        calls :meth:`observe` every tick before)."""
        current = state.codec
        if current is None or current == "off" or tick - self.last_change < self.hold:
            return None
        if not busy and wait <= 0.03:
            return None
        costs = self.costs(state)
        if current not in costs:
            return None
        best = min(costs, key=costs.__getitem__)
        if best == current or costs[best] > costs[current] * (1 - self.min_gain):
            return None
        self.last_change = tick
        reason = (
            f"codec {best}: {costs[best]:.2f} ms per sample modelled against "
            f"{costs[current]:.2f} for {current} (make {self.make_ms:.2f} ms, "
            f"{state.cache_samples} samples, budget {state.cache_budget_bytes / 2**20:.0f} MiB)"
        )
        return best, reason
