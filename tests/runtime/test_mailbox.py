"""The dispatcher's mailbox alone: a setting before the thread holds at once, a command after
it is applied in the thread in order (a caller can wait for it), a closed mailbox refuses."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from drapps.runtime.mailbox import Mailbox


class _Thread:
    """A dispatcher's loop in miniature: apply what was sent until stopped."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, Any, str]] = []
        self.mailbox = Mailbox("test-mailbox", self.run, self.apply)

    def apply(self, name: str, value: Any) -> None:
        self.applied.append((name, value, threading.current_thread().name))

    def run(self) -> None:
        import select

        while not self.mailbox.stopped:
            self.mailbox.apply_all()
            if select.select([self.mailbox.wake_fd], [], [], 1.0)[0]:
                self.mailbox.woken()
        self.mailbox.close()
        self.mailbox.finished()


def test_settings_hold_at_once_then_commands_run_in_the_thread_in_order() -> None:
    box = _Thread()
    box.mailbox.post("resize", 3, wait_applied=True)
    assert box.applied == [("resize", 3, threading.current_thread().name)]
    assert box.mailbox.thread is None
    box.mailbox.post("epoch", 1, wait_applied=False)
    box.mailbox.post("resize", 2, wait_applied=False)
    box.mailbox.post("prefetch", 4, wait_applied=True)  # returns once applied
    assert [(n, v) for n, v, _ in box.applied] == [
        ("resize", 3), ("epoch", 1), ("resize", 2), ("prefetch", 4)
    ]  # fmt: skip
    assert {t for _, _, t in box.applied[1:]} == {"test-mailbox"}
    assert box.mailbox.stop() and not box.mailbox.stop()
    box.mailbox.wake()
    box.mailbox.thread.join(timeout=10)
    assert not box.mailbox.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        box.mailbox.post("resize", 1, wait_applied=True)
    box.mailbox.wake()  # closed: a no-op, never a write to a reused descriptor
    assert not box.mailbox.close()


def test_a_command_from_a_finalizer_under_the_mailboxs_own_lock_is_applied_not_dropped() -> None:
    # A finalizer may run inside a collection that post() began with the lock held in the
    # same thread: it must not wait for the lock, and its command still reaches the thread.
    box = _Thread()
    box.mailbox.post("epoch", 1, wait_applied=True)
    with box.mailbox._lock:
        box.mailbox.post_from_finalizer("let_go", 1)
    box.mailbox.post("prefetch", 2, wait_applied=True)  # applied in the same pass, or before
    applied = [(n, v) for n, v, _ in box.applied]
    assert applied[0] == ("epoch", 1) and sorted(applied[1:]) == [("let_go", 1), ("prefetch", 2)]
    assert box.mailbox.stop()
    box.mailbox.post_from_finalizer("let_go", 2)  # stopped: nothing is sent
    box.mailbox.wake()
    box.mailbox.thread.join(timeout=10)
    assert ("let_go", 2) not in [(n, v) for n, v, _ in box.applied]
