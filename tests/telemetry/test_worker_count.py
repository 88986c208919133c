"""What the report says of the worker count: the count a run settled on, why it moved or
stayed, and that a count the user fixed is never said to be drapps' doing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from control.test_policies import Thrashing, World
from helpers import state
from telemetry.test_trace_and_report import IN_MEMORY, counts_run

from drapps.control import Action, HeuristicPolicy
from drapps.telemetry import TraceRow, bottleneck_report
from drapps.telemetry._worker_count import settled_workers


@pytest.mark.parametrize(
    ("counts", "settled"),
    [
        ([2] * 12, 2),
        ([2] * 20 + [3], 2),  # a try begun at the last tick
        ([2] * 10 + [3] * 5, 2),  # a try still being judged when the run ended
        ([2] * 10 + [3] * 6 + [2] * 2, 2),  # a try undone
        ([2] * 10 + [3] * 6 + [2] * 10 + [3] * 2, 2),  # tried again at the end
        ([2] * 8 + [1] * 6 + [2] * 8 + [3] * 6 + [2] * 10, 2),
        ([2] * 10 + [3] * 10, 3),
        ([2] * 10 + [3] * 10 + [4] * 2, 3),
        ([2] * 10 + [3] * 2 + [4] * 6 + [3] + [2] * 3, 2),  # a try of 2 workers, undone in steps
        ([2] * 5 + [3] * 4 + [4] * 3, 3),  # a short run: the last count held a few ticks
        ([2] * 5 + [3] * 4, 3),
    ],
)
def test_the_count_a_run_settled_on(counts: list[int], settled: int) -> None:
    assert settled_workers(counts_run(counts)) == settled


def test_a_fixed_count_is_the_users_and_never_said_to_be_moved_by_drapps() -> None:
    fed = counts_run([2] * 12, IN_MEMORY, wait_fraction=0.01, idle_cores=1.0, cpu_util=0.5)
    text = bottleneck_report(fed, workers=2)
    assert "Workers: 2 throughout, the count you gave (drapps keeps a fixed count" in text
    for claim in ("controller", "stayed at", "settled", "trying", "drapps chose"):
        assert claim not in text, claim
    # resize() by the user is named as such, not as a move of drapps'.
    resized = counts_run([2] * 6 + [3] * 6, IN_MEMORY, wait_fraction=0.01, idle_cores=1.0)
    # A fixed count's knob only reports the pool's count: the tick after resize() shows it.
    resized = [replace(r, action=Action(), applied={"workers": r.state.workers}) for r in resized]
    text = bottleneck_report(resized, workers=2)
    assert "2 -> 3: by resize(), or a worker that was not replaced" in text
    assert "controller" not in text and "settled" not in text


def test_a_fixed_count_that_starves_the_loop_beside_idle_cores_is_told_to_grow() -> None:
    starved = counts_run([2] * 12, IN_MEMORY, idle_cores=3.2, cpu_util=0.6, cores=8)
    text = bottleneck_report(starved, workers=2)
    assert (
        "Advice: the loop waited 30% of the time while 3.2 cores sat idle: more workers would "
        "make batches faster (num_workers=5, or leave num_workers out and drapps chooses)."
    ) in text
    # Saturated cores: not more workers.
    assert "num_workers=" not in bottleneck_report(counts_run([2] * 12, IN_MEMORY), workers=2)


def test_workers_zero_says_the_loop_made_its_batches_and_what_workers_would_do() -> None:
    inline = counts_run([0] * 12, wait_fraction=0.4, idle_cores=1.5, cpu_util=0.25, cores=2)
    inline = [replace(r, stages={}) for r in inline]
    text = bottleneck_report(inline, workers=0)
    assert "Workers: none (workers=0): the training process made every batch itself" in text
    assert (
        "Advice: the training loop spent 40% of its time making batches while 1.5 cores sat "
        "idle: worker processes would make them beside your step (num_workers=1"
    ) in text


def test_a_count_the_controller_kept_says_why() -> None:
    # Too short to judge: the heuristic measures settle + 1 + window ticks before a try.
    short = counts_run([2] * 4, IN_MEMORY, wait_fraction=0.06, idle_cores=0.5, cpu_util=0.75)
    text = bottleneck_report(short, workers="auto")
    assert (
        "Workers stayed at 2: the run was too short to judge another count (the controller "
        "measures about 3.5 s of flowing batches before its first try; they flowed for 2.0 s)."
    ) in text
    fed = counts_run([2] * 20, IN_MEMORY, wait_fraction=0.01, idle_cores=1.0, cpu_util=0.5)
    assert "Workers stayed at 2: the loop waited 1% of the time, so the workers kept up." in (
        bottleneck_report(fed, workers="auto")
    )
    near = counts_run([2] * 20, IN_MEMORY, wait_fraction=0.06, idle_cores=1.0, cpu_util=0.5)
    assert (
        "Workers stayed at 2: the loop waited 6% of the time, too little for another worker to pay."
    ) in bottleneck_report(near, workers="auto")
    busy = bottleneck_report(counts_run([2] * 20, IN_MEMORY, cpu_util=0.95), workers="auto")
    assert "Workers stayed at 2: the loop waited 30% of the time, but the cores were 95%" in busy
    held = counts_run([2] * 20, IN_MEMORY, wait_fraction=0.06)
    held[-3] = replace(held[-3], notes={"workers": "held to 2 by this loader's share"})
    assert "Workers stayed at 2: held to 2 by this loader's share." in bottleneck_report(held)
    for text in (bottleneck_report(r, workers="auto") for r in (short, fed, near)):
        assert "Workers stayed at 2." not in text


def test_a_run_close_to_the_limit_is_told_what_it_could_win() -> None:
    near = counts_run([2] * 20, IN_MEMORY, wait_fraction=0.06, idle_cores=1.0, cpu_util=0.5)
    assert (
        "Advice: the loop waited for data 6% of the time: that is the most a faster input "
        "pipeline could win back."
    ) in bottleneck_report(near, workers="auto")


def test_the_heuristic_says_which_measurement_undid_a_try() -> None:
    # 12 workers on a disk that thrashes past 8: fewer samples/s than 6 made, so back to 6;
    # then 9 (half the failed try) makes more than 6 did, and is kept.
    actions = Thrashing(per_worker=100, consumer=1500, cores=16, workers=6).run(
        HeuristicPolicy(), ticks=80
    )
    back = next(a.reason for a in actions if a.reason.startswith("back to"))
    assert back.startswith("back to 6 workers: 12 workers made fewer samples/s (")
    assert " samples/s against 600 with 6 workers)" in back and "waited" not in back
    kept = next(a.reason for a in actions if a.reason.startswith("kept"))
    assert kept.startswith("kept 9 workers: more samples/s (680 samples/s against 600 with 6")


def test_one_worker_is_one_worker() -> None:
    # A consumer one worker keeps up with: the pool sheds to 1, in words that say "1 worker".
    world = World(per_worker=100, consumer=80, cores=8, workers=2)
    reasons = [a.reason for a in world.run(HeuristicPolicy(), ticks=40) if a.reason]
    assert any("trying 1 worker" in r for r in reasons), reasons
    assert not any("1 workers" in r for r in reasons), reasons


def test_a_policy_that_says_why_it_holds_is_quoted() -> None:
    rows = counts_run([2] * 20, IN_MEMORY, wait_fraction=0.2, idle_cores=1.0, cpu_util=0.5)
    rows[-1] = replace(rows[-1], action=Action(reason="learned policy: holding (workers+0)"))
    text = bottleneck_report(rows, workers="auto")
    assert "Workers stayed at 2: learned policy: holding (workers+0)." in text
    # A kept try of another knob is no reason for the worker count.
    rows[-1] = replace(rows[-1], action=Action(reason="kept split at op 3: more samples/s"))
    assert "kept split" not in bottleneck_report(rows, workers="auto")


def test_a_fed_loop_needs_nothing_whatever_the_count() -> None:
    for count in (0, 1, 2):
        fed = counts_run([count] * 12, IN_MEMORY, wait_fraction=0.01, idle_cores=1.0)
        assert bottleneck_report(fed, workers=count).endswith("Advice: none needed."), count


def _row(t: float, workers: int) -> TraceRow:
    s = state(t=t, workers=workers)
    return TraceRow(t, s, Action(), {"workers": workers}, 0.0)


def test_a_single_tick_settles_on_its_count() -> None:
    assert settled_workers([_row(0.5, 3)]) == 3


def test_workers_restarting_between_epochs_are_not_a_change_of_count() -> None:
    # Workers not kept between epochs: at each epoch's start none run, then 1, then 2, while
    # the count asked of the pool stays 2.
    running = ([2] * 5 + [0, 1]) * 3 + [2] * 5
    rows = counts_run(running, IN_MEMORY, wait_fraction=0.01, idle_cores=1.0)
    rows = [
        replace(r, state=replace(r.state, target_workers=2), applied={"workers": r.state.workers})
        for r in rows
    ]
    assert "Workers: 2 throughout, the count you gave" in bottleneck_report(rows, workers=2)
    auto = bottleneck_report(rows, workers="auto")
    assert "Workers stayed at 2" in auto and "-> 0" not in auto and "-> 1" not in auto
    assert settled_workers(rows) == 2
    # A resize() between two ticks changes the count asked: that is a change, the user's.
    resized = [
        replace(r, state=replace(r.state, target_workers=3)) if i >= 12 else r
        for i, r in enumerate(rows)
    ]
    assert "  at 6.0 s 2 -> 3: by resize()" in bottleneck_report(resized, workers=2)
