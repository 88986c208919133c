"""The bench's process-tree usage: CPU time of workers started or retired inside the timed
window is counted, a scenario's helpers are not. Readings are taken by hand (the sampler's
interval is an hour), so no timing decides a test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from drapps.bench.usage import TreeUsage

BURN_S = 0.3
# Burns CPU when told, says so, and exits when told: its last CPU reading can be taken first.
_CHILD = """
import sys, time
sys.stdin.readline()
start = time.process_time()
while time.process_time() - start < float(sys.argv[1]):
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""


@contextmanager
def child() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(BURN_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


def burn(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("go\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "burnt"


def retire(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("exit\n")
    process.stdin.flush()
    process.wait(timeout=30)


@pytest.mark.parametrize("born_inside", [True, False], ids=["born-inside", "alive-at-start"])
def test_a_worker_retired_mid_window_counts_its_cpu(born_inside: bool) -> None:
    usage = TreeUsage(set, interval=3600)
    try:
        if born_inside:
            usage.open_window()
        with child() as worker:
            if not born_inside:
                usage.open_window()
            burn(worker)
            usage.sample()  # the sampler's last reading before the worker goes
            retire(worker)
        total, mine = usage.close_window()
    finally:
        usage.stop()
    assert total - mine >= BURN_S * 0.9


def test_a_scenario_helper_is_left_out() -> None:
    with child() as helper:
        usage = TreeUsage(lambda: {helper.pid}, interval=3600)
        try:
            usage.open_window()
            burn(helper)
            usage.sample()
            total, mine = usage.close_window()
        finally:
            usage.stop()
    assert total - mine < BURN_S * 0.5
    assert usage.peak > 0
