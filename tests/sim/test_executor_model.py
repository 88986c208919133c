"""The executor in the simulator: worker threads share the GIL for the part of a batch's work
that holds it and hand batches over without a copy; worker processes pay to send them and
hold their own memory. The controller moves it live, a held-out family changes which one wins
mid-run, and a learned policy may move it."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.sim import Simulator, simulate
from drapps.sim.cache import CacheModel, CodecModel
from drapps.sim.families import draw, family_names
from drapps.sim.scenario import Change, PipelineModel, Scenario

MiB = 2**20


def pipeline(executor: str | None = "process", gil_share: float = 0.05) -> PipelineModel:
    """Workers short of two cores (the loop could take a batch every 10 ms); receiving a batch
    from a process costs the training process 6 ms of CPU (an image batch through shared
    memory), from a thread 0.2 ms."""
    return PipelineModel(
        cores=2,
        cpu_s=0.05,
        step_s=0.01,
        transport_s=0.006,
        executor=executor,
        gil_share=gil_share,
        worker_rss=300 * MiB,
    )


def run(p: PipelineModel, seconds: float = 20.0, changes: tuple[Change, ...] = ()) -> Simulator:
    sim = Simulator(Scenario(p, changes), workers=2, seed=0)
    sim.run_until(seconds)
    return sim


def test_threads_win_where_little_holds_the_gil_and_lose_where_much_does() -> None:
    rate = {
        (executor, gil): run(pipeline(executor, gil)).totals.samples / 20.0
        for executor in ("process", "thread")
        for gil in (0.05, 0.8)
    }
    # Processes do not share a GIL: their rate does not move with it.
    assert rate["process", 0.05] == rate["process", 0.8]
    # Threads save the training process's receive: ahead while little holds the GIL ...
    assert rate["thread", 0.05] > 1.1 * rate["process", 0.05]
    # ... and behind once most of the work does (two threads take turns: about one core).
    assert rate["thread", 0.8] < 0.8 * rate["process", 0.8]


def test_threads_hold_less_memory_and_the_state_says_which_executor_runs() -> None:
    states = {e: run(pipeline(e)).observe() for e in ("process", "thread")}
    assert states["process"].extra == {"executor": 0}
    assert states["thread"].extra == {"executor": 1}
    # two workers: 300 MiB each as processes, 16 MiB each as threads
    saved = states["process"].rss_bytes - states["thread"].rss_bytes
    assert saved == pytest.approx(2 * (300 - 16) * MiB, abs=16 * MiB)  # (ready batches vary)
    # Threads hand batches over: the training process spends next to nothing receiving.
    assert states["thread"].main_cpu < 0.25 * states["process"].main_cpu
    # A pipeline without an executor choice reports none (and has no knob for it).
    assert run(pipeline(None), 2.0).observe().extra == {}


def test_switching_executors_mid_run_loses_and_repeats_nothing() -> None:
    sim = Simulator(Scenario(pipeline("process")), workers=3, seed=1)
    for t, executor in enumerate(["thread", "process", "thread", "thread", "process"], start=1):
        sim.run_until(2.0 * t + 0.013)  # mid-batch: workers are busy when the switch comes
        sim.set_executor(executor)
        assert sim.executor == executor and sim.workers == 3
    sim.run_until(20.0)
    totals = sim.totals
    assert totals.dispatched == totals.arrived + sim.in_flight
    assert totals.arrived == totals.consumed + sim.ready + sim.in_step
    # Only the current kind is left once the old workers have finished their tasks.
    assert {w.kind for w in sim._workers} == {"process"}
    assert len(sim._workers) == 3


def test_bad_executor_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"PipelineModel\.executor must be"):
        pipeline("fibers")
    with pytest.raises(ValueError, match=r"PipelineModel\.gil_share must be in \[0, 1\]"):
        pipeline(gil_share=1.5)
    with pytest.raises(ValueError, match=r"Change\.gil_share must be in \[0, 1\]"):
        Change(at=1.0, gil_share=-0.1)
    with pytest.raises(ValueError, match="executor must be 'process' or 'thread'"):
        Simulator(Scenario(pipeline()), workers=2).set_executor("fibers")
    with pytest.raises(RuntimeError, match="no executor to move"):
        Simulator(Scenario(pipeline(None)), workers=2).set_executor("thread")
    with pytest.raises(RuntimeError, match="no executor to move"):
        Simulator(Scenario(pipeline()), workers=0).set_executor("thread")


def test_the_heuristic_keeps_threads_where_they_win() -> None:
    scenario = Scenario(pipeline("process"))
    live = simulate(scenario, "heuristic", duration=40.0, seed=0)
    held = simulate(scenario, "heuristic", duration=40.0, seed=0, move_executor=False)
    executors = [tick.applied["executor"] for tick in live.ticks]
    assert executors[0] == 0 and executors[-1] == 1
    assert all(tick.applied["executor"] == 0 for tick in held.ticks)
    assert live.throughput > 1.05 * held.throughput
    assert any("kept threads" in tick.action.reason for tick in live.ticks)


def test_the_heuristic_goes_back_to_processes_once_a_gil_heavy_transform_turns_on() -> None:
    heavy = (Change(at=15.0, gil_share=0.8, cpu_factor=1.5),)
    scenario = Scenario(pipeline("thread"), heavy)
    live = simulate(scenario, "heuristic", duration=45.0, seed=0)
    held = simulate(scenario, "heuristic", duration=45.0, seed=0, move_executor=False)
    before = [t.applied["executor"] for t in live.ticks if t.state.t < 15.0]
    assert before.count(1) > 0.7 * len(before)  # threads while they win (one try of processes)
    assert live.ticks[-1].applied["executor"] == 0
    assert live.throughput > 1.1 * held.throughput


def test_gil_switch_is_a_held_out_family_whose_best_executor_changes() -> None:
    assert "gil-switch" in family_names(held_out=True)
    for seed in range(6):
        scenario = draw("gil-switch", np.random.default_rng(seed), 60.0)
        p = scenario.pipeline
        assert p.executor in ("process", "thread") and p.cores in (2, 4, 8)
        assert p.gil_share * p.cores <= 0.5
        (change,) = scenario.changes
        assert change.gil_share is not None and change.gil_share >= 0.6
        assert change.cpu_factor is not None and change.cpu_factor > 1


def test_the_learned_policy_may_move_the_executor() -> None:
    from drapps.control import Action, State
    from drapps.control.rl import MlpPolicy
    from drapps.sim.env import PipelineEnv

    knobs = ("workers", "prefetch", "executor")
    assert State.features(knobs)[-1] == "executor_threads"
    env = PipelineEnv(["gil-switch"], duration=10.0, knobs=knobs)
    observation, _ = env.reset(seed=0, options={"scenario": Scenario(pipeline("process"))})
    assert observation.shape == (len(State.FEATURES) + 1,) and observation[-1] == 0.0
    up = Action.space(knobs).index(Action(other={"executor": 1}))
    down = Action.space(knobs).index(Action(other={"executor": -1}))
    moves = [env.step(a) for a in (up, up, down, down)]
    assert [info["executor"] for *_, info in moves] == [1, 1, 0, 0]  # held within 0..1
    assert [obs[-1] for obs, *_ in moves] == [1.0, 1.0, 0.0, 0.0]
    # A policy file over these knobs scores one output per action and reads the feature.
    rng = np.random.default_rng(0)
    width = len(State.features(knobs))
    policy = MlpPolicy(
        [(rng.normal(size=(width, 27)).astype(np.float32), np.zeros(27, np.float32))],
        knobs=knobs,
    )
    assert policy.features[-1] == "executor_threads"
    assert policy.choose(observation) in Action.space(knobs)


def reads(executor: str | None, **more: object) -> PipelineModel:
    """Samples that mostly wait on storage (a read of 3 ms and 0.3 ms of CPU each, batches of
    32), on two cores, for a loop that could take a batch every 30 ms."""
    fields: dict[str, object] = {"cpu_s": 0.01, "read_s": 0.096, "step_s": 0.03, **more}
    return PipelineModel(cores=2, executor=executor, **fields)  # type: ignore[arg-type]


def test_worker_processes_make_samples_that_wait_at_once_as_the_runtime_asks() -> None:
    at_once = {}
    rate = {}
    for executor in (None, "process"):
        sim = Simulator(Scenario(reads(executor)), workers=2, seed=0)
        sim.run_until(20.0)
        at_once[executor], rate[executor] = sim.sample_threads(), sim.totals.samples / 20.0
    # As ExecutorPool.sample_threads: one over the CPU's share of a sample's time (0.01 of
    # 0.106: 10 at once); a fixed count (no executor choice) makes them one at a time.
    assert at_once == {None: 1, "process": 10}
    # One at a time, two processes wait out their reads: about 2 x 32 / 0.106 s.
    assert rate[None] == pytest.approx(2 * 32 / 0.106, rel=0.1)
    # Ten at once, the same two keep up with the loop (32 / 30 ms), as more processes would.
    assert rate["process"] > 0.9 * 32 / 0.03
    many = Simulator(Scenario(reads(None)), workers=8, seed=0)
    many.run_until(20.0)
    assert rate["process"] > 0.95 * many.totals.samples / 20.0


def test_samples_are_made_one_at_a_time_where_the_runtime_makes_them_so() -> None:
    def at_once(p: PipelineModel, workers: int = 2) -> int:
        return Simulator(Scenario(p), workers=workers, seed=0).sample_threads()

    assert at_once(reads("thread")) == 1  # threads of the training process
    assert at_once(reads("process"), workers=0) == 1  # batches made in the loop
    assert at_once(reads("process", gil_share=0.25)) == 4  # the GIL bounds it
    assert at_once(reads("process", read_s=0.0)) == 1  # nothing waits
    assert at_once(reads("process", read_s=100.0)) == 32  # at most SAMPLE_THREADS
    codecs = (CodecModel("raw", stored_bytes=2**20, encode_s=0.0, decode_s=0.0),)
    cached = reads("process", cache=CacheModel(samples=4000, budget_bytes=2**30, codecs=codecs))
    assert at_once(cached) == 1  # the cache's handles are one per process


def test_a_slow_read_holds_only_itself_and_batches_go_whole() -> None:
    """5% of the reads wait 40x the rest (a cold object store), slow at random, for a loop
    that could take a batch every 15 ms; the loader cuts batches where it makes samples one
    at a time (``dispatch="auto"``)."""
    tail = {"slow_share": 0.05, "slow_factor": 40.0, "slow_known": 0.0, "dispatch": "auto"}
    tail["step_s"] = 0.015
    runs = {}
    for executor in (None, "process"):
        sim = Simulator(Scenario(reads(executor, **tail)), workers=2, seed=0)
        sim.run_until(20.0)
        runs[executor] = sim
    one_at_a_time, at_once = runs[None], runs["process"]
    assert at_once.sample_threads() > 1
    # As the runtime: while samples are made at once, a batch is one task, never cut ...
    assert all(len(parts) == 1 for parts in at_once._parts.values())
    assert any(len(parts) > 1 for parts in one_at_a_time._parts.values())
    assert at_once.totals.hedges == 0  # ... nor its late parts copied
    # ... and two processes nearly keep up with the loop: a slow read waits beside its
    # worker's next samples instead of holding the worker (held, they make 0.69 of it).
    assert at_once.totals.samples / 20.0 > 0.8 * 32 / 0.015
    assert at_once.totals.samples > 3 * one_at_a_time.totals.samples
