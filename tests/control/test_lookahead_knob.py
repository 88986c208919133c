"""The lookahead knob: doubling and halving within bounds, and the loader's pool engine has it."""

from __future__ import annotations

from helpers import SlowDataset, state, wait_until

import drapps
from drapps.control.controller import Bounds
from drapps.control.knobs import LookaheadKnob


def test_the_lookahead_doubles_and_halves_within_its_bounds() -> None:
    applied: list[int] = []
    knob = LookaheadKnob(applied.append, low=1, high=16)
    assert knob.propose(state(lookahead=4), +1, {}) == 8
    assert knob.propose(state(lookahead=4), -1, {}) == 2
    assert knob.propose(state(lookahead=12), +1, {}) == 16
    assert knob.propose(state(lookahead=1), -1, {}) == 1
    assert knob.propose(state(lookahead=4), None, {}) == 4
    held = LookaheadKnob(applied.append, low=1, high=16, adjustable=False)
    assert held.propose(state(lookahead=4), +1, {}) == 4


def test_a_pool_loader_reports_its_lookahead_and_the_controller_may_move_it() -> None:
    with drapps.Loader(SlowDataset(64), batch_size=4, workers=2, prefetch=3) as loader:
        next(iter(loader))
        assert loader.stats().lookahead == 6  # twice the prefetch depth by default
        knobs = loader._parts.engine.knobs(Bounds(min_workers=1, max_workers=4, max_prefetch=8))
        lookahead = next(k for k in knobs if k.name == "lookahead")
        assert lookahead.adjustable and lookahead.bounds() == (1, 64)
    with drapps.Loader(SlowDataset(64), batch_size=4, workers=2, lookahead=3) as loader:
        next(iter(loader))
        assert loader.stats().lookahead == 3
        knobs = loader._parts.engine.knobs(Bounds(min_workers=1, max_workers=4, max_prefetch=8))
        lookahead = next(k for k in knobs if k.name == "lookahead")
        assert not lookahead.adjustable  # the user fixed it
        loader._parts.engine.dispatcher.set_lookahead(5)
        assert wait_until(lambda: loader.stats().lookahead == 5)
