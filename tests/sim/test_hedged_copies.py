"""The simulator's hedged copies: overdue parts of the batches due copied to a second worker,
as the real dispatcher copies them (``drapps.runtime.hedging``)."""

from __future__ import annotations

import numpy as np
import pytest

from drapps.sim import PipelineModel, Scenario, Simulator
from drapps.sim.hedging import HEDGE_FACTOR, HedgedCopies


def tail_reads(**changes: object) -> PipelineModel:
    # 3% of samples wait 40x a typical one, at random (tail reads: not predicted, and
    # usually quick when read again); 50 ms of CPU and 100 ms of storage wait per batch.
    model = PipelineModel(
        cores=8, cpu_s=0.05, read_s=0.1, step_s=0.04, slow_share=0.03, slow_factor=40,
        slow_known=0.0, dispatch="auto", cost_cv=0.2, transport_s=0.0,
    )  # fmt: skip
    return model.replace(**changes)


def run(
    model: PipelineModel, *, hedge: bool, workers: int = 6, prefetch: int | None = 4
) -> tuple[Simulator, dict[str, float]]:
    """Two simulated minutes, a State every half second: the share of time the loop waited,
    the batches' p99 latency from dispatch to ready (each tick's, the 99th percentile over
    the ticks), the workers' CPU seconds per batch made and samples/s."""
    sim = Simulator(Scenario(model), workers=workers, prefetch=prefetch, seed=0, hedge=hedge)
    cpu, p99 = 0.0, []
    for tick in range(1, 241):
        sim.run_until(0.5 * tick)
        state = sim.observe()
        cpu += state.workers_cpu * 0.5
        p99.append(state.latency_p99_s)
    seconds = 120.0
    return sim, {
        "wait": sim.totals.wait_s / seconds,
        "p99": float(np.percentile(p99, 99)),
        "cpu_per_batch": cpu / sim.totals.arrived,
        "throughput": sim.totals.samples / seconds,
    }


def test_copies_cut_the_tail_and_their_cpu_is_counted() -> None:
    # 6 workers keep up with the step, but a prefetch of 4 leaves a straggler no slack
    off_sim, off = run(tail_reads(), hedge=False)
    on_sim, on = run(tail_reads(), hedge=True)
    assert off_sim.totals.hedges == 0
    assert on_sim.totals.hedges > 100 and 0 < on_sim.totals.hedges_won <= on_sim.totals.hedges
    assert on["wait"] < 0.5 * off["wait"]
    assert on["p99"] < 0.9 * off["p99"]
    assert on["throughput"] >= off["throughput"]
    # a worker busy on a duplicate: more worker CPU per batch made
    assert on["cpu_per_batch"] > 1.01 * off["cpu_per_batch"]


@pytest.mark.parametrize("dispatch", ["samples", "auto"])
@pytest.mark.parametrize(("workers", "prefetch"), [(3, 2), (6, 4), (12, None)])
def test_light_tailed_costs_send_no_copy(dispatch: str, workers: int, prefetch: int | None) -> None:
    # batches cut into parts ("samples") or whole ("auto" with light tails): no part runs
    # HEDGE_FACTOR times its typical cost, whether the loop waits (3 workers) or not
    model = tail_reads(slow_share=0.0, slow_factor=1.0, dispatch=dispatch, cost_cv=0.3)
    sim, _ = run(model, hedge=True, workers=workers, prefetch=prefetch)
    assert sim.totals.hedges == 0
    assert sim.totals.samples > 0


def test_a_part_is_copied_at_most_once(monkeypatch: pytest.MonkeyPatch) -> None:
    copied: list[tuple[int, int]] = []
    copy = HedgedCopies.copy

    def record(self: HedgedCopies[object], batch: int, part: int) -> None:
        copied.append((batch, part))
        copy(self, batch, part)

    monkeypatch.setattr(HedgedCopies, "copy", record)
    # slow samples common enough that a copy is often slow too and its part stays overdue
    sim, _ = run(tail_reads(slow_share=0.08), hedge=True, workers=8)
    assert len(copied) == sim.totals.hedges > 100
    assert len(set(copied)) == len(copied)
    # every batch is still made once: the second answer of a copied part is dropped
    assert sim.totals.arrived == sim.totals.dispatched - sim.in_flight
    assert sim.totals.samples == sim.totals.consumed * sim.pipeline.batch_size


def test_the_rule_is_the_runtime_s() -> None:
    from drapps.runtime import admission, hedging

    copies: HedgedCopies[str] = HedgedCopies()
    copies.start(3, 1, "w", 0.0, 0.1)
    copies.made(2, 0, copy=False, wall_s=0.05, share=0.1)  # 0.5 s per mean batch of work
    due = max(hedging.HEDGE_MIN_S, hedging.HEDGE_FACTOR * 0.1 * 0.5)
    assert HEDGE_FACTOR == hedging.HEDGE_FACTOR
    assert copies.overdue(3, now=due - 1e-9) == [] and copies.overdue(3, now=due) == [(1, "w")]
    assert list(copies.due_batches(3, waiting=True)) == [3]
    assert list(copies.due_batches(3, waiting=False)) == list(range(3, 3 + hedging.HEDGE_AHEAD))
    assert copies.room(waiting=False) == 0
    assert copies.room(waiting=True) == admission.TASKS_PER_WORKER + 1


def test_runs_and_environment_steps_report_the_copies() -> None:
    from drapps.control.action import NOOP
    from drapps.sim.run import simulate

    run_ = simulate(Scenario(tail_reads()), "static", workers=6, duration=20.0)
    assert run_.hedges > 0 and run_.summary()["hedges_won"] == run_.hedges_won > 0
    pytest.importorskip("gymnasium")
    from drapps.sim.env import PipelineEnv

    env = PipelineEnv(duration=20.0)
    env.reset(seed=0, options={"scenario": Scenario(tail_reads())})
    sent = won = 0
    done = False
    while not done:
        _, _, _, done, info = env.apply(NOOP)
        sent, won = sent + info["hedges"], won + info["hedges_won"]
    assert 0 < won <= sent
    assert isinstance(info["hedges"], int) and isinstance(info["hedges_won"], int)
