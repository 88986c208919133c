"""The learned policy: NumPy inference, files, the shipped policy, and core-only installs."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import state

from drapps.control.action import Action
from drapps.control.policy import make_policy
from drapps.control.rl import MlpPolicy, may_grow, shipped_path
from drapps.control.state import State


def _random_policy(seed: int = 0) -> MlpPolicy:
    rng = np.random.default_rng(seed)
    sizes = [len(State.FEATURES), 16, len(Action.space())]
    return MlpPolicy(
        [(rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in itertools.pairwise(sizes)],
        {"note": "random"},
    )


def test_scores_are_a_tanh_mlp() -> None:
    policy = _random_policy()
    x = state().vector()
    (w0, b0), (w1, b1) = policy.layers
    assert np.allclose(policy.scores(x), np.tanh(x @ w0 + b0) @ w1 + b1, atol=1e-5)
    assert policy.scores(np.stack([x, x])).shape == (2, 9)  # batches too
    action, best = policy.decide(state()), Action.space()[int(np.argmax(policy.scores(x)))]
    assert (action.workers, action.prefetch) == (best.workers, best.prefetch)


def test_save_load_round_trip(tmp_path: Path) -> None:
    policy = _random_policy(1)
    policy.save(tmp_path / "p.npz")
    loaded = MlpPolicy.load(tmp_path / "p.npz")
    assert loaded.meta == {"note": "random"}
    for (a, b), (c, d) in zip(policy.layers, loaded.layers, strict=True):
        assert np.array_equal(a, c) and np.array_equal(b, d)
    for k in range(20):
        s = state(wait_fraction=k / 20, idle_cores=k % 8, workers=1 + k % 8)
        assert loaded.decide(s) == policy.decide(s)


def test_files_from_another_feature_set_or_not_policies_are_refused(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a drapps policy file"):
        MlpPolicy.load(tmp_path / "junk.npz")
    policy = _random_policy()
    policy.save(tmp_path / "p.npz")
    data = dict(np.load(tmp_path / "p.npz"))
    data["header"] = np.asarray(str(data["header"]).replace("cpu_util", "cpu_load"))
    np.savez(tmp_path / "old.npz", **data)
    with pytest.raises(ValueError, match="trained on features"):
        MlpPolicy.load(tmp_path / "old.npz")
    width = len(State.features())
    with pytest.raises(ValueError, match=rf"layer 0: expected a \({width}, n\) weight"):
        MlpPolicy([(np.zeros((3, 9)), np.zeros(9))])
    with pytest.raises(ValueError, match="9 outputs"):
        MlpPolicy([(np.zeros((width, 4)), np.zeros(4))])


def test_a_policy_reads_the_features_its_file_names(tmp_path: Path) -> None:
    """A file trained before a feature existed (without ``busy_share``) loads and reads its
    own list, by name, in its order; the same weights over another order decide by that."""
    older = tuple(f for f in State.FEATURES if f != "busy_share")
    rng = np.random.default_rng(3)
    layers = [(rng.normal(size=(len(older), 8)), rng.normal(size=8)),
              (rng.normal(size=(8, 9)), rng.normal(size=9))]  # fmt: skip
    MlpPolicy(layers, features=older).save(tmp_path / "older.npz")
    loaded = MlpPolicy.load(tmp_path / "older.npz")
    assert loaded.features == older
    s = state(wait_fraction=0.4, idle_cores=1.0, in_flight=3.0, workers=4)
    assert np.array_equal(s.vector(features=older), np.delete(s.vector(), -1))
    assert loaded.decide(s) == MlpPolicy(layers, features=older).decide(s)
    reordered = older[::-1]
    flipped = [(layers[0][0][::-1], layers[0][1]), layers[1]]
    assert MlpPolicy(flipped, features=reordered).decide(s) == loaded.decide(s)
    with pytest.raises(ValueError, match=r"features \['cpu_load'\] are not State features"):
        MlpPolicy(layers, features=("cpu_load", *older[1:]))


def test_the_shipped_policy_loads_and_decides() -> None:
    assert shipped_path().is_file()
    policy = make_policy("rl")
    assert isinstance(policy, MlpPolicy)
    assert policy.meta.get("learner") in ("ppo", "ddqn", "rollout")
    states = [state(wait_fraction=w, idle_cores=i) for w in (0.0, 0.5) for i in (0.0, 6.0)]
    for s in states:
        assert isinstance(policy.decide(s), Action)
    # Its speed (about 25 us a decision) is measured in docs/sim.md, never asserted here.


def test_the_shipped_policy_runs_without_the_rl_extra() -> None:
    # A core-only install: gymnasium and stable-baselines3 cannot be imported.
    code = """
import sys
sys.modules["gymnasium"] = None
sys.modules["stable_baselines3"] = None
import torch
import drapps
data = list(range(64))
kw = dict(batch_size=4, workers="auto", policy="rl", control_interval=0.05)
with drapps.Loader(data, **kw) as loader:
    assert sum(len(b) for b in loader) == 64
from drapps.control.policy import make_policy
assert type(make_policy("rl")).__name__ == "MlpPolicy"
assert "gymnasium" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "content",
    [b"", b"PK\x03\x04truncated", None],
    ids=["empty", "truncated", "wrong-shapes"],
)
def test_malformed_policy_files_raise_value_errors(content: bytes | None, tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    if content is None:  # a real npz whose layers do not chain
        good = _random_policy()
        good.save(path)
        with np.load(path) as data:
            arrays = dict(data)
        arrays["w0"] = np.zeros((3, 5), np.float32)
        np.savez(path, **arrays)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.npz"):
        MlpPolicy.load(path)
    done = subprocess.run(
        [sys.executable, "-m", "drapps.cli", "simulate", "--scenario", "cpu-bound",
         "--policy", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "bad.npz" in done.stderr


def test_a_policy_for_the_split_reads_the_device_stage_and_moves_the_cut(tmp_path: Path) -> None:
    knobs = ("workers", "prefetch", "split")
    rng = np.random.default_rng(5)
    sizes = [len(State.features(knobs)), 8, len(Action.space(knobs))]
    assert sizes[0] == len(State.FEATURES) + 1 and sizes[-1] == 27
    policy = MlpPolicy(
        [(rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in itertools.pairwise(sizes)],
        knobs=knobs,
    )
    policy.save(tmp_path / "split.npz")
    loaded = MlpPolicy.load(tmp_path / "split.npz")
    assert loaded.knobs == knobs
    moves = {loaded.decide(state(device_stage_share=k / 10, wait_fraction=k / 10)).split
             for k in range(11)}  # fmt: skip
    assert moves <= {-1, 0, 1}
    s = state(split=3, device_stage_share=0.3)
    assert loaded.decide(s) == policy.decide(s)
    width = len(State.features())
    with pytest.raises(ValueError, match=rf"layer 0: expected a \({width}, n\) weight"):
        MlpPolicy(policy.layers)  # the split policy's layers, for the default knobs
    assert Action.space(("split",)) == (Action(split=-1), Action(), Action(split=1))
    with pytest.raises(ValueError, match=r"knobs must be distinct names from \['workers', "):
        Action.space(("threads",))


def test_a_continuous_policy_gives_one_output_per_knob_and_round_trips(tmp_path: Path) -> None:
    """SAC's shape: tanh(outputs) in [-1, 1], a step knob thresholded at 1/3, the offload
    share set to (value + 1) / 2."""
    knobs = ("workers", "prefetch", "offload")
    rng = np.random.default_rng(2)
    sizes = [len(State.features(knobs)), 8, len(knobs)]
    layers = [(rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in itertools.pairwise(sizes)]
    policy = MlpPolicy(layers, knobs=knobs, continuous=True)
    for k in range(20):
        s = state(offload=0.5, wait_fraction=k / 20, workers=1 + k % 8)
        values = np.tanh(policy.scores(s.vector(knobs)))
        action = policy.decide(s)
        assert action.workers == (0 if abs(values[0]) <= 1 / 3 else int(np.sign(values[0])))
        assert action.other["offload"] == pytest.approx((values[2] + 1) / 2, abs=1e-4)
        assert "offload=" in action.reason or action.is_noop
    policy.save(tmp_path / "sac.npz")
    loaded = MlpPolicy.load(tmp_path / "sac.npz")
    assert loaded.continuous and loaded.knobs == knobs
    s = state(offload=0.25)
    assert loaded.decide(s) == policy.decide(s)
    with pytest.raises(ValueError, match="the last layer must have 3 outputs, got 27"):
        MlpPolicy([(np.zeros((sizes[0], 27)), np.zeros(27))], knobs=knobs, continuous=True)
    data = dict(np.load(tmp_path / "sac.npz"))
    data["header"] = np.asarray(
        str(data["header"]).replace('"continuous": true', '"continuous": 1')
    )
    np.savez(tmp_path / "odd.npz", **data)
    with pytest.raises(ValueError, match="'continuous' must be true or false, got 1"):
        MlpPolicy.load(tmp_path / "odd.npz")


def test_a_policy_over_the_lookahead_reads_its_features_moves_it_and_round_trips(
    tmp_path: Path,
) -> None:
    """The lookahead is a step knob like the others (+1 doubles it, -1 halves it): a policy
    trained over it reads two more features and names its moves; a continuous one too."""
    knobs = ("workers", "prefetch", "lookahead")
    assert State.features(knobs)[-2:] == State.LOOKAHEAD_FEATURES
    s = state(prefetch=4, lookahead=32, sample_tail=100.0)
    assert s.vector(knobs)[-2:] == pytest.approx([1.0, 1.0])
    assert state(prefetch=4, sample_tail=1.0).vector(knobs)[-2:] == pytest.approx([0.25, 0.0])
    space = Action.space(knobs)
    assert len(space) == 27 and Action(other={"lookahead": 1}) in space
    assert Action(other={"lookahead": -1}).describe(knobs) == "workers+0 prefetch+0 lookahead-1"
    rng = np.random.default_rng(4)
    for continuous, outputs in ((False, 27), (True, 3)):
        sizes = [len(State.features(knobs)), 8, outputs]
        layers = [
            (rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in itertools.pairwise(sizes)
        ]
        policy = MlpPolicy(layers, knobs=knobs, continuous=continuous)
        moves = {policy.decide(state(lookahead=8, sample_tail=t, wait_fraction=t / 100)).step(
            "lookahead") for t in range(1, 100, 7)}  # fmt: skip
        assert moves <= {-1, 0, 1}
        policy.save(tmp_path / "lookahead.npz")
        loaded = MlpPolicy.load(tmp_path / "lookahead.npz")
        assert loaded.knobs == knobs and loaded.continuous is continuous
        assert loaded.decide(s) == policy.decide(s)


def test_knobs_the_policy_was_not_trained_on_are_moved_by_the_heuristics_rules() -> None:
    """The shipped policy moves workers and prefetch; on a pipeline with a split and an
    offload share, the heuristic's rules move those (and only those), so no knob the pipeline
    has sits still for want of a policy trained on it."""
    from drapps.sim.families import draw
    from drapps.sim.run import simulate

    policy = MlpPolicy.shipped()
    scenario = draw("device-offload", np.random.default_rng(3))
    run = simulate(scenario, policy, duration=40.0, seed=1)
    splits = {tick.applied["split"] for tick in run.ticks}
    assert len(splits) > 1, splits  # the rules moved the cut
    ruled = [t.action for t in run.ticks if t.action.split]
    assert all("rule: " in a.reason for a in ruled)
    bare = MlpPolicy.shipped()  # its own knobs: the network's choice, on every tick it acts
    for tick in run.ticks:
        if tick.action.reason.startswith("learned policy: holding"):
            continue  # an epoch began (or nothing was measured): it holds, and says so
        own = bare.choose(tick.state.vector(features=bare.features))
        assert (tick.action.workers, tick.action.prefetch) == (own.workers, own.prefetch)
    # and on the knobs it knows, it acts exactly as before
    policy.bind(("workers", "prefetch"))
    fresh = MlpPolicy.shipped()
    for k in range(10):
        s = state(wait_fraction=k / 10, workers=1 + k % 4)
        assert policy.decide(s) == fresh.decide(s)


def test_a_policy_over_every_knob_steers_a_simulated_cache_and_priority(tmp_path: Path) -> None:
    """The codec and the priority are step knobs like the others: a policy trained over
    them reads their features, and in the simulator its codec steps pick the cache's codecs
    by size and its priority step lowers the workers' priority, through the same Controller;
    on a pipeline without a cache the codec's moves are dropped, not refused."""
    from drapps.sim.families import draw
    from drapps.sim.run import simulate

    knobs = ("workers", "prefetch", "codec", "priority")
    assert State.features(knobs)[-7:] == State.CODEC_FEATURES + State.PRIORITY_FEATURES
    profile = {"raw": [4000.0, 0.0, 0.1], "zstd": [1000.0, 2.0, 1.0]}
    s = state(codec="zstd", cache_profile=profile, cache_budget_bytes=2000, cache_samples=4,
              priority="low")  # fmt: skip
    assert s.vector(knobs)[-3:] == pytest.approx([0.25, 0.5, 1.0])
    assert len(Action.space(knobs)) == 81
    width = len(State.features(knobs))
    index = Action.space(knobs).index(Action.of_steps({"codec": 1, "priority": -1}))
    bias = np.full(81, -1.0, dtype=np.float32)
    bias[index] = 1.0  # always: a smaller codec, and the workers' priority lowered
    policy = MlpPolicy([(np.zeros((width, 81), np.float32), bias)], knobs=knobs)
    policy.save(tmp_path / "knobs.npz")
    loaded = MlpPolicy.load(tmp_path / "knobs.npz")
    scenario = draw("cached-epochs", np.random.default_rng(1), 20.0)
    cache = scenario.pipeline.cache
    assert cache is not None
    smallest = min(cache.codecs, key=lambda c: c.stored_bytes).name
    run = simulate(scenario, loaded, duration=20.0)
    assert run.ticks[-1].applied["codec"] == smallest
    assert run.ticks[-1].applied["priority"] == "low"
    uncached = simulate(draw("cpu-bound", np.random.default_rng(1), 5.0), loaded, duration=5.0)
    assert "codec" not in uncached.ticks[-1].applied


def _always_growing() -> MlpPolicy:
    """A learned policy whose network adds a worker on every tick it acts: what it holds
    through is the policy's rule, not its weights."""
    actions = Action.space()
    bias = np.zeros(len(actions), np.float32)
    bias[actions.index(Action(workers=1))] = 1.0
    return MlpPolicy([(np.zeros((len(State.FEATURES), len(actions)), np.float32), bias)])


def vm_tick(**fields: object) -> State:
    """A tick of 4 workers (at most 8) on the project's 2-core, 24 GiB VM."""
    machine = {"cores": 2, "rss_bytes": 1 * 2**30, "available_bytes": 23 * 2**30,
               "total_bytes": 24 * 2**30, "workers": 4, "max_workers": 8}  # fmt: skip
    return state(**{**machine, **fields})


def test_the_shipped_policy_does_not_grow_the_pool_as_an_epoch_drains() -> None:
    # A tick near an epoch's end on the 2-core VM (a sleeping step, CPU to spare): five
    # batches ready of a prefetch depth of ten, and five left in the epoch. Read against the
    # depth alone the queue looks half empty while the loop is fed, which the policy (trained
    # where epochs do not end) read as the workers falling behind: one worker more at every
    # epoch's end, and 8 workers where 2 fed the loop.
    draining = vm_tick(
        cpu_util=0.19, idle_cores=1.62, main_cpu=0.04, workers_cpu=0.36, queue_batches=5,
        prefetch=10, wait_fraction=0.0, latency_p50_s=0.032, latency_p99_s=0.034,
        throughput=380.0,
    )  # fmt: skip
    policy = make_policy("rl")
    policy.decide(replace(draining, epoch_left=6))  # the tick before, in the same epoch
    held = policy.decide(replace(draining, epoch_left=5))
    assert held.workers <= 0 and "epoch begins" not in held.reason


def test_the_learned_policy_holds_through_ticks_that_show_only_the_pipeline_starting() -> None:
    # A tick in which an epoch began: the loop waited on an empty queue for the new epoch's
    # first batches, which more workers do not make sooner. The policy holds there, and reads
    # the next tick as it would any other.
    begun = vm_tick(
        cpu_util=0.3, idle_cores=1.4, main_cpu=0.0, workers_cpu=0.55, queue_batches=0,
        prefetch=8, wait_fraction=0.25, latency_p50_s=0.04, latency_p99_s=0.05,
        throughput=400.0,
    )  # fmt: skip
    policy = _always_growing()
    assert policy.decide(begun).workers == 1  # nothing known of epochs: its network's choice
    first = policy.decide(replace(begun, epoch_left=78))  # the first tick of the first epoch
    assert first.is_noop and "epoch begins" in first.reason
    policy.decide(replace(begun, epoch_left=3, queue_batches=3, wait_fraction=0.0))
    held = policy.decide(replace(begun, epoch_left=75))  # 75 left after 3: a new epoch
    assert held.is_noop and "epoch begins" in held.reason
    assert policy.decide(replace(begun, epoch_left=74)).workers == 1  # a wait mid-epoch
    # Its last batch delivered, the loop between epochs: nothing is left to make.
    done = policy.decide(replace(begun, epoch_left=0, queue_batches=0, wait_fraction=0.0))
    assert done.is_noop and "all delivered" in done.reason
    # Before the first batch: nothing delivered, nothing waited for.
    assert _always_growing().decide(replace(begun, throughput=0.0, wait_fraction=0.0)).is_noop


def test_a_policy_decides_once_per_the_interval_it_was_trained_at() -> None:
    # Trained at one decision per 0.5 s, on a loader ticking every 0.25 s: a step every other
    # tick, as in training, and an epoch's start held for 0.5 s, the one tick it was there.
    policy = _always_growing()
    assert policy.interval == 0.5  # a file that records no interval: the training default
    tick = vm_tick(wait_fraction=0.3, queue_batches=0, prefetch=8, throughput=400.0)
    moves = [policy.decide(replace(tick, t=0.25 * k)).workers for k in range(1, 6)]
    assert moves == [1, 0, 1, 0, 1]
    held = policy.decide(replace(tick, t=1.5 + 0.2))  # 0.45 s after its last: still between
    assert held.is_noop and "between decisions (one per 0.5 s)" in held.reason
    begun = [policy.decide(replace(tick, t=t, epoch_left=e)) for t, e in ((2.0, 60), (2.25, 55))]
    assert [a.is_noop for a in begun] == [True, True] and "epoch begins" in begun[0].reason
    assert policy.decide(replace(tick, t=2.5, epoch_left=50)).workers == 1
    assert policy.decide(replace(tick, t=0.1)).workers == 1  # earlier: a new run, afresh
    fast = MlpPolicy(policy.layers, {"interval": 0.25})  # trained at the loader's tick
    assert [fast.decide(replace(tick, t=0.25 * k)).workers for k in range(1, 4)] == [1, 1, 1]
    for bad in (0, -0.5, "0.5", None):
        with pytest.raises(ValueError, match=r"meta\['interval'\] must be seconds > 0"):
            MlpPolicy(policy.layers, {"interval": bad})


def test_a_learned_policy_adds_no_worker_while_the_loop_is_fed_and_its_workers_sit_idle() -> None:
    # A tick recorded on the 2-core VM as the training step fell from 80 to 20 ms: the loop
    # did not wait, two batches of four were ready, and the two workers were at work 77% of
    # the tick. The shipped network added a third worker there, shed it a second later, and
    # the third process set the run's peak memory; in the simulator it was worth nothing.
    fed = vm_tick(
        workers=2, prefetch=4, queue_batches=2, in_flight=1.54, wait_fraction=0.0,
        cpu_util=0.75, idle_cores=0.49, main_cpu=0.04, workers_cpu=1.51,
        latency_p50_s=0.032, latency_p99_s=0.04, throughput=1653.0,
    )  # fmt: skip
    assert not may_grow(fed)
    shipped = make_policy("rl")
    assert shipped.decide(fed).workers <= 0
    actions = Action.space()
    bias = np.zeros(len(actions), np.float32)
    bias[actions.index(Action(workers=1))] = 2.0  # its network's choice
    bias[actions.index(Action(prefetch=1))] = 1.0  # the best of the rest
    grower = MlpPolicy([(np.zeros((len(State.FEATURES), len(actions)), np.float32), bias)])
    held = grower.decide(fed)
    assert (held.workers, held.prefetch) == (0, 1)
    assert "no worker added: the loop is fed and its workers 77% at work" in held.reason
    # The loop waited, or every worker was at work, or batch times came in bursts (a full
    # queue may drain in one), or nothing says: it grows.
    for tick in (
        replace(fed, wait_fraction=0.05),
        replace(fed, in_flight=2.0),
        replace(fed, latency_p99_s=0.09),
        replace(fed, in_flight=None),
    ):
        assert may_grow(tick)
        assert grower.decide(replace(tick, t=tick.t + 1.0)).workers == 1
    # A continuous policy's worker step is dropped, its other knobs kept.
    both_up = MlpPolicy(
        [(np.zeros((len(State.FEATURES), 2), np.float32), np.full(2, 3.0, np.float32))],
        continuous=True,
    )
    moved = both_up.decide(fed)
    assert (moved.workers, moved.prefetch) == (0, 1)
    assert both_up.decide(replace(fed, t=1.0, wait_fraction=0.3)).workers == 1
