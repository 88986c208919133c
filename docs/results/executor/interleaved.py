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
