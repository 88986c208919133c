"""OffSwitch: the A/B pattern, the verdicts, and `needed`."""

from __future__ import annotations

import pytest

from drapps.train import OffSwitch


def run(switch: OffSwitch, on_seconds: float, off_seconds: float, steps: int) -> list[bool]:
    pattern = []
    for _ in range(steps):
        pattern.append(switch.enabled)
        switch.record(on_seconds if switch.enabled else off_seconds, items=10)
    return pattern


def test_warmup_then_alternates_then_keeps_a_win() -> None:
    switch = OffSwitch("amp", trial_steps=2, warmup_steps=1)
    assert run(switch, 0.5, 1.0, 7) == [True, True, False, True, False, True, True]
    assert switch.decided is True
    assert "kept" in switch.verdict


def test_switches_off_what_costs_more_than_the_tolerance() -> None:
    switch = OffSwitch("checkpointing", trial_steps=2, warmup_steps=0, tolerance=0.1)
    run(switch, 1.2, 1.0, 4)
    assert switch.decided is False and not switch.enabled
    assert "switched off: 0.83x" in switch.verdict
    within = OffSwitch("checkpointing", trial_steps=2, warmup_steps=0, tolerance=0.25)
    run(within, 1.2, 1.0, 4)
    assert within.decided is True


def test_needed_keeps_it_whatever_it_costs() -> None:
    switch = OffSwitch("checkpointing", trial_steps=1, warmup_steps=0, needed=lambda: True)
    run(switch, 2.0, 1.0, 2)
    assert switch.decided is True and "needed" in switch.verdict


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="trial_steps"):
        OffSwitch("x", trial_steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        OffSwitch("x", warmup_steps=-1)
    with pytest.raises(ValueError, match="seconds"):
        OffSwitch("x").record(0.0, 1)
