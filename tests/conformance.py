"""The conformance check every engine runs (as torchdata's ``run_test_save_load_state``).

One function, :func:`check_engine`, holds the loader contract the engines share: the epoch
a reference gives (DataLoader's, where the batches have no drapps randomness), the same batches
after a mid-epoch ``state_dict`` / ``load_state_dict`` at several points, exactly once in
order when a worker is killed mid-epoch, ready batches within the memory budget, and nothing
left behind after ``close()`` or garbage collection. ``tests/engines/test_conformance.py``
runs it over every local engine and mode; the Ray and Redis integration tests run it too.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from typing import Any

from helpers import assert_batches_equal, leaks

import drapps

MakeLoader = Callable[..., drapps.Loader]


def check_engine(
    make: MakeLoader,
    expected: list[Any],
    *,
    resume_at: tuple[int, ...] = (0, 1, 3),
    kill: Callable[[drapps.Loader], None] | None = None,
    budget_batches: int | None = 3,
    clean: bool = True,
) -> None:
    """Assert the engine behind ``make`` keeps the loader contract.

    Args:
        make: a fresh loader for one epoch; keyword arguments override its own (the memory
            budget). It seeds whatever the order is drawn from, so every call gives the same
            epoch.
        expected: that epoch's batches, from a reference (DataLoader, or drapps inline).
        resume_at: batches taken before ``state_dict`` (the last batch is always added).
        kill: called on the loader after its third batch (kills a worker); None: no workers.
        budget_batches: the memory budget, in batches, for the stalled-consumer check (more
            than the workers, which each take one task before the first batch's size is
            known); None: skip.
        clean: check that nothing of drapps' is left behind (processes, threads, shm).
    """
    with make() as loader:
        assert_batches_equal(list(loader), expected)
        assert loader.stats().batches == len(expected)
    for taken in sorted({*resume_at, len(expected) - 1}):
        _check_resume(make, expected, taken)
    if kill is not None:
        with make() as loader:
            got = []
            for n, batch in enumerate(loader):
                got.append(batch)
                if n == 2:
                    kill(loader)
            assert_batches_equal(got, expected)  # each batch exactly once, in order
    if budget_batches is not None:
        _check_budget(make, expected, budget_batches)
    if clean:
        dropped = make()
        iterator = iter(dropped)
        next(iterator)
        del iterator, dropped  # mid-epoch, without close(): garbage collection stops it
        gc.collect()
        assert leaks() == {}


def _check_resume(make: MakeLoader, expected: list[Any], taken: int) -> None:
    with make() as first:
        iterator = iter(first)
        head = [next(iterator) for _ in range(taken)]
        state = json.loads(json.dumps(first.state_dict()))  # checkpoints hold plain data
    with make() as second:
        second.load_state_dict(state)
        rest = list(second)
    assert_batches_equal(head + rest, expected)


def _check_budget(make: MakeLoader, expected: list[Any], batches: int) -> None:
    one = _nbytes(expected[0])
    budget = batches * one
    with make(memory_budget=budget) as loader:
        got = []
        for batch in loader:
            if not got:
                time.sleep(0.5)  # a stalled step: the engine may run ahead only to the budget
            got.append(batch)
        peak = loader.stats().peak_ready_bytes
    assert_batches_equal(got, expected)
    assert peak <= budget, f"ready batches peaked at {peak} bytes over a {budget}-byte budget"


def _nbytes(batch: Any) -> int:
    if isinstance(batch, dict):
        return sum(_nbytes(v) for v in batch.values())
    if isinstance(batch, list | tuple):
        return sum(_nbytes(v) for v in batch)
    nbytes = getattr(batch, "nbytes", None)
    return int(nbytes) if nbytes is not None else 8
