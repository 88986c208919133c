"""Scenario families: valid draws across the range, seeded, and a held-out set."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.sim import Simulator
from drapps.sim.families import draw, family_names


def test_training_and_held_out_families_are_disjoint() -> None:
    train, held_out = family_names(held_out=False), family_names(held_out=True)
    assert len(train) >= 5 and len(held_out) >= 3
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == family_names()


@pytest.mark.parametrize("family", family_names())
def test_every_family_draws_runnable_scenarios(family: str) -> None:
    rng = np.random.default_rng(0)
    cores = set()
    for _ in range(30):
        scenario = draw(family, rng, 60.0)
        assert scenario.name == family
        cores.add(scenario.pipeline.cores)
        assert 2 <= scenario.pipeline.cores <= 64
        assert all(c.at is None or 0 < c.at < 60.0 for c in scenario.changes)
    assert len(cores) >= 3  # the draws span machine sizes
    sim = Simulator(scenario, workers=scenario.pipeline.cores, seed=0)
    sim.run_until(20.0)
    assert sim.totals.consumed > 0


def test_draws_are_seeded() -> None:
    a = draw("contention", np.random.default_rng(5))
    b = draw("contention", np.random.default_rng(5))
    c = draw("contention", np.random.default_rng(6))
    assert a == b and a != c


def test_unknown_family_is_named() -> None:
    with pytest.raises(ValueError, match=r"scenario family must be one of \[.*'cpu-bound'"):
        draw("cpu", np.random.default_rng(0))
