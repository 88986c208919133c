"""A real ``redis-server`` on loopback, started and stopped by the tests that need one."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from helpers import free_port

PASSWORD = "drapps-test-secret"


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    directory: str
    config: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        """Stop it at once, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _start(port: int, directory: str, config: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """``redis-server`` bound to 127.0.0.1 only, with a password and no persistence; returns
    once it answers."""
    import redis

    command = [
        shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1",
        "--port", str(port), "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
        "--dir", directory, "--protected-mode", "yes", *config,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return process
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    process.kill()
                    raise
                time.sleep(0.05)
    finally:
        client.close()


@contextlib.contextmanager
def redis_server(*config: str) -> Iterator[RedisServer]:
    """A fresh server with ``config`` (extra ``--name value`` arguments); stopped and its
    folder removed on exit."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it with apt)")
    pytest.importorskip("redis", reason="needs the redis extra: pip install 'drapps-loader[redis]'")
    directory = tempfile.mkdtemp(prefix="drapps-redis-")
    port = free_port()
    server = None
    try:
        server = RedisServer(port, _start(port, directory, config), directory, config)
        yield server
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(directory, ignore_errors=True)


def restart(server: RedisServer) -> None:
    """Start it again, empty, on the same port (after :meth:`RedisServer.kill`)."""
    server.process = _start(server.port, server.directory, server.config)
