"""The host-wide core budget: fair shares, borrowing, and entries of exited processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from drapps.runtime.cores import CoreBudget


def test_one_loader_takes_every_core_and_a_newcomer_gets_its_share(tmp_path: Path) -> None:
    path = str(tmp_path / "cores.json")
    first, second = CoreBudget(8, path), CoreBudget(8, path)
    assert first.grant(8) == 8  # alone: the whole host
    assert second.grant(8) == 4  # fair share is 8 // 2, even though the first holds all 8
    assert first.allowance() == 4  # the first must come down to make room
    assert first.grant(8) == 4
    assert second.grant(8) == 4


def test_a_loader_borrows_what_the_others_do_not_use(tmp_path: Path) -> None:
    path = str(tmp_path / "cores.json")
    busy, idle, third = CoreBudget(8, path), CoreBudget(8, path), CoreBudget(8, path)
    idle.grant(1)
    third.grant(1)
    assert busy.grant(8) == 6  # 8 cores - 1 - 1
    assert busy.grant(3) == 3  # less is always granted
    assert idle.grant(4, floor=5) == 5  # never below the loader's own min_workers


def test_release_and_exited_processes_free_their_share(tmp_path: Path) -> None:
    path = str(tmp_path / "cores.json")
    mine = CoreBudget(4, path)
    other = CoreBudget(4, path)
    other.grant(4)
    other.release()
    other.release()  # idempotent
    assert mine.grant(4) == 4
    # An entry left by a process that has exited is dropped at the next update.
    code = (
        f"import sys; from drapps.runtime.cores import CoreBudget; CoreBudget(4, {path!r}).grant(4)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(json.loads(Path(path).read_text())) == 2
    assert mine.grant(4) == 4
    assert list(mine.claims()) == [mine.key]


def test_a_damaged_file_is_started_over(tmp_path: Path) -> None:
    path = tmp_path / "cores.json"
    path.write_text('{"123": 4, "oops')
    assert CoreBudget(2, str(path)).grant(2) == 2


@pytest.mark.parametrize("cores", [0, -1, 1.5, True])
def test_bad_core_counts_are_named(cores: object) -> None:
    with pytest.raises(ValueError, match="cores must be an int >= 1"):
        CoreBudget(cores)  # type: ignore[arg-type]


def test_a_child_forked_while_the_budget_is_open_does_not_hold_its_lock(tmp_path: Path) -> None:
    """Found by a local CI run (two torchrun ranks, each loader's controller granting while
    its workers started): a child forked while another thread had the budget file locked
    shared the locked descriptor, and every loader of the host waited on it for as long as the
    child lived. A fork now waits for the file to be closed."""
    budget = CoreBudget(2, str(tmp_path / "cores.json"))
    inside, done = threading.Event(), threading.Event()

    def hold() -> None:
        with budget._locked():
            inside.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    threading.Timer(0.5, done.set).start()  # the holder lets go while the fork waits
    pid = os.fork()
    if pid == 0:  # the child: lives on, holding whatever it inherited
        time.sleep(60)
        os._exit(0)
    try:
        holder.join(30)
        answered = threading.Event()
        asker = threading.Thread(target=lambda: (budget.claims(), answered.set()), daemon=True)
        asker.start()
        assert answered.wait(20), "the budget's lock stayed with the forked child"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
