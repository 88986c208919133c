"""The cache's memory tier: entries in one nameless shared region."""

from __future__ import annotations

import os

import pytest
from helpers import shm_names, slab_fds

from drapps.cache.arena import ArenaTier


@pytest.fixture()
def tier() -> ArenaTier:
    arena = ArenaTier(64 * 1024, entries=64).open()
    yield arena
    arena.close()


def test_entries_round_trip_and_have_no_name(tier: ArenaTier) -> None:
    assert tier.write("a", b"x" * 100) and tier.write("b", b"y" * 50)
    assert tier.read("a") == b"x" * 100 and tier.read("b") == b"y" * 50
    assert tier.read("c") is None
    assert tier.held() == (150, 2)
    assert not shm_names() and set(slab_fds()) == {"/memfd:drapps-cache-memory (deleted)"}
    tier.close()
    assert slab_fds() == []


def test_replaced_and_dropped_space_is_reused(tier: ArenaTier) -> None:
    for round_ in range(20):  # far more than the budget, in replacements
        for key in "abc":
            assert tier.write(key, bytes([round_]) * 6000), (round_, key)
    assert tier.held() == (18000, 3)
    assert tier.read("b") == bytes([19]) * 6000
    tier.drop("b")
    assert tier.read("b") is None and tier.held() == (12000, 2)
    assert tier.free() >= 64 * 1024 - 12000 - 2 * 64


def test_a_full_arena_refuses_and_clear_empties_it(tier: ArenaTier) -> None:
    written = sum(tier.write(str(i), b"z" * 1000) for i in range(100))
    assert 50 <= written < 100  # the budget, not the index, stops it
    tier.clear()
    assert tier.held() == (0, 0) and tier.read("1") is None
    assert tier.write("again", b"w" * 1000) and tier.read("again") == b"w" * 1000


def test_a_forked_process_shares_the_entries(tier: ArenaTier) -> None:
    tier.write("parent", b"p" * 10)
    pid = os.fork()
    if pid == 0:
        ok = tier.read("parent") == b"p" * 10 and tier.write("child", b"c" * 20)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tier.read("child") == b"c" * 20 and tier.held() == (30, 2)


def test_writers_racing_for_the_last_room_never_pass_the_budget() -> None:
    arena = ArenaTier(1500, entries=64).open()
    try:
        digest_a, digest_b = b"a" * 16, b"b" * 16  # stand-ins: only their lengths matter here
        size = 16 + 1000
        # Two workers each check for room before either publishes: the first one's bytes
        # count from its allocation, so the second finds no room.
        first = arena._allocate(size, digest_a)
        second = arena._allocate(size, digest_b)
        assert first is not None and second is None
        assert arena.held() == (1000, 1)  # reserved, not yet readable
        assert arena.write("c", b"z" * 400)  # what is left of the budget still serves
        assert arena.held()[0] <= 1500
    finally:
        arena.close()


def test_a_write_that_fails_midway_gives_its_room_back() -> None:
    arena = ArenaTier(1500, entries=64).open()
    try:

        class Unreadable(bytes):
            def __len__(self) -> int:
                return 1000

        with pytest.raises(ValueError, match="memoryview assignment"):
            arena.write("a", Unreadable())  # its length lies: the copy into the arena fails
        assert arena.held() == (0, 0)
        assert arena.write("b", b"y" * 1400)
    finally:
        arena.close()
