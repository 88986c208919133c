"""The workers' priority: lowered once the training process competes with them for the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from helpers import state

import drapps
from drapps.control.knobs import PriorityKnob


def test_the_rule_needs_a_run_of_competing_ticks_and_never_goes_back() -> None:
    applied: list[str] = []
    knob = PriorityKnob(applied.append, window=3)
    busy = state(cores=2, cpu_util=0.95, main_cpu=0.9)
    calm = state(cores=2, cpu_util=0.95, main_cpu=0.1)  # the loop waits on an accelerator
    idle = state(cores=2, cpu_util=0.5, main_cpu=0.8)  # a CPU step, but cores to spare
    proposals = [knob.propose(s, None, {}) for s in (busy, busy, calm, busy, idle, busy, busy)]
    assert proposals == ["normal"] * 7  # every run of 3 was broken
    starved = state(cores=2, cpu_util=1.0, main_cpu=0.3, main_wait=0.6)  # asks, is not given
    assert PriorityKnob(applied.append, window=1).propose(starved, None, {}) == "low"
    assert knob.propose(busy, None, {}) == "low"
    knob.apply("low")
    assert applied == ["low"] and knob.propose(calm, None, {}) == "low"  # one-way
    held = PriorityKnob(applied.append, window=1, adjustable=False)
    assert held.propose(busy, None, {}) == "normal"
    with pytest.raises(ValueError, match="window must be >= 1"):
        PriorityKnob(applied.append, window=0)


class Costly:
    """Samples that cost a few ms of CPU each."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> np.ndarray:
        a = np.random.default_rng(index).random((90, 90))
        for _ in range(4):
            a = a @ a / 90
        return a.astype(np.float32)


MAX_NICE = 19
"""The lowest priority Linux gives; niceness asked above it is clamped there."""


def _niceness(loader: drapps.Loader) -> set[int]:
    """The niceness of each live worker (one the controller just stopped is left out)."""
    values = set()
    for pid in loader._parts.engine.dispatcher.pool.pids():  # type: ignore[attr-defined]
        try:
            values.add(psutil.Process(pid).nice())
        except psutil.NoSuchProcess:
            continue
    return values


@pytest.mark.timeout(60)
def test_a_cpu_bound_training_loop_gets_its_workers_to_yield() -> None:
    """A training step on the CPU while another process keeps the cores busy: the workers
    drop to nice +10 (capped at 19, the OS's lowest), those started later too."""
    base = os.nice(0)
    low = min(base + 10, MAX_NICE)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with drapps.Loader(
            Costly(), batch_size=8, workers="auto", max_workers=3, control_interval=0.1, seed=0
        ) as loader:
            it = iter(loader)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _niceness(loader) != {low}:
                next(it)
                spin = time.process_time() + 0.05  # the training step, on the CPU
                while time.process_time() < spin:
                    pass
            assert _niceness(loader) == {low}
            loader._parts.engine.dispatcher.resize(3)  # type: ignore[attr-defined]
            assert _niceness(loader) == {low}  # a worker started now yields too
    finally:
        hog.kill()
        hog.wait()


@pytest.mark.timeout(60)
def test_a_loop_that_waits_on_an_accelerator_leaves_them_at_normal_priority() -> None:
    base = os.nice(0)
    with drapps.Loader(
        Costly(), batch_size=8, workers="auto", max_workers=3, control_interval=0.1, seed=0
    ) as loader:
        it = iter(loader)
        end = time.monotonic() + 4  # 40 ticks: several windows
        while time.monotonic() < end:
            next(it)
            time.sleep(0.02)  # the step runs elsewhere
        assert _niceness(loader) == {base}


@pytest.mark.timeout(300)  # a fresh interpreter imports torch: minutes at nice 19 beside hogs
def test_low_priority_is_relative_to_the_training_process() -> None:
    """A training process already at nice 4 gets workers at nice 14, not 10 (which would
    raise them above it where the OS allows)."""
    script = textwrap.dedent(
        """
        import os, psutil, drapps
        os.nice(4)
        with drapps.Loader(list(range(16)), batch_size=4, workers=2, seed=0) as loader:
            next(iter(loader))
            assert loader._parts.engine.dispatcher.set_priority("low")
            pids = loader._parts.engine.dispatcher.pool.pids()
            print(sorted(psutil.Process(pid).nice() for pid in pids))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    parent = min(os.nice(0) + 4, MAX_NICE)  # the script's own niceness
    low = min(parent + 10, MAX_NICE)
    assert done.stdout.strip() == f"[{low}, {low}]"
