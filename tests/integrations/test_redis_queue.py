"""The Redis batch queue: ``drapps serve`` producers and ``Loader(source=...)``, against a real
redis-server on loopback with a password."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _queue_data import Photos
from _redis_server import PASSWORD, RedisServer, redis_server, restart
from conformance import check_engine
from helpers import wait_until

import drapps
from drapps.integrations import wire
from drapps.integrations.redis_queue import QueueAddress, QueueInUseError, QueueReader, iterate
from drapps.runtime.plan import SampledPlan

pytestmark = pytest.mark.integration  # starts real engines or interpreters

HERE = Path(__file__).parent


def serve(
    server: RedisServer, queue: str, factory: str = "photos", *extra: str
) -> subprocess.Popen[bytes]:
    """``drapps serve`` as its own process (the password from the environment)."""
    command = [
        sys.executable, "-m", "drapps.cli", "serve",
        "--redis", f"redis://127.0.0.1:{server.port}/0", "--queue", queue,
        "--password-env", "DRAPPS_TEST_REDIS_PASSWORD",
        "--dataset", f"_queue_data:{factory}", "--claim-after", "1", *extra,
    ]  # fmt: skip
    env = {**os.environ, "DRAPPS_TEST_REDIS_PASSWORD": PASSWORD}
    return subprocess.Popen(command, cwd=HERE, env=env, start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as running:
        yield running


def source(server: RedisServer, queue: str) -> str:
    return f"{server.url}?queue={queue}"


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


def local(epochs: int = 1, **kwargs: Any) -> list[list[dict[str, Any]]]:
    loader = drapps.Loader(Photos(), batch_size=8, shuffle=True, seed=5, cache=None, **kwargs)
    return [list(loader) for _ in range(epochs)]


def test_batches_are_a_local_loaders_in_order_for_every_epoch(server: RedisServer) -> None:
    producers = serve(server, "same", "photos", "--workers", "2")
    try:
        with drapps.Loader(
            source=source(server, "same"), batch_size=8, shuffle=True, seed=5
        ) as loader:
            assert len(loader) == 12
            got = [list(loader) for _ in range(2)]
            assert loader.stats().batches == 24
    finally:
        stop(producers)
    reference = local(2)
    assert same(got[0], reference[0]) and same(got[1], reference[1])


def test_a_key_drawn_again_draws_on_the_producers_as_in_a_local_loader(
    server: RedisServer,
) -> None:
    """A plan that gives a key again (a rank's shard padded with repeated keys) posts each
    key's repeat with its task: the producers draw anew for each, as a local loader does."""
    batches = [[0, 1, 1, 2], [0, 3, 1, 1], [4, 0, 2, 2]]
    plan = SampledPlan(tuple(batches), 5, 0)
    assert plan.repeats_of(1) == (1, 0, 2, 3)
    producers = serve(server, "again", "photos")
    queue = QueueReader(
        QueueAddress.parse(source(server, "again")), max_batch_bytes=2**20, timeout=60
    )
    try:
        got = list(iterate(queue, plan, 0, 2, lambda _: None))
    finally:
        queue.close()
        stop(producers)
    with drapps.Loader(Photos(), batch_sampler=batches, seed=5, workers=0, cache=None) as loader:
        assert same(got, list(loader))
    noise = torch.cat([batch["noise"] for batch in got])
    assert len({tuple(row.tolist()) for row in noise}) == 12  # every repeat drew anew


def test_a_killed_producer_loses_and_repeats_nothing(server: RedisServer) -> None:
    first = serve(server, "kill", "slow_photos")
    second = serve(server, "kill", "slow_photos")
    try:
        with drapps.Loader(
            source=source(server, "kill"), batch_size=8, shuffle=True, seed=5
        ) as loader:
            got = []
            for n, batch in enumerate(loader):
                got.append(batch)
                if n == 2:
                    os.killpg(first.pid, signal.SIGKILL)  # mid-batch: its task is pending
    finally:
        stop(first)
        stop(second)
    assert same(got, local()[0])
    assert sorted(int(i) for b in got for i in b["index"]) == list(range(96))


def test_the_ready_stream_is_bounded(server: RedisServer) -> None:
    import redis

    producers = serve(server, "bounded", "photos", "--max-ready", "3")
    try:
        with drapps.Loader(
            source=source(server, "bounded"), batch_size=8, shuffle=True, seed=5, prefetch=12
        ) as loader:
            it = iter(loader)
            next(it)
            time.sleep(1.5)  # the producer runs ahead until the stream holds 3
            client = redis.Redis(port=server.port, password=PASSWORD)
            assert client.xlen("bounded:ready") == 3
            rest = list(it)
            assert len(rest) == 11
            client.close()
    finally:
        stop(producers)


def test_redis_dying_is_an_error_and_state_dict_resumes(server: RedisServer) -> None:
    producers = serve(server, "resume", "slow_photos")
    try:
        loader = drapps.Loader(source=source(server, "resume"), batch_size=8, shuffle=True, seed=5)
        got: list[dict[str, Any]] = []
        with pytest.raises(ConnectionError, match="lost the Redis of queue 'resume'") as info:
            for n, batch in enumerate(loader):
                got.append(batch)
                if n == 4:
                    server.kill()
        assert PASSWORD not in str(info.value)
        state = loader.state_dict()
        assert state["next_batch"] == len(got) == 5
        loader.close()
        restart(server)  # empty: no persistence; the producer reconnects by itself
        with drapps.Loader(
            source=source(server, "resume"), batch_size=8, shuffle=True, seed=5
        ) as resumed:
            resumed.load_state_dict(state)
            got += list(resumed)
    finally:
        stop(producers)
    assert same(got, local()[0])


def test_the_redis_source_passes_the_engine_conformance_check(server: RedisServer) -> None:
    # Producers seed each sample from (seed, epoch, index): the reference in this process
    # does with a seed too (without one, it would draw from this process's RNGs).
    kwargs: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 3}
    expected = list(drapps.Loader(Photos(), workers=0, cache=None, **kwargs))

    def make(**overrides: Any) -> drapps.Loader:
        return drapps.Loader(source=source(server, "conform"), **{**kwargs, **overrides})

    producers = serve(server, "conform", "photos")
    try:
        # The producer is this test's child: the leak probe would count it (and the server).
        check_engine(make, expected, clean=False)
    finally:
        stop(producers)


def test_a_failing_sample_is_named_on_the_training_host(server: RedisServer) -> None:
    producers = serve(server, "broken", "broken_photos")
    try:
        with drapps.Loader(source=source(server, "broken"), batch_size=4) as loader:
            with pytest.raises(drapps.SampleError, match="sample 13 failed in __getitem__"):
                list(loader)
    finally:
        stop(producers)


def test_oversized_and_malformed_batches_are_refused(server: RedisServer) -> None:
    producers = serve(server, "sizes", "photos")
    try:
        with drapps.Loader(
            source=drapps.Source(source(server, "sizes"), max_batch_bytes=1024), batch_size=8
        ) as loader:
            with pytest.raises(ValueError, match="over max_batch_bytes=1024; refusing to read"):
                next(iter(loader))
    finally:
        stop(producers)
    import pickle

    with pytest.raises(wire.WireError, match="bad magic"):
        wire.decode(pickle.dumps({"x": 1}))  # never unpickled
    good = bytes(wire.encode({"x": torch.arange(100)}))  # 800 bytes of data, then padding
    with pytest.raises(wire.WireError, match="overruns"):
        wire.decode(good[:-100])
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.encode({"x": object()})


def test_a_wrong_password_or_no_producer_is_a_clear_error(server: RedisServer) -> None:
    wrong = f"redis://:nope@127.0.0.1:{server.port}/0?queue=q"
    with pytest.raises(ConnectionError, match="cannot reach the Redis of queue 'q'") as info:
        drapps.Loader(source=wrong, batch_size=8)
    assert "nope" not in str(info.value)
    with pytest.raises(TimeoutError, match="no producer has announced itself on queue 'empty'"):
        drapps.Loader(source=source(server, "empty"), batch_size=8, timeout=0.5)


def test_source_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="source must be a Redis URL"):
        drapps.Loader(source="http://127.0.0.1:6379", batch_size=8)
    with pytest.raises(ValueError, match=r"transform: with source=\.\.\. the producers"):
        drapps.Loader(source="redis://127.0.0.1:1/0", batch_size=8, transform=abs)
    with pytest.raises(ValueError, match="dataset is required"):
        drapps.Loader(batch_size=8)
    nowhere = "redis://127.0.0.1:1/0?queue=q"
    with pytest.raises(drapps.ArgumentError, match="prefetch must be an int >= 1 or 'auto', got 0"):
        drapps.Loader(source=nowhere, batch_size=8, prefetch=0)
    # Counts of NumPy's are numbers there too: these pass the checks and reach the connection.
    with pytest.raises(ConnectionError, match="cannot reach the Redis of queue 'q'"):
        drapps.Loader(source=nowhere, batch_size=8, prefetch=np.int64(4), timeout=np.float32(1))
    assert QueueAddress.parse("redis://h:1/2?queue=abc") == QueueAddress("redis://h:1/2", "abc")


def test_a_producer_without_redis_says_so_and_idles_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from drapps.integrations.redis_queue import Producer

    producer = Producer(QueueAddress("redis://:pw@127.0.0.1:1/0", "q"), Photos(4))
    with caplog.at_level(logging.WARNING, logger="drapps.integrations.redis_queue"):
        assert producer.run(idle_exit_s=1.5) == 0
    warnings = [r.getMessage() for r in caplog.records if "cannot use Redis" in r.getMessage()]
    assert len(warnings) == 1 and "pw" not in warnings[0]


def test_producers_gone_quiet_is_a_timeout_not_a_lost_redis(server: RedisServer) -> None:
    import redis

    client = redis.Redis(port=server.port, password=PASSWORD)
    client.hset("quiet:meta", mapping={"length": 16, "dataset": "Photos"})  # announced, then gone
    client.close()
    with drapps.Loader(source=source(server, "quiet"), batch_size=4, timeout=1) as loader:
        with pytest.raises(TimeoutError, match="no batch arrived on queue 'quiet' for 1 s"):
            next(iter(loader))


class FakeProducer:
    """A producer that answers each task with whatever ``plant(client, gen, batch)`` stores:
    ``(key, announced nbytes)``. At most ``limit`` tasks, so a reader that keeps asking ends
    in its own timeout rather than the test's."""

    def __init__(
        self,
        server: RedisServer,
        queue: str,
        plant: Callable[[Any, str, int], tuple[str, int]],
        limit: int = 8,
    ) -> None:
        import redis

        self.client: Any = redis.Redis(port=server.port, password=PASSWORD)
        self.queue, self.plant, self.limit = queue, plant, limit
        self.answered: dict[int, int] = {}  # batch id -> times answered
        self.client.hset(f"{queue}:meta", mapping={"length": 16, "dataset": "Photos"})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import redis

        tasks = f"{self.queue}:tasks"
        with contextlib.suppress(redis.exceptions.ResponseError):  # the group is there
            self.client.xgroup_create(tasks, "producers", id="0", mkstream=True)
        while not self._stop.is_set() and sum(self.answered.values()) < self.limit:
            got = self.client.xreadgroup("producers", "fake", {tasks: ">"}, count=1, block=100)
            for _, entries in got or []:
                for entry_id, fields in entries:
                    gen, batch = fields[b"gen"].decode(), int(fields[b"batch"])
                    key, nbytes = self.plant(self.client, gen, batch)
                    fields_out = {"gen": gen, "batch": batch, "key": key, "nbytes": nbytes}
                    self.answered[batch] = self.answered.get(batch, 0) + 1  # before it is read
                    self.client.xadd(f"{self.queue}:ready", fields_out)
                    self.client.xack(tasks, "producers", entry_id)

    def sent_bytes(self) -> int:
        """Bytes Redis has sent to its clients so far."""
        return int(self.client.info("stats")["total_net_output_bytes"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()


MIB = 2**20


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (4 * MIB, r"holds 4194304 bytes in Redis, over max_batch_bytes=1048576 \(its entry "
                  r"announced 64\)"),
        (100, r"holds 100 bytes in Redis, but its entry announced 64"),
    ],
    ids=["over-the-limit", "not-as-announced"],
)  # fmt: skip
def test_stored_bytes_that_are_not_what_was_announced_are_refused_unread(
    server: RedisServer, stored: int, expected: str
) -> None:
    def plant(client: Any, gen: str, batch: int) -> tuple[str, int]:
        key = f"liar:batch:{gen}:{batch}"
        client.set(key, b"\0" * stored)
        return key, 64  # announced small

    producer = FakeProducer(server, "liar", plant)
    try:
        with drapps.Loader(
            source=drapps.Source(source(server, "liar"), max_batch_bytes="1MiB"),
            batch_size=4,
            timeout=3,
        ) as loader:
            before = producer.sent_bytes()
            with pytest.raises(ValueError, match=f"batch 0 on queue 'liar' {expected}"):
                next(iter(loader))
            assert producer.sent_bytes() - before < MIB  # its bytes never left Redis
            assert producer.answered[0] == 1  # and were not asked for again
    finally:
        producer.close()


def test_bytes_that_keep_vanishing_are_an_error_after_a_few_tries(server: RedisServer) -> None:
    def plant(client: Any, gen: str, batch: int) -> tuple[str, int]:
        return f"gone:batch:{gen}:{batch}", 64  # announced, never stored (evicted, say)

    producer = FakeProducer(server, "gone", plant, limit=20)
    try:
        with drapps.Loader(source=source(server, "gone"), batch_size=4, timeout=3) as loader:
            with pytest.raises(RuntimeError, match="batch 0 on queue 'gone' was made 4 times"):
                next(iter(loader))
            assert producer.answered[0] == 4
    finally:
        producer.close()


def test_a_second_reader_of_a_queue_is_refused_naming_the_first(server: RedisServer) -> None:
    producers = serve(server, "one", "photos")
    try:
        with drapps.Loader(
            source=source(server, "one"), batch_size=8, shuffle=True, seed=5
        ) as first:
            batches = iter(first)
            got = [next(batches), next(batches)]
            holder = rf"host {socket.gethostname()}, pid {os.getpid()} \(this process\), since "
            with pytest.raises(
                QueueInUseError, match=rf"queue 'one' is already read by another loader \({holder}"
            ) as info:
                drapps.Loader(source=source(server, "one"), batch_size=8, shuffle=True, seed=5)
            assert PASSWORD not in str(info.value)
            got += list(batches)  # the first reads on, untouched
        assert same(got, local()[0])
        # Closed, it lets go at once: the next loader reads the queue.
        with drapps.Loader(
            source=source(server, "one"), batch_size=8, shuffle=True, seed=5
        ) as after:
            assert same(list(after), local()[0])
    finally:
        stop(producers)


@pytest.mark.parametrize("drops", [False, True])
def test_a_forked_child_leaves_its_parents_hold_on_the_queue(
    server: RedisServer, drops: bool
) -> None:
    """A child forked while the loader reads (a helper process) inherits the reader's
    finalizer; exiting, or collecting its copy of the loader, it lets go of nothing."""
    producers = serve(server, "forked", "photos")
    try:
        with drapps.Loader(
            source=source(server, "forked"), batch_size=8, shuffle=True, seed=5
        ) as first:
            batches = iter(first)
            got = [next(batches), next(batches)]
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                if drops:
                    del batches, first
                    gc.collect()
                atexit._run_exitfuncs()
                os._exit(0)
            assert os.waitpid(pid, 0)[1] == 0
            with pytest.raises(QueueInUseError, match=r"queue 'forked' is already read"):
                drapps.Loader(source=source(server, "forked"), batch_size=8, shuffle=True, seed=5)
            got += list(batches)
        assert same(got, local()[0])
    finally:
        stop(producers)


def reader(server: RedisServer, queue: str, **options: Any) -> QueueReader:
    return QueueReader(
        QueueAddress.parse(source(server, queue)), max_batch_bytes=MIB, timeout=5, **options
    )


def test_a_crashed_readers_hold_on_the_queue_runs_out(server: RedisServer) -> None:
    code = (
        "import sys, time\n"
        "from drapps.integrations.redis_queue import QueueAddress, QueueReader\n"
        "address = QueueAddress.parse(sys.argv[1])\n"
        "held = QueueReader(address, max_batch_bytes=1, timeout=5, lease_s=1)\n"
        "print('holding', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, source(server, "crash")],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        with pytest.raises(QueueInUseError, match=rf"pid {holder.pid}, since .* runs out in"):
            reader(server, "crash")
        os.killpg(holder.pid, signal.SIGKILL)  # it never lets go: its hold runs out
        holder.wait()
        taken: list[QueueReader] = []

        def take() -> bool:
            with contextlib.suppress(QueueInUseError):
                taken.append(reader(server, "crash"))
            return bool(taken)

        assert wait_until(take, timeout=10)
        taken[0].close()
    finally:
        stop(holder)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_reader_whose_queue_was_taken_says_by_whom_rather_than_time_out(
    server: RedisServer,
) -> None:
    import redis

    first = reader(server, "taken", lease_s=0.6)
    try:
        gen = first.begin()
        # Another reader holds it now (the first was paused past its lease, say).
        other = {"host": "elsewhere", "pid": 4242, "since": time.time(), "token": "x"}
        client = redis.Redis(port=server.port, password=PASSWORD)
        client.set("taken:reader", json.dumps(other))
        client.close()
        with pytest.raises(QueueInUseError, match=r"host elsewhere, pid 4242, since"):
            first.receive(gen, 0, {})
    finally:
        first.close()
