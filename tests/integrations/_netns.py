"""A network namespace with only loopback, for engines that otherwise bind to every interface.

Ray binds to the machine's non-loopback address even when told not to; inside a namespace that
has only ``lo`` it cannot, so its tests talk to nothing but this machine. The namespace is made
with ``ip netns add`` and removed afterwards (root and iproute2 needed; the tests skip without).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def can_make_namespaces() -> str | None:
    """Why a loopback-only namespace cannot be made here, or None when it can."""
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if os.geteuid() != 0:
        return "making a network namespace needs root"
    return None


@contextlib.contextmanager
def loopback_namespace() -> Iterator[str]:
    """A fresh namespace with ``lo`` up and no other interface; removed on exit."""
    reason = can_make_namespaces()
    if reason is not None:
        pytest.skip(reason)
    name = f"drapps-test-{os.getpid()}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        # Anything still running in it (a Ray daemon a failed run left) goes with it.
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "delete", name], check=False)


def run_scenario(namespace: str, script: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Run ``script`` (in this folder) inside ``namespace``; it prints its findings as JSON on
    its last line of output."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(HERE.parent)}
    command = ["ip", "netns", "exec", namespace, sys.executable, str(HERE / script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"{script} {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-6000:]}"
        )
    return json.loads(lines[-1])
