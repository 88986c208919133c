"""A real ``redis-server`` on loopback, started and stopped by the tests that need one."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

PASSWORD = "drapps-test-secret"


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    directory: str

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        """Stop it at once, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(*config: str) -> Iterator[RedisServer]:
    """``redis-server`` bound to 127.0.0.1 only, with a password, no persistence, and
    ``config`` (extra ``--name value`` arguments); stopped and its folder removed on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip(
            "redis-server is not installed (make test installs it: apt-get install redis-server)"
        )
    pytest.importorskip("redis", reason="needs the redis extra: pip install 'drapps[redis]'")
    import redis

    directory = tempfile.mkdtemp(prefix="drapps-redis-")
    port = _free_port()
    command = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--requirepass", PASSWORD,
        "--save", "", "--appendonly", "no", "--dir", directory, "--protected-mode", "yes",
        *config,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, process, directory)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.05)
        client.close()
        yield server
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)


def restart(server: RedisServer, *config: str) -> None:
    """Start ``redis-server`` again on the same port (after :meth:`RedisServer.kill`)."""
    binary = shutil.which("redis-server") or "redis-server"
    command = [
        binary, "--bind", "127.0.0.1", "--port", str(server.port), "--requirepass", PASSWORD,
        "--save", "", "--appendonly", "no", "--dir", server.directory, *config,
    ]  # fmt: skip
    server.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=server.port, password=PASSWORD)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
