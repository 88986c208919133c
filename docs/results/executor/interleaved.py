"""Interleaved rounds for the measurement scripts beside this one: each run in a fresh
interpreter (so that one loader does not inherit what another touched), the systems' order
reversed every other round, and a header naming the environment."""

import os
import platform
import subprocess
import sys
from collections.abc import Iterator

import torch

import drapps


def environment(settings: str) -> str:
    """The header line: Python, torch, drapps, the CPUs and the script's ``settings``."""
    return (
        f"# python {platform.python_version()}, torch {torch.__version__}, drapps "
        f"{drapps.__version__}, {os.cpu_count()} CPUs, {settings}"
    )


def interleaved(
    child: str, systems: list[str], rounds: int, *args: str
) -> Iterator[tuple[str, str]]:
    """``(system, the last line child printed)`` for each run of ``python -c child system
    *args``, ``rounds`` times over ``systems``."""
    for r in range(rounds):
        for system in systems if r % 2 == 0 else systems[::-1]:
            out = subprocess.run(
                [sys.executable, "-c", child, system, *args],
                capture_output=True, text=True, timeout=600, check=True,
            )  # fmt: skip
            yield system, out.stdout.strip().splitlines()[-1]


def rates(child: str, systems: list[str], unit: str) -> dict[str, list[float]]:
    """Each system's rates over ``ROUNDS`` interleaved rounds (default 3), where ``child``
    prints one number, in ``unit``: the environment first, then each run as it ends."""
    rounds = int(os.environ.get("ROUNDS", 3))
    print(environment(f"{rounds} rounds"))
    got: dict[str, list[float]] = {s: [] for s in systems}
    for system, line in interleaved(child, systems, rounds):
        got[system].append(float(line))
        print(f"{system}: {got[system][-1]:,.0f} {unit}", flush=True)
    return got


def runs(values: list[float]) -> str:
    """The runs of a table row: ``1,234 / 1,301 / 1,187``."""
    return " / ".join(f"{x:,.0f}" for x in values)
