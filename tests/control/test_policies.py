"""Policies on synthetic State sequences: each rule fires when it should, and only then."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from helpers import GIB, state

from drapps.control import (
    NOOP,
    Action,
    HeuristicConfig,
    HeuristicPolicy,
    State,
    StaticPolicy,
    make_policy,
    policy_names,
    reward,
)
from drapps.control.reward import RewardWeights, idle_workers


class World:
    """A toy pipeline: throughput = min(consumer rate, per_worker * min(workers, cores));
    ``others``: cores that other processes use at the same time (it only shows in cpu_util)."""

    def __init__(
        self, per_worker: float, consumer: float, cores: int, workers: int = 1, others: float = 0
    ) -> None:
        self.per_worker, self.consumer, self.cores, self.workers = (
            per_worker,
            consumer,
            cores,
            workers,
        )
        self.others = others

    def observe(self) -> State:
        produced = self.per_worker * min(self.workers, self.cores)
        throughput = min(self.consumer, produced)
        wait = max(0.0, 1 - produced / self.consumer)
        busy = min(self.cores, self.workers * throughput / self.per_worker / max(1, self.workers))
        queue = 2 * self.workers if produced > self.consumer else 0
        used = min(self.cores, busy + self.others)
        return state(
            cores=self.cores,
            cpu_util=used / self.cores,
            idle_cores=self.cores - used,
            workers_cpu=max(0.0, min(busy, self.cores - self.others)),
            main_cpu=0.0,
            wait_fraction=wait,
            throughput=throughput,
            workers=self.workers,
            queue_batches=queue,
            prefetch=2 * self.workers,
            max_workers=2 * self.cores,
        )

    def run(self, policy: HeuristicPolicy, ticks: int) -> list[Action]:
        actions = []
        self.history: list[int] = []
        for _ in range(ticks):
            action = policy.decide(self.observe())
            self.workers = max(1, min(2 * self.cores, self.workers + action.workers))
            actions.append(action)
            self.history.append(self.workers)
        return actions

    def settled(self, last: int = 60) -> int:
        """The worker count held most over the last ticks (probes are brief excursions)."""
        tail = self.history[-last:]
        return max(set(tail), key=tail.count)


def test_registry_lists_and_builds_policies() -> None:
    assert {"heuristic", "static"} <= set(policy_names())
    assert isinstance(make_policy("static"), StaticPolicy)
    with pytest.raises(ValueError, match=r"policy must be one of \[.*'heuristic'.*\], got 'magic'"):
        make_policy("magic")


def test_static_never_acts() -> None:
    assert StaticPolicy().decide(state(wait_fraction=0.9)) == NOOP


def test_grows_while_the_consumer_waits_and_stops_where_cores_run_out() -> None:
    world = World(per_worker=100, consumer=1000, cores=4)
    world.run(HeuristicPolicy(), ticks=120)
    assert world.settled() == 4  # a fifth worker on 4 cores raises nothing: reverted


def test_no_worker_is_added_whose_private_memory_the_host_cannot_hold() -> None:
    """Each worker holds 2 GiB of its own (copy-on-read of a forked dataset): the pool stops
    growing while the next worker would leave available memory under the floor."""

    class Bound(World):
        def observe(self) -> State:
            free = 12 * GIB - self.workers * 2 * GIB
            return replace(
                super().observe(),
                available_bytes=free,
                total_bytes=32 * GIB,
                worker_private_bytes=2 * GIB,
            )

    world = Bound(per_worker=100, consumer=1000, cores=8)
    world.run(HeuristicPolicy(), ticks=150)
    # At 3 workers 6 GiB are left: a fourth (2 GiB, as much again to grow) would leave 2 GiB,
    # under the floor (a tenth of 32 GiB).
    assert max(world.history) == 3
    world = World(per_worker=100, consumer=1000, cores=8)
    world.run(HeuristicPolicy(), ticks=150)
    assert world.settled() == 8  # the same pipeline with room grows to the cores


def test_shrinks_when_workers_sit_idle() -> None:
    world = World(per_worker=100, consumer=250, cores=8, workers=8)
    world.run(HeuristicPolicy(), ticks=150)
    # The fewest workers that still keep the consumer from waiting; tries at 2 are reverted.
    assert world.settled() == 3 and min(world.history[-60:]) >= 2


def test_a_shrink_that_starves_the_loop_is_undone_at_once() -> None:
    world = World(per_worker=100, consumer=250, cores=8, workers=3)
    actions = world.run(HeuristicPolicy(), ticks=200)
    tries = [i for i, a in enumerate(actions) if a.workers < 0 and "trying 2" in a.reason]
    undone = [i for i, a in enumerate(actions) if a.workers > 0 and "back to 3" in a.reason]
    assert tries and len(undone) == len(tries)
    # Each try at 2 workers (200 samples/s for a 250 consumer) is undone on the next tick,
    # not after settle + window (6 ticks) of a starving loop.
    assert all(u - t == 1 for t, u in zip(tries, undone, strict=True))
    assert "the training loop waited 20%" in actions[undone[0]].reason
    assert world.settled() == 3


def _ticks_to(world: World, policy: HeuristicPolicy, workers: int, limit: int = 200) -> int:
    for tick in range(limit):
        world.run(policy, ticks=1)
        if world.workers == workers:
            return tick
    raise AssertionError(f"never reached {workers} workers: {world.history}")


def test_a_clear_probe_is_judged_early_and_an_unclear_one_in_full() -> None:
    early = _ticks_to(World(per_worker=100, consumer=1000, cores=4), HeuristicPolicy(), 4)
    full_config = HeuristicConfig(early=HeuristicConfig().window)  # judged after the window
    full = _ticks_to(World(per_worker=100, consumer=1000, cores=4), HeuristicPolicy(full_config), 4)
    # Two kept probes (1 -> 2 -> 4 workers: with cores idle a try goes to the count the wait
    # says is missing, at most doubling), each judged 2 ticks sooner when its gain is clear
    # (>= 10%); while the loop starves, the next starts from those 2 ticks, not a new window.
    assert (early, full) == (10, 14)
    # A gain of 6% (over min_gain, under twice it: 16 -> 17 workers) on a nearly busy CPU
    # is measured in full.
    world = World(per_worker=100, consumer=10_000, cores=18, workers=16)
    policy = HeuristicPolicy()
    actions = world.run(policy, ticks=40)
    tried = next(i for i, a in enumerate(actions) if a.workers == +1)
    kept = next(i for i, a in enumerate(actions) if a.reason.startswith("kept 17 workers"))
    assert kept - tried == policy.config.settle + policy.config.window


def test_a_shrink_is_undone_only_by_a_tick_worse_than_any_before_it() -> None:
    policy = HeuristicPolicy()
    warmed(policy)
    # The loop waited 2.5% on average, one tick of the four at 10%: a shrink is tried.
    for wait in (0.0, 0.0, 0.10, 0.0):
        action = policy.decide(state(wait_fraction=wait, queue_batches=4, workers=4))
    assert action.workers == -1, action
    # A tick at 12% is within the baseline's worst tick (plus wait_low): the probe goes on.
    assert policy.decide(state(wait_fraction=0.12, queue_batches=4, workers=3)) == NOOP
    undo = policy.decide(state(wait_fraction=0.30, queue_batches=0, workers=3))
    assert undo.workers == +1 and "back to 4 workers" in undo.reason


def test_readapts_when_the_consumer_gets_faster() -> None:
    world = World(per_worker=100, consumer=250, cores=8, workers=3)
    policy = HeuristicPolicy()
    world.run(policy, ticks=40)
    assert world.settled(20) == 3
    world.consumer = 600  # the training step got faster
    world.run(policy, ticks=120)
    assert world.settled() == 6


def test_hysteresis_prevents_flapping_at_the_ceiling() -> None:
    # A competitor holds a core's worth of CPU, so another worker might win some of it.
    world = World(per_worker=100, consumer=1000, cores=4, workers=4, others=1.0)
    actions = world.run(HeuristicPolicy(), ticks=200)
    tries = [a for a in actions if a.workers == +1]
    # Probes at the ceiling back off 8, 16, 32, 64, 120 ticks: a handful, not one per window.
    assert 2 <= len(tries) <= 6
    assert all("back to 4" in b.reason for b in actions if b.workers == -1)


def test_no_worker_past_one_per_core_on_a_machine_the_job_saturates_alone() -> None:
    world = World(per_worker=100, consumer=1000, cores=4, workers=4)
    actions = world.run(HeuristicPolicy(), ticks=200)
    assert not [a for a in actions if a.workers == +1] and world.settled() == 4
    # A pool that grew while a competitor ran comes back to one worker per core once it left.
    world = World(per_worker=100, consumer=1000, cores=4, workers=6)
    actions = world.run(HeuristicPolicy(), ticks=60)
    assert world.settled(20) == 4
    assert any("saturated by this job alone" in a.reason for a in actions)


def test_backoff_is_cancelled_when_conditions_change() -> None:
    world = World(per_worker=100, consumer=1000, cores=4, workers=4)
    policy = HeuristicPolicy(HeuristicConfig(backoff=100, max_backoff=100))
    world.run(policy, ticks=20)  # one failed probe, now backed off for 100 ticks
    world.cores = 8  # cores freed up: idle share jumps
    world.run(policy, ticks=60)
    assert world.workers > 4


def test_memory_pressure_sheds_workers_first() -> None:
    policy = HeuristicPolicy()
    action = policy.decide(state(available_bytes=GIB, wait_fraction=0.9, workers=4))
    assert action.workers == -1 and action.prefetch == -1 and "memory" in action.reason
    one = policy.decide(state(queue_bytes=2 * GIB, workers=1, prefetch=3))
    assert one == Action(prefetch=-1, reason="queue over budget: lowering prefetch")


def test_a_clipped_probe_is_abandoned_not_judged() -> None:
    policy = HeuristicPolicy()
    # 3 ticks of flowing data, then 2 (a loop starving this much needs no full window).
    actions = [policy.decide(state(wait_fraction=0.5, workers=2)) for _ in range(5)]
    assert [a.workers for a in actions] == [0, 0, 0, 0, +1]
    # The controller could not add the worker: the next states still show 2.
    assert all(policy.decide(state(wait_fraction=0.5, workers=2)).workers >= 0 for _ in range(3))


def test_state_vector_is_bounded_and_ordered() -> None:
    vector = state(wait_fraction=0.3, throughput=1e9, latency_p99_s=100.0).vector()
    assert vector.shape == (len(State.FEATURES),) and vector.dtype == np.float32
    assert np.all((vector >= 0) & (vector <= 1))
    assert vector[State.FEATURES.index("wait_fraction")] == pytest.approx(0.3)
    assert set(state().feature_values()) == State.ALL_FEATURES  # every name has its value
    assert State.from_dict(state().as_dict()) == state()


def test_reward_prefers_throughput_and_punishes_waiting_and_overrun() -> None:
    fed = reward(state(throughput=1000, wait_fraction=0.0))
    starving = reward(state(throughput=1000, wait_fraction=0.5, idle_cores=4.0))
    overrun = reward(state(throughput=1000, queue_bytes=3 * GIB))
    assert fed > starving and fed > overrun
    assert reward(state(throughput=2000)) > fed
    # the same throughput from a bigger footprint (more idle workers' memory) is worth less
    assert reward(state(throughput=1000, rss_bytes=8 * GIB)) < fed
    # what is charged is the memory held: pages forked workers share count once
    shared = state(throughput=1000, rss_bytes=8 * GIB, pss_bytes=2 * GIB)
    assert shared.held_bytes == 2 * GIB and reward(shared) == pytest.approx(fed)


def test_the_start_term_charges_each_worker_added() -> None:
    # A worker added for half a second holds its pages as long as the peak is read; the
    # footprint term, charged per tick, sees it for half a second. Each one added is charged.
    kept, added = state(workers=2), state(workers=2, workers_added=1)
    weights = RewardWeights(start=0.25)
    assert reward(added, weights) == pytest.approx(reward(kept, weights) - 0.25)
    assert reward(state(workers=4, workers_added=3), weights) == pytest.approx(
        reward(state(workers=4), weights) - 0.75
    )
    assert reward(added, RewardWeights(start=0.0)) == reward(kept, RewardWeights(start=0.0))
    assert State.from_dict({k: v for k, v in added.as_dict().items() if k != "workers_added"}) == (
        kept
    )  # older traces: none added
    with pytest.raises(ValueError, match=r"RewardWeights\.start must be >= 0"):
        RewardWeights(start=-0.1)


def test_the_idle_term_charges_workers_left_behind_a_full_queue() -> None:
    # Eight workers with half a batch in flight: 7 of them idle, less the share of a batch
    # the rest keep; none charged where batches in flight were not measured, or for one.
    idle = state(workers=8, max_workers=8, in_flight=0.5)
    assert idle_workers(idle) == pytest.approx(7 * (1 - 0.5 / 8) / 8)
    assert idle_workers(state(workers=8, max_workers=8, in_flight=8.0)) == 0.0
    assert idle_workers(state(workers=8)) == 0.0 and idle.busy_share == 0.5 / 8
    assert idle_workers(state(workers=1, in_flight=0.0)) == 0.0
    off = RewardWeights(idle=0.0)
    assert reward(idle, off) == reward(state(workers=8, max_workers=8, in_flight=8.0), off)
    assert reward(idle) == pytest.approx(reward(idle, off) - 0.5 * idle_workers(idle))
    assert RewardWeights().idle == 0.5  # charged by default
    with pytest.raises(ValueError, match=r"RewardWeights\.idle must be >= 0"):
        RewardWeights(idle=-1.0)


def test_actions_take_one_step_per_knob() -> None:
    assert len(Action.space()) == 9 and NOOP in Action.space()
    with pytest.raises(ValueError, match=r"Action.workers must be one of \(-1, 0, 1\), got 2"):
        Action(workers=2)
    assert Action.from_dict(Action(1, -1, reason="x").as_dict()) == Action(1, -1, reason="x")


def test_start_up_starvation_is_not_judged() -> None:
    policy = HeuristicPolicy()
    starting = [policy.decide(state(wait_fraction=1.0, throughput=0.0)) for _ in range(10)]
    warming = [policy.decide(state(wait_fraction=0.6, throughput=100.0)) for _ in range(3)]
    assert all(a == NOOP for a in starting + warming)
    later = [policy.decide(state(wait_fraction=0.6, throughput=100.0)) for _ in range(2)]
    assert [a.workers for a in later] == [0, +1]  # a 2-tick baseline, the loop starving


def warmed(policy: HeuristicPolicy) -> None:
    for _ in range(3):  # data flowing for `settle` ticks
        policy.decide(state(wait_fraction=0.0, queue_batches=2))


def test_bursty_latency_with_a_dry_queue_deepens_prefetch() -> None:
    policy = HeuristicPolicy()
    warmed(policy)
    bursty = state(wait_fraction=0.06, latency_p50_s=0.05, latency_p99_s=0.4, queue_batches=0)
    actions = [policy.decide(bursty) for _ in range(4)]
    assert actions[-1].prefetch == +1 and actions[-1].workers == 0
    assert "bursty (p99 400 ms vs p50 50 ms)" in actions[-1].reason
    steady = state(wait_fraction=0.06, latency_p50_s=0.05, latency_p99_s=0.06, queue_batches=0)
    policy = HeuristicPolicy()
    warmed(policy)
    assert all(policy.decide(steady).prefetch == 0 for _ in range(8))  # not bursty: no change


def test_a_queue_that_stays_full_gives_extra_prefetch_back() -> None:
    policy = HeuristicPolicy()
    warmed(policy)
    # One worker (no shrink possible), 4 batches of prefetch, all ready, loop never waits.
    full = state(wait_fraction=0.0, workers=1, prefetch=4, queue_batches=4)
    actions = [policy.decide(full) for _ in range(4)]
    assert actions[-1].prefetch == -1 and "queue stays full" in actions[-1].reason
    at_base = state(wait_fraction=0.0, workers=1, prefetch=2, queue_batches=2)
    assert all(policy.decide(at_base).prefetch == 0 for _ in range(8))  # 2 per worker is the floor


class SplitWorld:
    """One worker the controller may not add to; each op moved into the device stage takes
    ``op_s`` off the worker's time per batch and adds ``stage_s`` to the loop's."""

    def __init__(self, op_s: float = 0.01, stage_s: float = 0.004, gpu: float | None = None):
        self.op_s, self.stage_s, self.gpu = op_s, stage_s, gpu
        self.split, self.workers = 4, 1
        self.history: list[int] = []

    def observe(self) -> State:
        moved = 4 - self.split
        make = 0.04 - self.op_s * moved  # worker seconds per batch
        loop = 0.02 + self.stage_s * moved  # the loop's seconds per batch (step + stage)
        rate = 1 / max(make, loop)
        return state(
            cores=2,
            cpu_util=0.75,
            idle_cores=0.5,
            wait_fraction=max(0.0, 1 - loop / make),
            throughput=32 * rate,
            workers=self.workers,
            max_workers=4,
            queue_batches=0,
            prefetch=2,
            split=self.split,
            device_stage_share=self.stage_s * moved * rate,
            gpu_util=self.gpu,
        )

    def run(self, policy: HeuristicPolicy, ticks: int) -> list[Action]:
        actions = []
        for _ in range(ticks):
            action = policy.decide(self.observe())
            self.split = max(1, min(4, self.split + action.split))  # workers stay fixed
            actions.append(action)
            self.history.append(self.split)
        return actions


def test_the_split_moves_into_the_device_stage_while_it_pays() -> None:
    world = SplitWorld()
    actions = world.run(HeuristicPolicy(), ticks=200)
    # 4 -> 3 (+33%) and 3 -> 2 (+7%) pay; 2 -> 1 would starve nothing but slow the loop.
    assert max(set(world.history[-60:]), key=world.history[-60:].count) == 2
    moves = [a for a in actions if a.split == -1]
    assert moves and "into the device stage on the CPU" in moves[0].reason
    assert any(a.reason.startswith("kept split at op 3") for a in actions)


def test_a_busy_gpu_takes_no_more_ops() -> None:
    world = SplitWorld(gpu=0.8)
    world.run(HeuristicPolicy(), ticks=100)
    assert set(world.history) == {4}


def test_a_device_stage_that_holds_the_loop_gives_an_op_back() -> None:
    # The stage costs the loop more than the worker saves: nothing waits, the GPU is busy.
    world = SplitWorld(op_s=0.002, stage_s=0.02, gpu=0.95)
    world.split = 2
    actions = world.run(HeuristicPolicy(), ticks=60)
    back = [a for a in actions if a.split == +1]
    assert back and "moving op 2 back to the workers" in back[0].reason
    assert world.history[-1] > 2


class StageBoundWorld(SplitWorld):
    """The stage runs ahead in its own thread: when it is the slowest part, the loop waits on
    it (the real loader counts that as the loop's wait) and it is busy all the time."""

    def observe(self) -> State:
        moved = 4 - self.split
        make = 0.04 - self.op_s * moved
        stage = self.stage_s * moved
        rate = 1 / max(make, stage, 0.02)
        return state(
            cores=2, cpu_util=0.75, idle_cores=0.5, wait_fraction=max(0.0, 1 - 0.02 * rate),
            throughput=32 * rate, workers=self.workers, max_workers=4, queue_batches=0,
            prefetch=2, split=self.split, device_stage_share=min(1.0, stage * rate),
        )  # fmt: skip


def test_a_device_stage_the_loop_waits_on_gives_ops_back() -> None:
    world = StageBoundWorld(op_s=0.01, stage_s=0.02)
    world.split = 1  # three ops in a stage that takes 60 ms a batch: it starves the loop
    actions = world.run(HeuristicPolicy(), ticks=150)
    back = [a for a in actions if a.split == +1]
    assert back and "waited" in back[0].reason and "on the device stage" in back[0].reason
    tail = world.history[-50:]
    assert max(set(tail), key=tail.count) == 3  # 33 batches/s, against 25 at 2 and at 4


class TableWorld(SplitWorld):
    """Throughput per split from a table (what the bench measured with one worker: moving the
    flip alone buys 3%, the crop too 17%, the decode too loses)."""

    rates = {4: 569.0, 3: 586.0, 2: 668.0, 1: 593.0}

    def observe(self) -> State:
        rate = self.rates[self.split]
        return state(
            cores=2, cpu_util=0.6, idle_cores=0.8, wait_fraction=0.3 * 569 / rate,
            throughput=rate, workers=1, max_workers=4, queue_batches=0, prefetch=2,
            split=self.split, device_stage_share=0.1 * (4 - self.split),
        )  # fmt: skip


def test_a_move_that_does_not_lose_is_kept_so_the_next_one_can_pay() -> None:
    world = TableWorld()
    world.run(HeuristicPolicy(), ticks=150)
    tail = world.history[-50:]
    assert max(set(tail), key=tail.count) == 2


def test_a_bound_heuristic_tries_only_the_knobs_it_may_move() -> None:
    def first_split_move(policy: HeuristicPolicy) -> int:
        actions = SplitWorld().run(policy, ticks=60)
        assert all(a.workers == 0 for a in actions) or policy._movable is None
        return next(i for i, a in enumerate(actions) if a.split == -1)

    bound = HeuristicPolicy()
    bound.bind(("split",))  # the workers are fixed: no probe of them is wasted
    assert first_split_move(bound) < first_split_move(HeuristicPolicy())
    fixed_split = HeuristicPolicy()
    fixed_split.bind(("workers", "prefetch"))
    world = SplitWorld()
    world.workers = 1
    assert all(a.split == 0 for a in world.run(fixed_split, ticks=100))


def test_bad_heuristic_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"early must be in 1..window \(4\), got 5"):
        HeuristicConfig(early=5)
    with pytest.raises(ValueError, match=r"early must be in 1..window \(4\), got 0"):
        HeuristicConfig(early=0)
    with pytest.raises(ValueError, match="settle must be >= 1, got 0"):
        HeuristicConfig(settle=0)
    with pytest.raises(ValueError, match="need 0 <= wait_low < wait_high <= 1"):
        HeuristicConfig(wait_low=0.2, wait_high=0.1)


def test_a_worker_tried_while_the_loop_starves_with_idle_cores_is_kept_unless_it_hurts() -> None:
    # Workers that wait on slow reads: one more (what a wait of 25% says is missing from 3)
    # adds 3% (under min_gain), cores stay idle.
    policy = HeuristicPolicy()
    warmed(policy)
    before = {"wait_fraction": 0.25, "idle_cores": 1.5, "cores": 2, "throughput": 100.0}
    grown = [policy.decide(state(**before, workers=3)) for _ in range(policy.config.early)]
    assert grown[-1].workers == +1, grown
    after = {"wait_fraction": 0.24, "idle_cores": 1.4, "cores": 2, "throughput": 103.0}
    for _ in range(policy.config.settle + policy.config.early - 1):
        assert policy.decide(state(**after, workers=4)) == NOOP
    kept = policy.decide(state(**after, workers=4))  # judged early: it cost nothing
    assert kept.reason.startswith("kept 4 workers"), kept
    # On a busy CPU the same 3% is measured in full and the worker given back.
    policy = HeuristicPolicy()
    warmed(policy)
    busy = {"idle_cores": 0.1, "cores": 2}
    grown = [policy.decide(state(**{**before, **busy}, workers=3)) for _ in range(2)]
    assert grown[-1].workers == +1, grown
    for _ in range(policy.config.settle + policy.config.window - 1):
        assert policy.decide(state(**{**after, **busy}, workers=4)) == NOOP
    undo = policy.decide(state(**{**after, **busy}, workers=4))
    assert undo.workers == -1 and "back to 3 workers" in undo.reason, undo


def test_with_heavy_tailed_costs_a_worker_is_free_with_less_idle_cpu() -> None:
    # A few slow reads hold batches: the CPU idles a fifth of the time between bursts while the
    # loop waits. With heavy-tailed sample costs another worker is kept unless it hurt; with
    # uniform costs the same readings measure it in full and give it back.
    before = {"wait_fraction": 0.2, "idle_cores": 0.4, "cores": 2, "throughput": 600.0}
    after = {"wait_fraction": 0.19, "idle_cores": 0.38, "cores": 2, "throughput": 606.0}
    outcomes = {}
    for tail in (40.0, 1.5):
        policy = HeuristicPolicy()
        warmed(policy)
        for _ in range(policy.config.window):
            grown = policy.decide(state(**before, workers=4, sample_tail=tail))
            if grown != NOOP:
                break
        assert grown.workers == +1, grown
        for _ in range(policy.config.settle + policy.config.window):
            decision = policy.decide(state(**after, workers=5, sample_tail=tail))
            if decision != NOOP:
                break
        outcomes[tail] = decision
    assert outcomes[40.0].reason.startswith("kept 5 workers"), outcomes
    assert outcomes[1.5].workers == -1 and "back to 4 workers" in outcomes[1.5].reason, outcomes


def test_with_heavy_tailed_costs_and_idle_cores_a_small_wait_still_grows_the_pool() -> None:
    # The loop waits 7% on stalls behind slow reads with a third of the cores idle: more
    # workers in flight hide them at no CPU cost, so the pool grows past the usual 10%
    # threshold; with uniform costs 7% is fed enough, and a busy CPU keeps the usual rule.
    readings = {"wait_fraction": 0.07, "cores": 2, "throughput": 700.0}
    cases = {(40.0, 0.7): True, (1.5, 0.7): False, (40.0, 0.1): False}
    for (tail, idle), grows in cases.items():
        policy = HeuristicPolicy()
        warmed(policy)
        moves = [
            policy.decide(state(**readings, idle_cores=idle, workers=4, sample_tail=tail))
            for _ in range(policy.config.window)
        ]
        assert any(m.workers == +1 for m in moves) is grows, (tail, idle, moves)


def test_with_heavy_tailed_costs_grows_keep_doubling_across_fed_spells_between_bursts() -> None:
    # Slow reads come in bursts: the loop starves, then is fed for a few ticks, then starves
    # again, while a fifth of the cores idle. A fed spell between bursts is not the loop being
    # fed for good: the next grow is still twice the last, so the pool fills in a few tries.
    policy = HeuristicPolicy()
    warmed(policy)
    workers, sizes = 2, []
    for tick in range(120):
        fed = tick % 12 >= 7
        reading = state(
            wait_fraction=0.0 if fed else 0.2, idle_cores=0.4, cores=2, workers=workers,
            throughput=400.0 + 40 * workers, sample_tail=40.0, max_workers=32,
        )  # fmt: skip
        action = policy.decide(reading)
        if "trying" in action.reason:
            sizes.append(int(action.reason.split("trying ")[1].split()[0]) - workers)
        workers += action.workers
    assert max(sizes) >= 4, sizes


def test_grows_kept_in_a_row_double_so_a_large_machine_is_filled_in_a_few_tries() -> None:
    # 64 cores, 8 workers: one worker a try (5 ticks each) would take some 280 ticks. With
    # the cores idle each try goes to the count the loop's wait says is missing, at most
    # doubling; on a busy CPU (another job's load) a try starts at one worker and doubles
    # with each one kept in a row.
    expected = {0: [16, 32, 64], 60: [9, 10, 12, 16, 24, 40]}
    for others, sizes_wanted in expected.items():
        world = World(per_worker=100, consumer=6400, cores=64, workers=8, others=others)
        actions = world.run(HeuristicPolicy(), ticks=100)
        assert max(world.history) >= sizes_wanted[-1], (others, world.history)
        tries = [a.reason for a in actions if "trying" in a.reason]
        sizes = [int(r.split("trying ")[1].split()[0]) for r in tries]
        # Each try moves one step a tick (as every Action does) toward its size.
        assert all(a.workers in (-1, 0, 1) for a in actions)
        assert sizes[: len(sizes_wanted)] == sizes_wanted, (others, tries)


class Thrashing(World):
    """Past ``limit`` workers each one more costs throughput (a disk that seeks between
    readers), while the cores stay half idle."""

    limit = 8

    def observe(self) -> State:
        over = max(0, self.workers - self.limit)
        produced = self.per_worker * min(self.workers, self.limit) * 0.85**over
        return dataclasses.replace(
            super().observe(),
            throughput=min(self.consumer, produced),
            wait_fraction=max(0.0, 1 - produced / self.consumer),
            idle_cores=self.cores / 2,
            cpu_util=0.5,
        )


def test_a_failed_grow_of_several_workers_is_undone_step_by_step() -> None:
    # From 6 workers, the loop waiting 60% with half the cores idle, the try goes to 12 (the
    # wait says 15, at most doubling), which loses throughput past 8: undone a step a tick.
    world = Thrashing(per_worker=100, consumer=1500, cores=16, workers=6)
    actions = world.run(HeuristicPolicy(), ticks=80)
    back = next(i for i, a in enumerate(actions) if a.reason.startswith("back to"))
    assert "back to 6 workers: 12 workers" in actions[back].reason, actions[back]
    assert [a.workers for a in actions[back : back + 6]] == [-1] * 6
    assert all(a.reason == "undoing the last try" for a in actions[back + 1 : back + 6])
    assert world.history[back + 5] == 6
    # The next try, once the backoff is over, is half as large.
    later = [a.reason for a in actions[back:] if "trying" in a.reason]
    assert later and "trying 9 workers" in later[0], later


class ExecutorWorld:
    """Two workers on two cores the job saturates alone (another worker would not help), the
    loop starving; ``rates``: samples/s with processes (0) and with threads (1)."""

    def __init__(self, processes: float, threads: float) -> None:
        self.rates = [processes, threads]
        self.executor = 0
        self.history: list[int] = []

    def observe(self) -> State:
        throughput = self.rates[self.executor]
        return state(
            cores=2, cpu_util=0.97, idle_cores=0.06, workers_cpu=1.2, main_cpu=0.74,
            wait_fraction=max(0.0, 1 - throughput / 2000), throughput=throughput,
            workers=2, max_workers=4, prefetch=4, extra={"executor": self.executor},
        )  # fmt: skip

    def run(self, policy: HeuristicPolicy, ticks: int) -> list[Action]:
        actions = []
        for _ in range(ticks):
            action = policy.decide(self.observe())
            self.executor = min(1, max(0, self.executor + action.other.get("executor", 0)))
            actions.append(action)
            self.history.append(self.executor)
        return actions


def test_threads_measured_ahead_are_kept_and_held() -> None:
    world = ExecutorWorld(processes=1000, threads=1200)
    actions = world.run(HeuristicPolicy(), ticks=100)
    kept = [a.reason for a in actions if a.reason.startswith("kept threads")]
    assert kept and "1200 samples/s against 1000 with worker processes" in kept[0]
    switched = world.history.index(1)
    # Kept, and not tried back while nothing changes (the backoff's ceiling, 120 ticks).
    assert all(world.history[switched:]), world.history


def test_threads_that_make_less_are_undone_and_not_tried_again_at_once() -> None:
    world = ExecutorWorld(processes=1000, threads=800)
    policy = HeuristicPolicy()
    actions = world.run(policy, ticks=60)
    assert any(a.reason.startswith("back to worker processes") for a in actions)
    tries = sum(1 for a in actions if a.other.get("executor") == +1)
    assert tries == 1, world.history  # a failed executor backs off half the ceiling
    assert world.history[-1] == 0


def test_a_change_that_makes_threads_lose_sends_the_workers_back_to_processes() -> None:
    """A GIL-heavy transform turned on mid-run: threads fall to half, the loop's wait moves
    away from where threads were kept, and processes are tried again and kept."""
    world = ExecutorWorld(processes=1000, threads=1200)
    policy = HeuristicPolicy()
    world.run(policy, ticks=40)
    assert world.executor == 1
    world.rates = [900, 450]
    actions = world.run(policy, ticks=40)
    assert any(a.reason.startswith("kept worker processes") for a in actions), [
        a.reason for a in actions if a.reason
    ]
    assert world.executor == 0


def test_no_executor_is_tried_without_the_knob() -> None:
    world = ExecutorWorld(processes=1000, threads=1200)
    policy = HeuristicPolicy()
    for _ in range(60):
        s = world.observe()
        action = policy.decide(dataclasses.replace(s, extra={}))
        assert "executor" not in action.other
