"""Readiness asked of poll(2): what multiprocessing's wait and Connection.poll answer."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import Pipe, wait

import pytest

from drapps.runtime.ready import readable, ready


def test_ready_answers_as_multiprocessings_wait() -> None:
    quiet_r, quiet_w = Pipe(duplex=False)
    sent_r, sent_w = Pipe(duplex=False)
    closed_r, closed_w = Pipe(duplex=False)
    sent_w.send("x")
    closed_w.close()  # the other end gone: reading would not block (it raises EOFError)
    fd_r, fd_w = os.pipe()
    os.write(fd_w, b"x")
    items = [quiet_r, sent_r, closed_r, fd_r]
    try:
        assert set(ready(items, 0)) == set(wait(items, 0)) == {sent_r, closed_r, fd_r}
        connections = [quiet_r, sent_r, closed_r]
        assert [readable(c) for c in connections] == [c.poll() for c in connections]
        assert [readable(c) for c in connections] == [False, True, True] and readable(fd_r)
    finally:
        for end in (quiet_r, quiet_w, sent_r, sent_w, closed_r):
            end.close()
        os.close(fd_r), os.close(fd_w)


def test_ready_waits_out_its_timeout_or_until_one_is_ready() -> None:
    reader, writer = Pipe(duplex=False)
    try:
        start = time.monotonic()
        assert ready([reader], 0.05) == []
        assert time.monotonic() - start >= 0.05
        writer.send(1)
        assert ready([reader, reader.fileno()], None) == [reader, reader.fileno()]
    finally:
        reader.close(), writer.close()


def test_a_process_sentinel_is_ready_once_it_exits() -> None:
    process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0.1,))
    process.start()
    try:
        assert ready([process.sentinel], 0) == []
        assert ready([process.sentinel], 30) == [process.sentinel]
    finally:
        process.join()


def test_a_closed_connection_is_an_error_as_with_multiprocessing() -> None:
    reader, writer = Pipe(duplex=False)
    reader.close(), writer.close()
    with pytest.raises(OSError):
        reader.poll()
    with pytest.raises(OSError):
        readable(reader)
    with pytest.raises(OSError):
        ready([reader], 0)
