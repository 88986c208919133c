"""The GIL meter: a sample's time split between C functions and Python bytecode."""

from __future__ import annotations

import sys
import time

from drapps.runtime.gil import GilMeter


def spin(steps: int = 30_000) -> int:
    x = 0
    for i in range(steps):
        x = (x * 31 + i) & 0xFFFF
    return x


def test_python_bytecode_counts_as_held_and_a_c_call_as_released() -> None:
    python, sleeping = GilMeter(), GilMeter()
    with python.measure():
        spin()
    with sleeping.measure():
        time.sleep(0.01)
    assert (python.held_share() or 0) > 0.8
    assert (sleeping.held_share() or 1) < 0.2
    assert GilMeter().held_share() is None  # nothing measured


def test_python_a_c_function_calls_back_counts_as_held() -> None:
    meter = GilMeter()
    with meter.measure():
        sorted(range(40), key=lambda k: spin(1_000) + k)  # sorted is C; the key is Python
    assert (meter.held_share() or 0) > 0.8


def test_take_returns_the_seconds_and_starts_again() -> None:
    meter = GilMeter()
    with meter.measure():
        spin()
    python_s, measured_s = meter.take()
    assert 0 < python_s <= measured_s
    assert meter.take() == (0.0, 0.0) and meter.held_share() is None


def test_a_profiler_already_installed_is_left_alone() -> None:
    def profiler(frame: object, event: str, arg: object) -> None:
        return None

    meter = GilMeter()
    sys.setprofile(profiler)
    try:
        with meter.measure():
            spin(1_000)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert meter.held_share() is None
