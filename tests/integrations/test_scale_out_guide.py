"""The scale-out guide's examples (the ```py blocks of docs/scale-out.md) run as written,
against real engines: the Ray one in a loopback-only namespace, the Redis one with a real
redis-server and a ``drapps serve`` producer on the dataset module it names."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _netns import loopback_namespace
from _redis_server import redis_server

pytestmark = pytest.mark.integration  # starts real engines or interpreters

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "scale-out.md").read_text()
BLOCKS = re.findall(r"```py\n(.*?)```", GUIDE, flags=re.DOTALL)
RAY_BLOCK, REDIS_BLOCK = BLOCKS  # the guide's two scale-out examples, in order

MYDATA = """
import torch


class Squares:
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.full((3, 8, 8), i % 251, dtype=torch.uint8), i


def make_dataset():
    return Squares()
"""


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=240, env=env or dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.mark.timeout(300)
def test_the_ray_example_runs(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="needs the ray extra: pip install 'drapps-loader[ray]'")
    (tmp_path / "example.py").write_text(RAY_BLOCK)
    with loopback_namespace() as namespace:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        out = run(["ip", "netns", "exec", namespace, sys.executable, "example.py"], tmp_path, env)
    assert out.strip().splitlines()[-1] == str(len(os.sched_getaffinity(0)))


@pytest.mark.timeout(300)
def test_the_redis_example_runs(tmp_path: Path) -> None:
    (tmp_path / "mydata.py").write_text(MYDATA)
    with redis_server() as server:
        code = REDIS_BLOCK.replace("redis://:secret@127.0.0.1:6379/0", server.url)
        assert code != REDIS_BLOCK
        (tmp_path / "example.py").write_text(code)
        serve = [
            sys.executable,
            "-m",
            "drapps.cli",
            "serve",
            "--redis",
            f"{server.url}?queue=train",
        ]
        serve += ["--dataset", "mydata:make_dataset"]
        producer = subprocess.Popen(serve, cwd=tmp_path, start_new_session=True)
        try:
            run([sys.executable, "example.py"], tmp_path)
        finally:
            os.killpg(producer.pid, signal.SIGTERM)
            producer.wait(timeout=30)
