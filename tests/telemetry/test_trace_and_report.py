from __future__ import annotations

import gc
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from control.test_policies import state
from helpers import BigStream, wait_until

import drapps
from drapps.control import Action
from drapps.control.knobs import STREAM_COUNT_HELD
from drapps.telemetry import TRACE_VERSION, TraceRow, TraceWriter, bottleneck_report, read_trace
from drapps.telemetry._sections import format_duration


def rows_of_a_run() -> list[TraceRow]:
    rows = []
    workers = 1
    for i in range(20):
        action = Action()
        if i in (4, 10):
            action = Action(workers=1, reason=f"training loop waited 40% (tick {i})")
        after = workers + action.workers
        s = state(
            t=0.5 * i,
            workers=workers,
            cores=2,
            wait_fraction=0.31,
            throughput=800.0,
            idle_cores=0.0 if i >= 12 else 1.0,
            cpu_util=1.0 if i >= 12 else 0.5,
        )
        stages = {"fetch_s": 15.0, "transform_s": 78.0, "collate_s": 5.0, "transport_s": 2.0}
        rows.append(
            TraceRow(s.t, s, action, {"workers": after, "prefetch": 2 * after}, 1.0, {}, stages)
        )
        workers = after
    return rows


def test_trace_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    writer = TraceWriter(path, {"batch_size": 32})
    for row in rows_of_a_run():
        writer.write(row)
    writer.close()
    trace = read_trace(path)
    assert trace.header["version"] == TRACE_VERSION and trace.header["config"]["batch_size"] == 32
    assert trace.rows == rows_of_a_run()


def test_bad_traces_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "header", "version": 99}) + "\n")
    with pytest.raises(ValueError, match="trace version 99, this drapps reads version 1"):
        read_trace(path)
    path.write_text(json.dumps({"type": "header", "version": 1}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_trace(path)
    path.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(ValueError, match="expected a drapps trace header"):
        read_trace(path)
    path.write_text(
        json.dumps({"type": "header", "version": 1}) + "\n" + json.dumps({"type": "tick"})
    )
    with pytest.raises(ValueError, match="malformed tick"):
        read_trace(path)


def test_report_says_where_the_time_went() -> None:
    text = bottleneck_report(rows_of_a_run(), {"samples_skipped": 2})
    assert (
        "the training loop waited 31% of the time for data: the input pipeline is the bottleneck"
        in text
    )
    assert (
        "Transform is 78% of the time a batch takes (fetch 15%, collate 5%, transport 2%)" in text
    )
    assert (
        "Workers went 1 -> 2 -> 3 because:" in text and "training loop waited 40% (tick 10)" in text
    )
    assert "cores were saturated from 6.0 s" in text
    assert "Faults: 2 samples skipped." in text
    assert "CPU-bound" in text


def test_report_gives_the_memory_held_with_shared_pages_once() -> None:
    gib = 2**30
    rows = rows_of_a_run()
    assert "Memory: peak 2.00 GiB held by our processes, as little" in bottleneck_report(rows)
    shared = [replace(r, state=replace(r.state, pss_bytes=gib // 2)) for r in rows]
    assert (
        "Memory: peak 0.50 GiB held by our processes (their resident sets add up to 2.00 GiB, "
        "counting the pages workers share with the training process in each)"
    ) in bottleneck_report(shared)


def test_report_without_rows_says_how_to_get_them() -> None:
    text = bottleneck_report([])
    assert text.startswith("No batch delivered yet: the report needs a few seconds of telemetry")
    assert "workers='auto'" not in text  # every loader records telemetry: nothing to switch on


def test_report_of_a_fed_loop() -> None:
    rows = [replace(r, state=replace(r.state, wait_fraction=0.0)) for r in rows_of_a_run()]
    assert "the training step sets the pace" in bottleneck_report(rows)


def test_report_tells_what_the_cache_held_and_served() -> None:
    rows = rows_of_a_run()
    rows = [
        replace(r, state=replace(r.state, codec="none" if i < 10 else "zstd"))
        for i, r in enumerate(rows)
    ]
    cache = {
        "hit_rate": 0.5,
        "entries": {"memory": 90, "disk": 10},
        "held_bytes": {"memory": 90 * 2**20, "disk": 10 * 2**20},
        "budget": 200 * 2**20,
        "codec": "zstd",
        "enabled": True,
        "counts": {"not_admitted": 7, "corrupt": 0, "lossy_batches": 0},
    }
    text = bottleneck_report(rows, {"cache": cache})
    assert (
        "Cache: 50% of lookups hit; 100 entries, 100 MiB of a 200 MiB budget, codec zstd "
        "(it moved through none -> zstd); 7 samples found no room." in text
    )
    assert "Cache:" not in bottleneck_report(rows, {"cache": None})


MAKING = {"fetch_s": 60.0, "transform_s": 30.0, "collate_s": 6.0, "transport_s": 4.0}
"""Stage totals of a pipeline whose samples cost much to make (decoding, augmenting)."""
IN_MEMORY = {"fetch_s": 0.2, "transform_s": 0.0, "collate_s": 1.4, "transport_s": 0.4}
"""Stage totals of in-memory tensors: making a sample is indexing a list."""


def counts_run(
    counts: list[int], stages: dict[str, float] | None = None, **overrides: object
) -> list[TraceRow]:
    """A run whose worker count is ``counts[i]`` during tick ``i`` (a policy's move at each
    change), on saturated cores by default: the loop waits 30%, this job's processes use
    both cores."""
    settings: dict[str, object] = {
        "cores": 2, "wait_fraction": 0.3, "idle_cores": 0.0, "cpu_util": 1.0,
        "main_cpu": 0.5, "workers_cpu": 1.5, **overrides,
    }  # fmt: skip
    rows = []
    for i, workers in enumerate(counts):
        after = counts[i + 1] if i + 1 < len(counts) else workers
        move = (after > workers) - (after < workers)
        action = Action(workers=move, reason=f"policy: {workers} -> {after}") if move else Action()
        s = state(t=0.5 * (i + 1), workers=workers, **settings)
        applied = {"workers": after, "prefetch": 2 * after}
        rows.append(TraceRow(s.t, s, action, applied, 1.0, {}, dict(stages or MAKING)))
    return rows


def saturated_run(grow_at: tuple[int, ...]) -> list[TraceRow]:
    """A loop that waits 30% on saturated cores from the first tick; the controller adds a
    worker (and keeps it) at each tick of ``grow_at``, over 24 ticks."""
    counts, workers = [], 2
    for i in range(24):
        counts.append(workers)
        workers += i in grow_at
    return counts_run(counts)


def test_more_workers_will_not_help_only_when_no_more_were_kept() -> None:
    assert "more workers will not help" in bottleneck_report(saturated_run(()))
    grown = bottleneck_report(saturated_run((4, 13)))
    assert "Workers went 2 -> 3 -> 4" in grown
    assert "will not help" not in grown and "it settled at 4, from 2" in grown
    assert "cache_fingerprint()" in grown  # the cache advice says what the dataset needs


def test_a_controller_back_where_it_started_is_not_said_to_have_found_more() -> None:
    # 2 -> 1 -> 2 -> 3 -> 2 on saturated cores: every try undone, and it ends where it began.
    text = bottleneck_report(counts_run([2] * 8 + [1] * 6 + [2] * 8 + [3] * 6 + [2] * 10))
    assert "Workers went 2 -> 1 -> 2 -> 3 -> 2 because:" in text
    assert "found more" not in text and "kept more" not in text and "settled at" not in text
    assert "CPU-bound on this machine, so more workers will not help" in text


def test_a_try_cut_short_by_the_end_of_the_run_is_not_the_count_it_settled_on() -> None:
    # Held 2 for the whole run, then tried 3 on the last tick.
    text = bottleneck_report(counts_run([2] * 20 + [3]))
    assert "Workers went 2 -> 3" in text
    assert "The run ended 0.5 s into a try of 3 workers; before that try it had settled on 2." in (
        text
    )
    assert "ended at 3" not in text and "kept more workers" not in text
    # A try the run held long enough to judge is the count it settled on.
    held = bottleneck_report(counts_run([2] * 10 + [3] * 12))
    assert "ended" not in held and "it settled at 3, from 2" in held


def test_cores_taken_by_other_processes_are_named_and_no_cache_is_offered_for_them() -> None:
    # In-memory tensors on a machine another job keeps busy: the loop waits, but this job
    # used 0.3 of the 2 cores. More workers, or a cache, cannot help that.
    busy = counts_run([2] * 12, IN_MEMORY, main_cpu=0.1, workers_cpu=0.2)
    text = bottleneck_report(busy, {"samples": 12_000})
    assert "the training process used 0.1 cores, the workers 0.2, other processes 1.7." in text
    assert "Advice: other processes kept the cores busy (1.7 of 2 on average, this job's 0.3)" in (
        text
    )
    assert "CPU-bound" not in text and "cache" not in text.lower()
    # Where this job used the cores itself, the pipeline is CPU-bound; the line on other
    # processes is left out where they used next to nothing.
    own = bottleneck_report(counts_run([2] * 12, MAKING), {"samples": 12_000})
    assert "CPU-bound" in own and "other processes" not in own


def test_a_cache_is_offered_only_where_making_samples_costs_enough_to_save() -> None:
    # 90 s of fetch and transform over 12,000 samples: 7.5 ms a sample, worth caching.
    decoded = bottleneck_report(counts_run([2] * 12, MAKING), {"samples": 12_000})
    assert "CPU-bound" in decoded and "cache_fingerprint()" in decoded
    # The same shares over 12 million samples: 7.5 µs a sample, no more than a cache read.
    cheap = bottleneck_report(counts_run([2] * 12, MAKING), {"samples": 12_000_000})
    assert "CPU-bound" in cheap and "cache" not in cheap.lower()
    # Collate and transport most of the time: no per-sample work to make cheaper.
    collated = bottleneck_report(counts_run([2] * 12, IN_MEMORY), {"samples": 12_000})
    assert "making samples is 10% of a batch's time and collating and moving them 90%" in (collated)
    assert "cache" not in collated.lower() and "per-sample work" not in collated


def test_every_worker_change_names_what_made_it() -> None:
    rows = saturated_run(())
    s = rows[3].state
    rows[3] = TraceRow(  # the policy asked for +1 from 4; the host's share allowed 3
        s.t,
        replace(s, workers=4),
        Action(workers=1, reason="learned policy: workers+1"),
        {"workers": 3, "prefetch": 6},
        1.0,
        notes={"workers": "held to 3 by this loader's share of the host's cores"},
    )
    s = rows[6].state  # 3 -> 5 by resize(), with no move asked
    rows[6] = TraceRow(s.t, replace(s, workers=5), Action(), {"workers": 5, "prefetch": 10}, 1.0)
    text = bottleneck_report(rows)
    assert "2 -> 3: learned policy: workers+1; held to 3 by this loader's share" in text
    assert "3 -> 2: changed outside the controller" in text  # the pool still had 2
    assert "2 -> 5: changed outside the controller" in text
    assert ": \n" not in text + "\n" and not any(line.endswith(": ") for line in text.split("\n"))


def test_ticks_after_the_loop_stopped_are_left_out() -> None:
    rows = rows_of_a_run()
    last = rows[-1]
    for k in range(1, 6):  # the loader left open after the loop: nothing taken, nothing waited
        idle = replace(
            last.state,
            t=last.t + 0.5 * k,
            throughput=0.0,
            wait_fraction=0.0,
            latency_p50_s=0.0,
            latency_p99_s=0.0,
        )
        rows.append(replace(last, t=idle.t, state=idle))
    text = bottleneck_report(rows)
    assert "Over 10.0 s" in text and "last 800" in text
    assert "last 0" not in text and "p50 0 ms" not in text


def test_decoding_in_getitem_is_named_as_fetch() -> None:
    rows = [
        replace(r, stages={"fetch_s": 99.0, "transform_s": 0.0, "collate_s": 1.0})
        for r in rows_of_a_run()
    ]
    text = bottleneck_report(rows)
    assert "Fetch is 99% of the time a batch takes" in text
    assert "decoding done in __getitem__" in text
    assert "decoding done in __getitem__" not in bottleneck_report(rows_of_a_run())


def short_epochs(idle: float) -> list[TraceRow]:
    return [
        replace(r, state=replace(r.state, idle_cores=idle, cpu_util=0.3)) for r in rows_of_a_run()
    ]


def test_short_epochs_without_persistent_workers_get_that_advice() -> None:
    advice = "pass persistent_workers=True"
    assert advice in bottleneck_report(short_epochs(1.5), {"epoch": 5}, persistent_workers=False)
    # 6 epochs over this 9.5 s run: new workers that each take 0.4 s to give a first batch
    # are a quarter of it; ones that take 20 ms, a twentieth of that, are not the cause.
    slow_start = {"epoch": 5, "first_batch_s": 0.4}
    assert advice in bottleneck_report(short_epochs(1.5), slow_start, persistent_workers=False)
    quick_start = {"epoch": 5, "first_batch_s": 0.02}
    assert advice not in bottleneck_report(short_epochs(1.5), quick_start, persistent_workers=False)
    assert advice not in bottleneck_report(short_epochs(1.5), {"epoch": 5}, persistent_workers=True)
    assert advice not in bottleneck_report(  # one epoch: nothing restarted
        short_epochs(1.5), {"epoch": 0}, persistent_workers=False
    )
    assert advice not in bottleneck_report(  # no idle cores: new workers are not the cause
        short_epochs(0.0), {"epoch": 5}, persistent_workers=False
    )


@pytest.mark.parametrize("how", ["mid-epoch", "ended", "left"])
def test_a_short_runs_report_says_an_iterable_datasets_workers_made_its_batches(how: str) -> None:
    # It said they were made in the training process: a stream's pool named no executor.
    with drapps.Loader(BigStream(64, 4), batch_size=4, num_workers=2) as loader:
        iterator = iter(loader)
        next(iterator)
        if how == "ended":
            list(iterator)
        elif how == "left":
            del iterator  # a loop that broke out: the workers go
            gc.collect()
        made = "The batches were made by 2 worker processes (num_workers=2, as set)"
        assert made in loader.report()


def test_a_run_too_short_for_the_telemetry_says_what_the_loader_counted() -> None:
    stats = {
        "batches": 10, "samples": 320, "loading_s": 0.8, "wait_s": 0.4, "workers": 2,
        "executor": "processes", "first_batch_s": 0.05, "fetch_s": 1.5, "transform_s": 0.3,
        "collate_s": 0.2,
    }  # fmt: skip
    text = bottleneck_report(rows_of_a_run()[:2], stats, workers=2)
    assert text.splitlines() == [
        "A short run: 10 batches (320 samples) in 0.80 s of loading, 400 samples/s. The "
        "training loop waited 50% of the time for data: the input pipeline is the bottleneck.",
        "The batches were made by 2 worker processes (num_workers=2, as set); the first batch "
        "came 50 ms after iter().",
        "Of the time spent making samples: fetch 75%, transform 15%, collate 10%.",
        "Where the time went (CPU, memory, the workers, what to change) needs a few seconds "
        "of telemetry: iterate for longer (it is sampled every control_interval, 0.5 s by "
        "default), then ask again.",
    ]
    stopped = {**stats, "workers": 0, "target_workers": 2, "executor": "threads"}
    assert "The batches were made by 2 worker threads (num_workers=2, as set)" in (
        bottleneck_report([], stopped, workers=2)  # the epoch ended, and its workers with it
    )
    in_loop = {**stats, "workers": 0, "target_workers": 0, "executor": "the training process"}
    assert 'made in the training process (workers="auto" chose them)' in (
        bottleneck_report([], in_loop, workers="auto")
    )
    made_here = {**stats, "workers": 0, "executor": None, "wait_s": 0.0}
    made_here.update(fetch_s=0.0, transform_s=0.0, collate_s=0.0)  # not timed in the loop
    text = bottleneck_report([], made_here, workers=0)
    assert "The batches were made in the training process (num_workers=0, as set)" in text
    assert "the training step sets the pace" in text and "Of the time" not in text
    assert bottleneck_report([], {**stats, "batches": 0}).startswith("No batch delivered yet")
    assert "Throughput" not in text
    external = bottleneck_report(rows_of_a_run()[:2], external="tf.data")
    assert external.startswith("Only 2 tick(s) of telemetry so far: the report needs")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_that_ran_a_moment_reports_what_it_counted(workers: int) -> None:
    """A first try of a loader with the user's own count: a second of loading, a report."""
    with drapps.Loader(list(range(64)), batch_size=8, num_workers=workers) as loader:
        assert len(list(loader)) == 8
        if workers:  # asked once its workers are gone, as the epoch's end lets them go
            assert wait_until(lambda: loader.stats().workers == 0, timeout=60)
        text = loader.report()
    assert text.startswith("A short run: 8 batches (64 samples) in ")
    made = f"by {workers} worker processes" if workers else "in the training process"
    assert f"The batches were made {made} (num_workers={workers}, as set)" in text


def test_report_counts_stragglers_and_says_what_the_dispatcher_did() -> None:
    costs = {"observed": 1000, "slow_samples": 30, "slow_excess_s": 1.5, "median_ms": 2.0,
             "slow_batches": 25}  # fmt: skip
    cut = bottleneck_report(rows_of_a_run(), {"sample_costs": costs, "batches": 100,
                                               "cut_batches": 80, "workers": 2})  # fmt: skip
    assert "Stragglers: 3.0% of samples took over 8x the median (2.0 ms), 52 ms" in cut
    assert "25 of 100 batches (25%) held one, each adding 50 ms" in cut
    assert "80 batches were cut into parts" in cut
    whole = bottleneck_report(rows_of_a_run(), {"sample_costs": costs, "batches": 100,
                                                 "workers": 2})  # fmt: skip
    assert "dispatch='samples' cuts them" in whole
    none = bottleneck_report(rows_of_a_run(), {"sample_costs": {**costs, "slow_samples": 0}})
    assert "Stragglers" not in none


def test_stragglers_that_cost_next_to_nothing_are_not_reported() -> None:
    # In-memory samples: 0.8% of them over 8x a 20 µs median, 0.3 ms of extra work in all.
    costs = {"observed": 6000, "slow_samples": 48, "slow_excess_s": 0.0003, "median_ms": 0.02,
             "slow_batches": 12}  # fmt: skip
    stats = {"sample_costs": costs, "batches": 192, "cut_batches": 20, "workers": 2}
    assert "Stragglers" not in bottleneck_report(rows_of_a_run(), stats)
    # 2 ms a slow sample but 0.1 s over a 10 s run: under 1% of it, still not worth a line.
    few = {**costs, "slow_excess_s": 0.096}
    assert "Stragglers" not in bottleneck_report(rows_of_a_run(), {**stats, "sample_costs": few})
    # 25 ms a slow sample, 1.2 s in all: reported, a sub-millisecond median in microseconds.
    many = {**costs, "slow_excess_s": 1.2}
    text = bottleneck_report(rows_of_a_run(), {**stats, "sample_costs": many})
    assert "over 8x the median (20 µs), 25 ms on average" in text and "adding 25 ms" in text


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0.00002, "20 µs"), (0.00049, "490 µs"), (0.0012, "1.2 ms"), (0.052, "52 ms"),
     (1.25, "1.2 s")],
)  # fmt: skip
def test_durations_keep_their_significant_digits(seconds: float, words: str) -> None:
    assert format_duration(seconds) == words


def test_batch_latency_is_left_out_where_none_was_measured() -> None:
    rows = [
        replace(r, state=replace(r.state, latency_p50_s=0.0, latency_p99_s=0.0))
        for r in rows_of_a_run()
    ]  # batches made in the training process (workers=0) have no dispatch-to-arrival time
    text = bottleneck_report(rows)
    assert "latency" not in text and "Throughput: median 800 samples/s, last 800." in text
    assert "batch latency p50 50 ms, p99 80 ms." in bottleneck_report(rows_of_a_run())
    # workers="auto" made the second half in the training process: the figures are the
    # first half's, and say so
    half = [
        replace(r, state=replace(r.state, latency_p50_s=0.0, latency_p99_s=0.0)) if i >= 10 else r
        for i, r in enumerate(rows_of_a_run())
    ]
    assert "batch latency of the batches workers made p50 50 ms" in bottleneck_report(half)


def test_report_gives_joules_per_sample_and_epoch_and_says_how_they_were_counted() -> None:
    source = "CPU-time estimate (6 W per busy core)"
    rows = [
        replace(r, state=replace(r.state, power_w=12.0, energy_source=source))
        for r in rows_of_a_run()
    ]  # 20 ticks of 0.5 s at 12 W and 800 samples/s: 120 J for 8,000 samples
    text = bottleneck_report(rows, epoch_samples=1000)
    assert (
        "Energy: 120 J over 10.0 s (12.0 W on average), 15.00 mJ per sample, about 15 J per "
        f"epoch of 1000; counted by {source} (no RAPL or NVML counter was readable: an "
        "estimate, not a meter reading)." in text
    )
    metered = [replace(r, state=replace(r.state, energy_source="RAPL package")) for r in rows]
    assert "counted by RAPL package." in bottleneck_report(metered)
    assert "Energy:" not in bottleneck_report(rows_of_a_run())  # older traces: no power figure


def test_workers_idle_behind_a_full_queue_get_a_count_that_would_keep_up() -> None:
    # A fed loop: 6 workers with 0.6 batches in flight between them (a slow training step,
    # or batches from a cache) would be kept up with by one; at 4 in flight, not fewer.
    def fed(in_flight: float | None) -> list[TraceRow]:
        return [
            replace(r, state=replace(r.state, wait_fraction=0.0, workers=6, in_flight=in_flight))
            for r in rows_of_a_run()
        ]

    idle = bottleneck_report(fed(0.6))
    assert "over the last 4 s the loop waited 0%, and the 6 workers had 0.6 batches" in idle
    assert "in flight on average (10% of them busy)" in idle
    assert "about 1 would keep up" in idle and "or workers=1 if the load stays" in idle
    for busy in (fed(4.0), fed(None)):  # busy enough, or not measured (an older trace)
        text = bottleneck_report(busy)
        assert "would keep up" not in text and "Advice: none needed." in text
    # A first epoch that starved the loop (slow reads, then a cache) leaves the whole run's
    # wait high; the advice reads the second half, where the workers sat idle.
    rows = fed(0.6)
    for k in range(8):
        rows[k] = replace(rows[k], state=replace(rows[k].state, wait_fraction=0.9))
    text = bottleneck_report(rows)
    assert "the input pipeline is the bottleneck" in text and "about 1 would keep up" in text


def test_batches_moved_into_the_training_process_are_named_in_the_worker_story() -> None:
    # workers="auto" made the batches in the training process for a while (no policy move):
    # the count went to none and back, and the story says why, not "outside the controller".
    from drapps.telemetry._worker_count import worker_story

    rows = []
    for i, target in enumerate([2] * 6 + [0] * 6 + [2] * 6):
        s = state(t=0.5 * (i + 1), workers=target, target_workers=target)
        rows.append(TraceRow(s.t, s, Action(), {"workers": target, "prefetch": 4}, 1.0))
    lines = worker_story(rows, "auto")
    assert "2 -> 0: batches made in the training process (see Executor)" in lines[1]
    assert "0 -> 2: the workers came back (see Executor)" in lines[2]
    assert worker_story(rows[6:12], "auto")[0].startswith("Workers: none (see Executor)")
    assert worker_story(rows[6:12], 0)[0].startswith("Workers: none (workers=0)")


def held_stream(workers_cpu: float, idle: float) -> list[TraceRow]:
    """A stream's run under ``workers="auto"``: 2 workers held (their count is fixed from
    iter()), the loop waiting 80%."""
    rows = []
    for i in range(20):
        s = state(
            t=0.5 * (i + 1), workers=2, cores=2, wait_fraction=0.8, throughput=440.0,
            idle_cores=idle, cpu_util=1.0 - idle / 2, main_cpu=0.1, workers_cpu=workers_cpu,
        )  # fmt: skip
        notes = {"workers": STREAM_COUNT_HELD}
        per_worker = {str(pid): {"cpu": workers_cpu / 2} for pid in (101, 102)}
        applied = {"workers": 2, "prefetch": 4}
        rows.append(TraceRow(s.t, s, Action(), applied, 1.0, per_worker, notes=notes))
    return rows


def test_a_stream_that_auto_cannot_resize_gets_the_count_to_pass() -> None:
    # The controller cannot move a stream's count (each worker streams its shard from
    # iter()): the report said it "found no change to try", and advised nothing that helps.
    waiting = bottleneck_report(held_stream(workers_cpu=0.1, idle=1.7), workers="auto")
    assert f"Workers stayed at 2: {STREAM_COUNT_HELD}." in waiting
    # The workers mostly wait: as many as the loop's wait leaves it short (2 / 0.2).
    assert "they wait (on reads, on storage) more than they compute" in waiting
    assert 'so workers="auto" keeps 2: pass num_workers=10.' in waiting
    computing = bottleneck_report(held_stream(workers_cpu=1.2, idle=0.8), workers="auto")
    assert "pass num_workers" not in computing  # they compute, and no core is idle
    idle_cores = bottleneck_report(held_stream(workers_cpu=1.2, idle=1.5), workers="auto")
    assert "while 1.5 cores sat idle" in idle_cores and "pass num_workers=3." in idle_cores
    fixed = bottleneck_report(held_stream(workers_cpu=0.1, idle=1.7), workers=2)
    assert 'workers="auto" keeps' not in fixed and "num_workers=10." in fixed  # as given


def test_a_fixed_count_whose_workers_wait_gets_a_count_that_feeds_the_loop() -> None:
    # Workers that wait on their reads need no core each: one more per idle core (the advice
    # was 3 here) leaves the loop starving.
    rows = [
        replace(r, workers={str(pid): {"cpu": 0.05} for pid in (101, 102)}, notes={})
        for r in held_stream(workers_cpu=0.1, idle=1.7)
    ]
    text = bottleneck_report(rows, workers=2)
    assert "the 2 workers used 0.1 cores between them: they wait" in text
    assert "num_workers=10, or leave num_workers out and drapps chooses" in text
    computing = [replace(r, state=replace(r.state, workers_cpu=1.0)) for r in rows]
    assert "more workers would make batches faster (num_workers=3" in bottleneck_report(
        computing, workers=2
    )
    threads = [replace(r, workers={}) for r in rows]  # threads' CPU is the training process's
    assert "they wait" not in bottleneck_report(threads, workers=2)


class WaitingStream(torch.utils.data.IterableDataset[torch.Tensor]):
    """``n`` samples sharded over the workers, each waiting 4 ms as a read would."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        share = range(self.n) if info is None else range(info.id, self.n, info.num_workers)
        for i in share:
            time.sleep(0.004)
            yield torch.full((8,), i)


def test_a_waiting_streams_report_under_auto_says_why_the_count_stayed_and_what_to_pass() -> None:
    with drapps.Loader(WaitingStream(1200), batch_size=16, control_interval=0.1) as loader:
        for _ in loader:
            pass
        text = loader.report()
    assert f"stayed at {loader.stats().target_workers}: {STREAM_COUNT_HELD}" in text, text
    assert "they wait (on reads, on storage)" in text and "pass num_workers=" in text, text
