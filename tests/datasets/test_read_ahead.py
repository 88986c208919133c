"""ReadAhead: hinted reads run in background threads, once each, and hand back what they read."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from collections import Counter
from typing import Any

import pytest
from helpers import wait_until

from drapps.datasets import ReadAhead


class CountingRead:
    """Upper-cases its key and counts the reads of each."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, key: str) -> str:
        with self.lock:
            self.reads[key] += 1
        return key.upper()


def test_a_hinted_key_is_read_once_and_taken_as_read() -> None:
    read = CountingRead()
    reads = ReadAhead(read, threads=2)
    try:
        reads.hint(["a", "b", "c"])
        reads.hint(["b", "c", "d"])  # hinted again: not read again
        assert [reads.take(k) for k in "abcd"] == ["A", "B", "C", "D"]
        assert reads.take("e") == "E"  # never hinted: read where it is asked for
        assert read.reads == Counter({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1})
        assert reads.waiting == 0
    finally:
        reads.close()


def test_hinted_reads_run_at_once() -> None:
    # Four reads that each wait for the other three: they finish only if all four run
    # together (a read that is not started would leave the barrier broken after 10 s).
    barrier = threading.Barrier(4, timeout=10)

    def read(key: str) -> str:
        barrier.wait()
        return key

    reads = ReadAhead(read, threads=4)
    try:
        reads.hint(list("wxyz"))
        assert [reads.take(k) for k in "wxyz"] == list("wxyz")
    finally:
        reads.close()


def test_a_read_nobody_started_is_made_by_the_taker_rather_than_waited_for() -> None:
    # One thread, stuck on the first key: the second key is read by take() itself.
    release = threading.Event()

    def read(key: str) -> str:
        if key == "slow":
            release.wait(10)
        return key

    reads = ReadAhead(read, threads=1)
    try:
        reads.hint(["slow", "next"])
        assert wait_until(lambda: reads._slots["slow"].state == "reading", timeout=10)
        assert reads.take("next") == "next"
        release.set()
        assert reads.take("slow") == "slow"
    finally:
        release.set()
        reads.close()


def test_a_failed_read_raises_at_its_take_and_the_rest_go_on() -> None:
    def read(key: str) -> str:
        if key == "bad":
            raise FileNotFoundError(key)
        return key

    reads = ReadAhead(read, threads=2)
    try:
        reads.hint(["ok", "bad", "fine"])
        assert reads.take("ok") == "ok"
        with pytest.raises(FileNotFoundError, match="bad"):
            reads.take("bad")
        assert reads.take("fine") == "fine"
    finally:
        reads.close()


def test_hints_past_the_limit_drop_the_oldest() -> None:
    read = CountingRead()
    reads = ReadAhead(read, threads=1, limit=2)
    try:
        reads.hint(["a", "b", "c"])  # a task that failed part way leaves hints behind
        assert reads.waiting == 2
        assert [reads.take(k) for k in "abc"] == ["A", "B", "C"]
        assert reads.waiting == 0
    finally:
        reads.close()


def test_close_stops_the_threads_and_a_later_hint_starts_them_again() -> None:
    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("drapps-read-ahead")]

    reads = ReadAhead(str.upper, threads=3)
    reads.hint(["a"])
    assert reads.take("a") == "A"
    assert len(readers()) == 3 and all(t.daemon for t in readers())
    reads.close()
    assert wait_until(lambda: not readers(), timeout=10)
    reads.hint(["b"])
    assert reads.take("b") == "B"
    reads.close()
    assert wait_until(lambda: not readers(), timeout=10)


def test_a_pickled_read_ahead_carries_its_settings_not_its_threads_or_hints() -> None:
    reads = ReadAhead(str.upper, threads=2, limit=8)
    try:
        reads.hint(["a", "b"])
        copy: Any = pickle.loads(pickle.dumps(reads))
        assert (copy.threads, copy.limit, copy.waiting) == (2, 8, 0)
        assert copy.take("c") == "C"
    finally:
        reads.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [({"threads": 0}, "threads must be an int >= 1, got 0"), ({"limit": 0}, "limit must be")],
)
def test_bad_settings_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadAhead(str.upper, **options)


def take_in_the_child(reads: ReadAhead) -> None:
    reads.hint(["b"])
    ok = reads.take("b") == "B" and reads.take("a") == "A" and reads.waiting == 0
    raise SystemExit(0 if ok else 1)


def test_a_forked_process_reads_on_threads_of_its_own() -> None:
    # The parent's threads and hints do not cross a fork; the child starts its own.
    reads = ReadAhead(str.upper, threads=1)
    try:
        reads.hint(["a", "c"])
        child = multiprocessing.get_context("fork").Process(target=take_in_the_child, args=(reads,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert reads.take("c") == "C"
    finally:
        reads.close()
