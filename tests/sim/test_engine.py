"""The simulator's invariants: conservation, Little's law, cores, determinism, changes."""

from __future__ import annotations

import math

import pytest

from drapps.sim import Change, PipelineModel, Scenario, Simulator
from drapps.sim.engine import LOW_WEIGHT
from drapps.telemetry.energy import WATTS_PER_CORE


def _run(
    pipeline: PipelineModel, workers: int, seconds: float = 60.0, seed: int = 0, **kw
) -> Simulator:
    sim = Simulator(Scenario(pipeline, **kw), workers=workers, seed=seed)
    sim.run_until(seconds)
    return sim


@pytest.mark.parametrize("workers", [0, 1, 3, 8])
def test_conservation_samples_out_equal_samples_in(workers: int) -> None:
    p = PipelineModel(
        cores=4, cpu_s=0.02, read_s=0.01, read_bytes=2**20, disk_bps=200e6, step_s=0.01
    )
    sim = Simulator(Scenario(p), workers=workers, seed=1)
    for t in range(1, 41):
        sim.run_until(t * 0.5)
        if workers and t % 10 == 0:
            sim.resize(1 + t % 7)  # resizing mid-run loses nothing
        totals = sim.totals
        in_pipeline = sim.ready + sim.in_flight + sim.in_step
        assert totals.dispatched == totals.consumed + in_pipeline
        assert totals.samples == totals.consumed * p.batch_size
    assert sim.totals.consumed > 100


def test_littles_law_on_the_ready_buffer() -> None:
    # L = lambda * W: mean batches waiting = arrival rate * mean time each waits.
    sim = _run(PipelineModel(cores=8, cpu_s=0.05, step_s=0.01, cost_cv=0.5), workers=8, seconds=120)
    t = sim.now
    in_buffer_now = sim.totals.ready_integral - sim.totals.ready_residence  # still waiting
    length = sim.totals.ready_integral / t
    rate = sim.totals.arrived / t
    wait = (sim.totals.ready_residence + in_buffer_now) / sim.totals.arrived
    assert length == pytest.approx(rate * wait, rel=0.02)
    assert length > 0.5  # the law is tested on a buffer that holds something


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_more_cores_never_slower_for_a_cpu_bound_stage(seed: int) -> None:
    previous = 0
    for cores in (1, 2, 4, 8, 16, 32):
        p = PipelineModel(cores=cores, cpu_s=0.2, step_s=0.002, transport_s=0.0)
        samples = _run(p, workers=cores, seed=seed).totals.samples
        assert samples >= previous, f"{cores} cores made {samples}, fewer than {previous}"
        previous = samples
    # and it is CPU-bound: 32 cores make far more than 1
    assert previous > 20 * _run(PipelineModel(cores=1, cpu_s=0.2, step_s=0.002), 1).totals.samples


def test_same_seed_same_run_other_seed_other_run() -> None:
    p = PipelineModel(cores=4, cpu_s=0.03, step_s=0.01, cost_cv=0.6)
    a, b, c = (_run(p, 4, 20, seed=s) for s in (5, 5, 6))
    assert a.totals == b.totals
    assert a.totals != c.totals


def test_throughput_matches_the_bottleneck() -> None:
    # Consumer-bound: 10 ms steps, 32 samples -> 3200/s. PipelineModel-bound: 4 cores / 0.1 s.
    consumer = _run(
        PipelineModel(cores=4, cpu_s=0.01, step_s=0.01, step_cv=0, cost_cv=0, transport_s=0), 4
    )
    assert consumer.totals.samples / 60 == pytest.approx(3200, rel=0.02)
    workers = _run(
        PipelineModel(cores=4, cpu_s=0.1, step_s=0.001, step_cv=0, cost_cv=0, transport_s=0), 4
    )
    assert workers.totals.samples / 60 == pytest.approx(4 / 0.1 * 32, rel=0.03)
    # Inline (workers=0): each batch costs make + step.
    inline = _run(PipelineModel(cores=4, cpu_s=0.03, step_s=0.01, step_cv=0, cost_cv=0), 0)
    assert inline.totals.samples / 60 == pytest.approx(32 / 0.04, rel=0.02)


def test_outside_load_shares_the_cores() -> None:
    # 2 workers + 2 cores of outside load on 2 cores: each gets half a core.
    p = PipelineModel(cores=2, cpu_s=0.1, step_s=0.001, cost_cv=0, step_cv=0, transport_s=0)
    free = _run(p, 2).totals.samples
    hogged = _run(p.replace(outside_load=2.0), 2).totals.samples
    assert hogged / free == pytest.approx(0.5, rel=0.03)
    # More workers win a bigger share against the hog.
    assert _run(p.replace(outside_load=2.0), 4).totals.samples > 1.2 * hogged


def test_disk_bandwidth_is_shared_and_latency_is_not() -> None:
    bandwidth = PipelineModel(cores=16, cpu_s=0.001, read_bytes=10**6, disk_bps=100e6, step_s=0.001)
    two, eight = (_run(bandwidth, w, 20).totals.samples for w in (2, 8))
    assert eight == pytest.approx(two, rel=0.05)  # saturated: 100 batches/s either way
    latency = PipelineModel(cores=16, cpu_s=0.001, read_s=0.05, step_s=0.001)
    two, eight = (_run(latency, w, 20).totals.samples for w in (2, 8))
    assert eight > 3.5 * two


def test_changes_by_time_and_by_batch() -> None:
    p = PipelineModel(cores=2, cpu_s=0.001, step_s=0.01, step_cv=0, cost_cv=0, transport_s=0)
    sim = Simulator(Scenario(p, (Change(at=10.0, step_factor=2.0),)), workers=2)
    sim.run_until(10.0)
    before = sim.observe().throughput
    sim.run_until(20.0)
    assert sim.observe().throughput == pytest.approx(before / 2, rel=0.02)
    sim = Simulator(Scenario(p, (Change(at_batch=100, outside_load=1.0),)), workers=2)
    sim.run_until(0.9)
    assert sim.observe().cpu_util < 0.5
    sim.run_until(2.0)
    assert sim.observe().cpu_util > 0.5


def test_state_is_what_the_monitor_reports() -> None:
    p = PipelineModel(cores=4, cpu_s=0.2, step_s=0.01, gpu=True, gpu_s=0.005)
    sim = Simulator(Scenario(p), workers=2, seed=3)
    sim.run_until(5.0)
    sim.observe()
    sim.run_until(10.0)
    s = sim.observe()
    assert s.cores == 4 and s.workers == 2 and s.prefetch == 4 and s.max_workers == 8
    assert s.workers_cpu == pytest.approx(2.0, rel=0.05)  # two busy workers, no contention
    assert s.cpu_util == pytest.approx((s.workers_cpu + s.main_cpu) / 4, rel=0.05)
    assert s.wait_fraction > 0.5  # 2 workers make 10 batches/s; the loop could take 66/s
    assert 0 < s.gpu_util < 0.3
    assert s.throughput == pytest.approx(2 / 0.2 * 32, rel=0.1)
    # dispatch to arrival: 0.2 s of work after waiting behind one task (prefetch 2 per worker)
    assert s.latency_p50_s == pytest.approx(0.4, rel=0.3)
    assert s.rss_bytes == p.main_rss + 2 * p.worker_rss + s.queue_bytes
    # power as the real monitor estimates it without RAPL: busy cores at WATTS_PER_CORE
    assert s.power_w == pytest.approx((s.workers_cpu + s.main_cpu) * WATTS_PER_CORE)
    assert "estimate" in (s.energy_source or "")
    assert Simulator(Scenario(p.replace(gpu=False)), workers=1).observe().gpu_util is None


def test_throughput_counts_the_step_under_way_and_loses_no_sample() -> None:
    # A fed loop whose step (1.3 s) is longer than a tick (0.5 s): counted in whole batches a
    # tick would read 0 or a batch; counted by the share of the step done it reads the rate.
    p = PipelineModel(cores=4, cpu_s=0.01, step_s=1.3, step_cv=0, cost_cv=0, transport_s=0)
    sim = Simulator(Scenario(p), workers=2, seed=0)
    counted = 0.0
    rates = []
    for tick in range(1, 61):
        sim.run_until(tick * 0.5)
        rates.append(sim.observe().throughput)
        counted += rates[-1] * 0.5
    steady = rates[10:]
    assert min(steady) == pytest.approx(p.batch_size / 1.3, rel=0.05)
    assert max(steady) == pytest.approx(p.batch_size / 1.3, rel=0.05)
    # what was counted of the step under way is taken off when its batch is done
    assert 0 <= counted - sim.totals.samples < p.batch_size


def test_resize_grows_after_start_cost_and_shrinks_after_the_task() -> None:
    p = PipelineModel(cores=8, cpu_s=0.5, step_s=0.001, worker_start_s=1.0, cost_cv=0)
    sim = Simulator(Scenario(p), workers=1)
    sim.run_until(2.0)
    sim.resize(4)
    assert sim.workers == 4
    sim.run_until(3.4)  # the three new ones are still starting: one worker's 6 batches so far
    assert sim.totals.arrived <= 7
    sim.run_until(4.1)  # they have each made one
    assert sim.totals.arrived >= 10
    sim.run_until(10.0)
    grown = sim.observe()
    assert grown.workers_cpu > 3.0 and grown.workers_added == 3  # since the observation before
    sim.run_until(10.5)
    assert sim.observe().workers_added == 0
    sim.resize(1)
    sim.run_until(11.0)
    assert sim.observe().workers_added == 0  # shed, not added
    sim.run_until(15.0)
    assert sim.observe().workers_cpu == pytest.approx(1.0, rel=0.05)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="cores"):
        PipelineModel(cores=0)
    with pytest.raises(ValueError, match="cpu_s"):
        PipelineModel(cores=2, cpu_s=-1.0)
    with pytest.raises(ValueError, match="disk_bps"):
        PipelineModel(cores=2, disk_bps=0)
    with pytest.raises(ValueError, match="at= or at_batch="):
        Change(outside_load=1.0)
    with pytest.raises(ValueError, match="step_factor"):
        Change(at=1.0, step_factor=0.0)
    p = PipelineModel(cores=2)
    with pytest.raises(ValueError, match=r"workers must be in \[0, 8\]"):
        Simulator(Scenario(p), workers=9)  # the loader's "auto" bound: 2x cores, at least 8
    with pytest.raises(RuntimeError, match="no pool"):
        Simulator(Scenario(p), workers=0).resize(2)
    with pytest.raises(ValueError, match=r"read_factor must be > 0"):
        Scenario(p).what_if(read_factor=0)
    assert math.isinf(p.disk_bps)


def test_what_if_changes_the_hardware() -> None:
    base = Scenario(PipelineModel(cores=2, cpu_s=0.1, read_s=0.02, step_s=0.001, max_workers=3))
    bigger = base.what_if(cores=16, read_factor=2.0)
    assert bigger.pipeline.cores == 16 and bigger.pipeline.worker_limit == 32
    assert bigger.pipeline.read_s == pytest.approx(0.04)
    assert bigger.pipeline.cpu_s == base.pipeline.cpu_s


def test_moving_ops_into_the_device_stage_moves_their_cost() -> None:
    # Workers short of cores: 3 ops of 0.02 s each on top of 0.04 s; on a GPU each costs 2 ms.
    ops = ((0.02, 0.002),) * 3
    p = PipelineModel(cores=2, cpu_s=0.04, cost_cv=0.0, step_s=0.02, step_cv=0.0,
                      gpu=True, device_ops=ops, transport_s=0.0)  # fmt: skip
    rates = {}
    for split in (3, 0):
        sim = Simulator(Scenario(p.replace(split=split)), workers=2, seed=0)
        sim.run_until(20.0)
        state = sim.observe()
        rates[split] = sim.totals.samples / 20.0
        assert state.split == split
    # 2 workers at 0.1 s per batch -> 20 batches/s; at 0.04 s -> the step's (0.026 s) pace.
    assert rates[3] == pytest.approx(20 * 32, rel=0.05)
    assert rates[0] == pytest.approx(32 / 0.026, rel=0.05)
    assert state.device_stage_s == pytest.approx(0.006) and state.gpu_util > 0.9
    cpu = Simulator(Scenario(p.replace(gpu=False, split=0)), workers=1, seed=0)
    cpu.run_until(10.0)
    assert cpu.observe().main_cpu > 0.1  # without a GPU the stage is the loop's CPU work
    with pytest.raises(ValueError, match=r"PipelineModel.split must be None or an int in \[0, 3\]"):
        p.replace(split=4)
    with pytest.raises(ValueError, match="device_ops must hold"):
        p.replace(device_ops=((0.1,),))


def test_the_heuristic_moves_the_split_when_workers_cannot_keep_up() -> None:
    from drapps.sim import simulate

    ops = ((0.03, 0.002),) * 3
    p = PipelineModel(cores=2, cpu_s=0.03, step_s=0.03, gpu=True, device_ops=ops, max_workers=2)
    moved = simulate(Scenario(p), "heuristic", duration=60.0, seed=1)
    held = simulate(Scenario(p), "heuristic", duration=60.0, seed=1, move_split=False)
    assert moved.summary()["final_split"] < 3 and held.summary()["final_split"] == 3
    assert moved.throughput > 1.3 * held.throughput


def test_workers_past_the_machines_memory_page_and_slow_everything() -> None:
    """Past the memory the machine has, CPU work slows to (room / needed)**2: a worker that
    does not fit costs throughput, not only the reward's memory terms."""
    p = PipelineModel(
        cores=8, cpu_s=0.2, step_s=0.001, worker_rss=2 * 2**30, main_rss=2 * 2**30,
        total_memory=16 * 2**30, other_memory=2 * 2**30, batch_bytes=2**20,
    )  # fmt: skip
    # room for 12 GiB of workers: six fit; eight need 18 GiB of 14
    fits, crowded = _run(p, workers=6, seconds=30), _run(p, workers=8, seconds=30)
    assert crowded.totals.samples < 0.8 * fits.totals.samples
    roomy = p.replace(total_memory=64 * 2**30)  # the same eight workers with room
    assert _run(roomy, workers=8, seconds=30).totals.samples > fits.totals.samples


def test_low_priority_workers_yield_the_cpu_to_the_training_process() -> None:
    # 2 cores, workers that could use both, and a step of 20 ms on the CPU then 10 ms off it
    # (an accelerator): at normal priority the step's CPU part shares the cores with every
    # worker; at low priority it runs at a whole core and the accelerator's part overlaps the
    # workers' (the fair scheduler's weights, nice +10 against 0).
    p = PipelineModel(cores=2, cpu_s=0.05, step_s=0.01, step_cpu_s=0.02, cost_cv=0, step_cv=0)
    states = {}
    for priority in ("normal", "low"):
        sim = Simulator(Scenario(p), workers=4, seed=0)
        sim.set_priority(priority)
        sim.run_until(5.0)
        sim.observe()
        sim.run_until(25.0)
        states[priority] = sim.observe()
        assert states[priority].priority == priority
    assert states["low"].throughput > 1.08 * states["normal"].throughput
    assert states["low"].main_cpu > states["normal"].main_cpu
    # what the step did not get at normal priority, it waited for: asked, not given
    assert states["normal"].main_wait > 0.1 > states["low"].main_wait
    # Against another process the workers keep only their weight's share of what it wants.
    hog = Simulator(Scenario(PipelineModel(cores=2, cpu_s=0.5, outside_load=2.0)), workers=2)
    hog.set_priority("low")
    hog.run_until(10.0)
    # the hog's two weight-1 jobs and the workers' two fill 2 cores by weight
    shared = 2 * 2 * LOW_WEIGHT / (2 + 2 * LOW_WEIGHT)
    assert hog.observe().workers_cpu == pytest.approx(shared, rel=0.05)
    with pytest.raises(ValueError, match="priority must be 'normal' or 'low', got 'idle'"):
        hog.set_priority("idle")


def test_more_runnable_jobs_than_cores_cost_cpu_time() -> None:
    # CPU-bound workers on 2 cores and a step that waits off the CPU: 8 workers make fewer
    # samples per CPU second than 2 (switching among 4x the cores), none without the cost.
    p = PipelineModel(
        cores=2, cpu_s=0.05, step_s=0.001, cost_cv=0, step_cv=0, transport_s=0, max_workers=8
    )

    def per_cpu_second(workers: int, model: PipelineModel) -> float:
        sim = _run(model, workers, seconds=30.0)
        state = sim.observe()
        return state.throughput / (state.workers_cpu + state.main_cpu)

    # 8 runnable workers on 2 cores are 3 jobs per core too many: 1 / (1 + 3c) of the work
    expected = per_cpu_second(2, p) / (1 + 3 * p.oversubscription)
    assert per_cpu_second(8, p) == pytest.approx(expected, rel=0.01)
    free = p.replace(oversubscription=0.0)
    assert per_cpu_second(8, free) == pytest.approx(per_cpu_second(2, free), rel=0.01)


def test_the_worker_bound_is_the_loaders() -> None:
    from drapps.runtime.config import AUTO_MAX_WORKERS, LoaderConfig
    from drapps.sim.scenario import AUTO_MAX_WORKERS as SIM_AUTO_MAX_WORKERS

    assert SIM_AUTO_MAX_WORKERS == AUTO_MAX_WORKERS
    assert PipelineModel(cores=2).worker_limit == 8
    assert PipelineModel(cores=16).worker_limit == 32
    assert LoaderConfig(workers="auto").resolved_max_workers >= AUTO_MAX_WORKERS


@pytest.mark.parametrize(("step_s", "busy"), [(0.002, (0.9, 1.0)), (0.5, (0.0, 0.2))])
def test_busy_share_is_batches_in_flight_per_worker(
    step_s: float, busy: tuple[float, float]
) -> None:
    # A step faster than the workers keeps all four at work; a slow one leaves them idle
    # behind a full queue. By Little's law the interval's batch latencies over its length
    # are the batches in flight, as the real monitor reads them.
    p = PipelineModel(cores=4, cpu_s=0.2, step_s=step_s)
    sim = Simulator(Scenario(p), workers=4, seed=0)
    sim.run_until(10.0)
    sim.observe()
    sim.run_until(20.0)
    state = sim.observe()
    assert state.in_flight is not None
    assert busy[0] <= state.busy_share <= busy[1], state


def test_an_epoch_ends_with_a_drained_queue_and_the_next_starts_empty() -> None:
    """As a Loader between epochs: nothing of the next epoch is made before the loop took the
    last batch of this one, so the loop waits at every epoch's start; the State says how much
    of the epoch is left."""
    p = PipelineModel(cores=4, cpu_s=0.05, step_s=0.05, epoch_batches=30)
    endless = _run(p.replace(epoch_batches=None), workers=4, seconds=30.0)
    sim = Simulator(Scenario(p), workers=4, seed=0)
    left = []
    while sim.now < 30.0 - 1e-9:
        sim.run_until(sim.now + 0.01)
        state = sim.observe()
        assert state.epoch_left is not None and 0 <= state.epoch_left <= 30
        epoch_end = 30 * (sim.totals.epochs + 1)
        # nothing past the epoch's end is made or dispatched
        assert sim.totals.dispatched <= epoch_end
        left.append(state.epoch_left)
    assert sim.totals.epochs >= 10 and sim.totals.consumed >= 10 * 30
    assert sim.totals.dispatched == sim.totals.arrived + sim.in_flight
    assert min(left) == 0 and max(left) == 30
    # each epoch's start refills the queue while the loop waits; endless, it never waits
    assert sim.totals.wait_s > 10 * 0.02 and endless.totals.wait_s < 0.1
    assert sim.totals.consumed < endless.totals.consumed
    assert Simulator(Scenario(p), workers=0, seed=0).observe().epoch_left is None  # inline
    with pytest.raises(ValueError, match="epoch_batches must be an int >= 1"):
        PipelineModel(cores=2, epoch_batches=0)
