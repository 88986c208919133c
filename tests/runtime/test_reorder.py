import threading
import time
import traceback
from typing import Any

import pytest

from drapps.runtime.reorder import Entry, ReorderBuffer


def test_delivers_in_id_order_whatever_the_arrival_order() -> None:
    buffer = ReorderBuffer()
    buffer.reset(1, 0, 4)
    for batch_id in (2, 0, 3, 1):
        assert buffer.put(1, batch_id, Entry(batch=batch_id, nbytes=10))
    assert buffer.peak_bytes == 40
    assert [buffer.get().batch for _ in range(4)] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert buffer.get() is None
    assert buffer.bytes == 0


def test_refuses_duplicates_stale_generations_and_delivered_ids() -> None:
    buffer = ReorderBuffer()
    buffer.reset(2, 0, 3)
    assert buffer.put(2, 0, Entry(batch="a"))
    assert not buffer.put(2, 0, Entry(batch="dup"))
    assert not buffer.put(1, 1, Entry(batch="stale"))
    assert buffer.get().batch == "a"  # type: ignore[union-attr]
    assert not buffer.put(2, 0, Entry(batch="late"))


def test_get_waits_for_the_next_id_and_fail_wakes_it() -> None:
    buffer = ReorderBuffer()
    buffer.reset(1, 0, 2)
    got: list[object] = []

    def consume() -> None:
        try:
            got.append(buffer.get())
        except RuntimeError as exc:
            got.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    buffer.put(1, 1, Entry(batch="second"))
    time.sleep(0.05)
    assert not got  # batch 1 alone does not release the wait for batch 0
    buffer.fail(RuntimeError("closed"))
    thread.join(timeout=5)
    assert isinstance(got[0], RuntimeError)
    with pytest.raises(RuntimeError, match="closed"):
        buffer.get()


class _NeedsTwo(Exception):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} ({code})")


@pytest.mark.parametrize("make", [lambda: RuntimeError("closed"), lambda: _NeedsTwo("odd", 3)])
def test_a_failed_buffer_raises_its_failure_with_each_calls_own_traceback(make: Any) -> None:
    # The same words, class and cause each time, in an error whose traceback is that call's:
    # one error raised again would gather every call's frames, and through them the buffer.
    failure = make()
    failure.__cause__ = ZeroDivisionError("why")
    buffer = ReorderBuffer()
    buffer.reset(1, 0, 2)
    buffer.fail(failure)
    depths = []
    for _ in range(3):
        with pytest.raises(type(failure)) as info:
            buffer.get()
        depths.append(len(traceback.extract_tb(info.value.__traceback__)))
        assert str(info.value) == str(failure)
        assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert depths[0] == depths[1] == depths[2], depths
