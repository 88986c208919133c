"""The default count's choice to make batches in the training process: the rule (from the times
it is given) and the pool engine's moves between its workers and the loop (batches the same,
each once, whenever it moves, and its workers gone while the loop makes them)."""

from __future__ import annotations

import collections
import os
import random
import time
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from helpers import RandomDataset, assert_batches_equal, wait_until

import drapps
from drapps.engines.in_loop import InLoopRule
from drapps.runtime.executor_pool import EVIDENCE

MS = 1e-3


class Clock:
    """Feeds a rule the times of batches: the clock and the workers' making time run on."""

    def __init__(self, rule: InLoopRule) -> None:
        self.rule, self.now, self.made = rule, 0.0, 0.0

    def pool(self, batches: int, *, gap: float, wait: float, make: float) -> list[Any]:
        """``batches`` from the pool, one every ``gap`` s, the loop waiting ``wait`` s for
        each and the workers making each in ``make`` s; the rule's verdicts."""
        verdicts = []
        for _ in range(batches):
            self.now, self.made = self.now + gap, self.made + make
            verdicts.append(self.rule.pool_batch(self.now, wait, self.made))
        return verdicts

    def loop(self, batches: int, *, gap: float, make: float) -> list[Any]:
        """``batches`` made in the loop, one every ``gap`` s, each in ``make`` s."""
        verdicts = []
        for _ in range(batches):
            self.now += gap
            verdicts.append(self.rule.loop_batch(self.now, make))
        return verdicts


def test_the_rule_tries_the_loop_once_it_waits_longer_for_a_batch_than_one_takes_to_make() -> None:
    rule = InLoopRule(warm=2, window=4)
    clock = Clock(rule)
    verdicts = clock.pool(2 + 1 + 4, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)
    assert verdicts == [None] * 6 + ["try"]
    assert rule.state == "trying" and rule.tries == 1
    assert rule.make_s == pytest.approx(0.3 * MS) and rule.pool_s == pytest.approx(1 * MS)
    assert "waited 900 µs" in str(rule.why) and "made in 300 µs" in str(rule.why)


def test_the_rule_leaves_batches_dearer_than_the_wait_with_the_workers() -> None:
    """A loop that waits less for a batch than the workers take to make one gains nothing by
    making it itself: compute-bound, or the workers ahead."""
    rule = InLoopRule(warm=0, window=4)
    clock = Clock(rule)
    assert "try" not in clock.pool(40, gap=10 * MS, wait=0.1 * MS, make=20 * MS)
    assert rule.state == "pool" and rule.why is None


def test_a_try_is_kept_only_for_a_clear_win_and_a_lost_one_backs_off_longer_each_time() -> None:
    rule = InLoopRule(warm=0, window=4, margin=1.15, backoff=8)
    clock = Clock(rule)
    assert clock.pool(5, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)[-1] == "try"
    # 0.9 ms a batch in the loop against 1 ms with workers: under the margin
    assert clock.loop(5, gap=0.9 * MS, make=0.3 * MS)[-1] == "back"
    assert rule.state == "pool" and "workers kept" in str(rule.why)
    # the next try waits out the backoff (8 batches), then a full reading
    verdicts = clock.pool(8 + 5, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)
    assert verdicts.index("try") == 8 + 4
    assert clock.loop(5, gap=0.95 * MS, make=0.3 * MS)[-1] == "back"
    verdicts = clock.pool(16 + 5, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)
    assert verdicts.index("try") == 16 + 4  # doubled
    assert clock.loop(5, gap=0.5 * MS, make=0.3 * MS)[-1] == "keep"
    assert rule.state == "kept" and rule.gain == pytest.approx(2.0)
    assert "(2.0x)" in str(rule.why)


def test_a_trys_first_batches_are_no_reading() -> None:
    """While the workers finish what they hold and exit they take the cores the loop makes
    its first batches on: those are passed over."""
    rule = InLoopRule(warm=3, window=4)
    clock = Clock(rule)
    assert clock.pool(3 + 5, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)[-1] == "try"
    assert clock.loop(3, gap=5 * MS, make=4 * MS) == [None] * 3
    assert clock.loop(4, gap=0.4 * MS, make=0.3 * MS)[-1] == "keep"


def test_kept_in_the_loop_the_workers_come_back_once_batches_grow_dearer() -> None:
    rule = InLoopRule(warm=0, window=4)
    clock = Clock(rule)
    clock.pool(5, gap=1 * MS, wait=0.9 * MS, make=0.3 * MS)
    assert clock.loop(5, gap=0.4 * MS, make=0.3 * MS)[-1] == "keep"
    assert "back" not in clock.loop(20, gap=0.5 * MS, make=0.4 * MS)  # dearer, still ahead
    assert clock.loop(4, gap=2 * MS, make=1.5 * MS)[-1] == "back"  # past 1 ms a batch
    assert rule.state == "pool" and "workers back" in str(rule.why)


def test_an_epoch_start_is_no_reading() -> None:
    rule = InLoopRule(warm=0, window=4)
    clock = Clock(rule)
    clock.pool(3, gap=1 * MS, wait=0.1 * MS, make=0.3 * MS)
    rule.restart()
    clock.now += 5.0  # the next epoch's workers start slowly
    clock.pool(5, gap=1 * MS, wait=0.1 * MS, make=0.3 * MS)
    assert rule.pool_s == pytest.approx(1 * MS)


@pytest.mark.parametrize(
    ("field", "value"), [("warm", -1), ("window", 1), ("margin", 0.5), ("backoff", 0)]
)
def test_the_rule_refuses_bad_settings_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match="InLoopRule needs"):
        InLoopRule(**{field: value})  # type: ignore[arg-type]


# ------------------------------------------------------------------------- the pool engine


class Scripted(InLoopRule):
    """The rule's verdicts at chosen batches (``at``: the number of batches handed over so
    far, pool and loop together, to the verdict then), with what the engine told it."""

    def __init__(self, at: dict[int, str]) -> None:
        super().__init__()
        self.at, self.seen, self.made_totals = at, 0, [0.0]
        self.kinds: list[str] = []

    def pool_batch(self, now: float, waited: float, made_total: float) -> Any:
        assert waited >= 0 and made_total >= self.made_totals[-1]
        self.made_totals.append(made_total)
        return self._verdict("pool")

    def loop_batch(self, now: float, made: float) -> Any:
        assert made > 0
        return self._verdict("loop")

    def _verdict(self, kind: str) -> Any:
        self.seen += 1
        self.kinds.append(kind)
        verdict = self.at.get(self.seen)
        self.state = {"try": "trying", "keep": "kept", "back": "pool"}.get(verdict, self.state)
        if verdict == "try":
            self.why = "scripted try"
        return verdict


def _auto(dataset: Any, **kwargs: Any) -> drapps.Loader:
    return drapps.Loader(dataset, batch_size=4, shuffle=True, seed=5, **kwargs)


def test_batches_moved_between_the_workers_and_the_loop_are_the_same_each_once() -> None:
    """Into the loop after 3 batches, back after 7, into it again after 11 (kept through the
    next epoch): every batch is the one a fixed count of workers makes, with the samples'
    draws from the global generators."""
    data = RandomDataset(64)
    with _auto(data, num_workers=2) as fixed:
        expected = [list(fixed), list(fixed)]
    with _auto(data) as loader:
        rule = Scripted({3: "try", 7: "back", 11: "try"})
        loader._parts.engine._rule = rule
        epochs, executors, workers = [], [], []
        for _ in range(2):
            got = []
            for batch in loader:
                got.append(batch)
                snap = loader.snapshot()
                executors.append(snap.executor)
                workers.append((snap.workers, len(snap.worker_pids)))
            epochs.append(got)
        stats = loader.stats()
    for e in range(2):
        assert_batches_equal(expected[e], epochs[e])
    assert rule.kinds[:12] == ["pool"] * 3 + ["loop"] * 4 + ["pool"] * 4 + ["loop"]
    assert rule.kinds[12:] == ["loop"] * (32 - 12)
    assert executors[3] == "the training process" and workers[3] == (0, 0)
    assert executors[8] != "the training process"
    assert executors[-1] == "the training process" and loader.num_workers == 0
    assert rule.made_totals[-1] > 0  # the workers' making time reached the rule
    assert stats.executor == "the training process" and stats.executor_why == "scripted try"


def test_in_the_loop_the_workers_are_gone_and_come_back_on_the_verdict() -> None:
    data = RandomDataset(200)
    with _auto(data) as loader:
        rule = Scripted({2: "try", 20: "back"})
        loader._parts.engine._rule = rule
        iterator = iter(loader)
        for _ in range(3):
            next(iterator)
        assert wait_until(lambda: not loader.snapshot().worker_pids and not _children(loader))
        for _ in range(20):
            next(iterator)
        assert loader.num_workers > 0
        assert wait_until(lambda: len(loader.snapshot().worker_pids) > 0)
        rest = list(iterator)
    assert 3 + 20 + len(rest) == 50


class Kept:
    """Samples held in memory and returned as they are: views of one tensor's rows."""

    def __init__(self, n: int) -> None:
        self.rows = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


def test_a_batch_made_in_the_loop_is_the_loops_own_as_a_workers_is() -> None:
    """The loop stands in for the workers, whose batches cross a process and are copies: a
    loop that writes into its batch changes no sample of a later epoch. (With
    ``num_workers=0`` it does, as with DataLoader's.)"""
    data = Kept(24)
    rows = data.rows.clone()
    with drapps.Loader(data, batch_size=None, seed=5) as loader:
        loader._parts.engine._rule = Scripted({2: "try"})
        for _ in range(2):
            for row in loader:
                row.add_(100)
        assert loader.num_workers == 0  # in the loop
    assert torch.equal(data.rows, rows)
    with drapps.Loader(data, batch_size=None, num_workers=0) as plain:
        next(iter(plain)).add_(100)
    assert data.rows[0, 0] == 100


def _children(loader: drapps.Loader) -> list[int]:
    return list(loader._parts.engine.dispatcher.pool.pids())


def test_out_of_order_the_workers_come_back_with_the_next_epoch() -> None:
    """With ``in_order=False`` a batch past the loop's may have been handed over already:
    the workers then come back with the next epoch, and no batch is made twice."""
    data = RandomDataset(96)
    with _auto(data, num_workers=2) as fixed:
        expected = [list(fixed), list(fixed)]
    with _auto(data, in_order=False) as loader:
        rule = Scripted({4: "try", 6: "back"})
        loader._parts.engine._rule = rule
        epochs = [list(loader), list(loader)]
    for e in range(2):
        assert sorted(_keys(epochs[e])) == sorted(_keys(expected[e]))
        by_first = {int(b["index"][0]): b for b in expected[e]}
        assert_batches_equal([by_first[int(b["index"][0])] for b in epochs[e]], epochs[e])


def _keys(batches: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in b["index"]) for b in batches]


def test_a_checkpoint_taken_in_the_loop_resumes_the_same() -> None:
    data = RandomDataset(64)
    with _auto(data, num_workers=2) as fixed:
        expected = list(fixed)
    with _auto(data) as loader:
        loader._parts.engine._rule = Scripted({2: "try"})
        iterator = iter(loader)
        head = [next(iterator) for _ in range(6)]
        state = loader.state_dict()
    with _auto(data) as resumed:
        resumed.load_state_dict(state)
        tail = list(resumed)
    assert_batches_equal(expected, head + tail)


@pytest.mark.parametrize(
    "kwargs",
    [{"num_workers": 2}, {"worker_init_fn": abs}, {"defer_after": 0.0}],
    ids=["a fixed count", "a worker_init_fn", "defer_after"],
)
def test_the_loop_is_only_the_default_counts_choice(kwargs: dict[str, Any]) -> None:
    """A fixed count keeps DataLoader's processes; a worker_init_fn may prepare what the
    samples need in a worker; batches filled from made samples are the workers'."""
    with _auto(RandomDataset(16), **kwargs) as loader:
        next(iter(loader))
        assert loader._parts.engine.use_loop(True) is False
        assert loader.num_workers > 0


def test_cheap_batches_by_default_are_a_fixed_counts_wherever_they_were_made() -> None:
    """The rule itself, on a dataset of tensors in memory: whatever it chose, and whenever
    (that is the timing's), the batches are those of a fixed count."""
    data = [torch.full((4,), float(i)) for i in range(4096)]
    with drapps.Loader(data, batch_size=8, shuffle=True, seed=1, num_workers=2) as fixed:
        expected = list(fixed)
    with drapps.Loader(data, batch_size=8, shuffle=True, seed=1) as loader:
        got = list(loader)
    assert_batches_equal(expected, got)


class Paced(RandomDataset):
    """A sample that takes a little while, so the run lasts several telemetry ticks."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        time.sleep(0.002)
        return super().__getitem__(i)


def test_the_report_says_the_training_process_made_the_batches_and_why() -> None:
    with _auto(Paced(200), control_interval=0.05) as loader:
        rule = Scripted({2: "try"})
        loader._parts.engine._rule = rule
        for _ in range(2):
            list(loader)
        report = loader.report()
    assert (
        "Executor: the training process itself (as DataLoader's num_workers=0): scripted try"
        in report
    )


@pytest.mark.parametrize("in_order", [True, False], ids=["in order", "any order"])
def test_resize_brings_the_workers_back_for_good(in_order: bool) -> None:
    """A count the user sets is kept by workers: resize() in the loop brings them back (with
    the next epoch, out of order, where a later batch was handed over), and no try follows."""
    data = RandomDataset(96)
    with _auto(data, num_workers=2) as fixed:
        expected = [list(fixed), list(fixed)]
    with _auto(data, in_order=in_order) as loader:
        engine = loader._parts.engine
        engine._rule = Scripted({3: "try"})
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        assert loader.num_workers == 0
        loader.resize(1)
        epochs = [head + list(iterator), list(loader)]
        assert engine._rule is None and loader.num_workers == 1
        assert wait_until(lambda: len(loader.snapshot().worker_pids) == 1)
    for e in range(2):
        assert sorted(_keys(epochs[e])) == sorted(_keys(expected[e]))
    if in_order:
        assert_batches_equal(expected[0] + expected[1], epochs[0] + epochs[1])


class DiesOnce(RandomDataset):
    """Sample 1 (of the first batch, in order) ends its worker process the first time it is
    made: no batch reaches the loop before the worker died."""

    def __init__(self, n: int, marker: str) -> None:
        super().__init__(n)
        self.marker = marker

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)
        return super().__getitem__(i)


def test_after_a_worker_died_the_batches_stay_with_workers(tmp_path: Any) -> None:
    """The workers made the lost batch again; the loop could not have: no try follows."""
    data = DiesOnce(64, str(tmp_path / "died"))
    with drapps.Loader(data, batch_size=4, shuffle=False, seed=5) as loader:
        rule = Scripted({n: "try" for n in range(1, 33)})
        loader._parts.engine._rule = rule
        got = [list(loader), list(loader)]
        assert loader.stats().worker_restarts >= 1
        assert loader.num_workers > 0
    assert (tmp_path / "died").exists()
    assert "loop" not in rule.kinds
    assert sorted(i for b in got[0] for i in b["index"].tolist()) == list(range(64))


# ------------------------------------------------- samples made unseeded, checked for draws

DRAWS = {
    "python": lambda: random.random(),
    "numpy": lambda: float(np.random.rand()),
    "numpy-normal": lambda: float(np.random.standard_normal()),
    "torch": lambda: float(torch.rand(1)),
}


class LateDraws:
    """Samples drawn from :func:`drapps.sample_rng` alone, except that from index ``at`` on
    they also draw from a global generator (``kind``), which the workers' watch of their
    first samples does not see; every call made in this process is recorded."""

    def __init__(self, n: int, kind: str | None = None, at: int = 0) -> None:
        self.n, self.kind, self.at = n, kind, at
        self.calls: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.calls.append(i)
        sample = {"index": i, "rng": drapps.sample_rng().random(), "drew": 0.0}
        if self.kind is not None and i >= self.at:
            sample["drew"] = DRAWS[self.kind]()
        return sample


def _seeded_then_drawn(loader: drapps.Loader, into_loop_after: int | None) -> tuple[Any, Any]:
    """The batches of an epoch begun with the global generators seeded, moved into the
    loop after ``into_loop_after`` batches, once the workers watched enough samples; and
    the training process's draws after it."""
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    iterator = iter(loader)
    batches = []
    if into_loop_after is not None:
        engine = loader._parts.engine
        engine._rule = Scripted({})
        batches = [next(iterator) for _ in range(into_loop_after)]
        assert wait_until(lambda: engine.dispatcher.pool.watched >= EVIDENCE)
        assert engine.use_loop(True)
    batches += list(iterator)
    return batches, (random.random(), float(np.random.rand()), float(torch.rand(1)))


def _loader(data: Any, **kwargs: Any) -> drapps.Loader:
    return drapps.Loader(data, batch_size=4, seed=5, policy="static", **kwargs)


def test_samples_that_draw_from_no_global_generator_are_made_in_the_loop_unseeded() -> None:
    with _loader(LateDraws(64), num_workers=2) as fixed:
        expected, after = _seeded_then_drawn(fixed, None)
    data = LateDraws(64)
    with _loader(data) as loader:
        got, got_after = _seeded_then_drawn(loader, 4)
        loop = loader._parts.engine._loop
        assert loop._unseeded is not None and not loop.drew  # checked, never reseeded
    assert_batches_equal(expected, got)
    assert got_after == after  # the training loop's own draws are untouched
    assert sorted(data.calls) == list(range(16, 64))  # each made once here


class _Unsendable:
    """Samples of a namedtuple made in the test (the training process cannot read it back
    from a worker, so the default count makes its batches there), which draw from torch's
    global generator."""

    def __init__(self) -> None:
        self.kind = collections.namedtuple("Pair", ["index", "noise"])  # type: ignore[misc]

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return self.kind(i, torch.rand(2))


def test_new_workers_watch_their_own_samples_whatever_the_training_process_watched() -> None:
    """Found by running the suite in another order: a batch the training process made in a
    worker's place was watched there for draws, and every worker forked after it inherited
    that watch: another dataset's draw seen, and nothing left to watch. The loaders after
    it never made batches in the loop unseeded, and said so for a dataset that never drew."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*cannot be sent back from a worker")
        with drapps.Loader(_Unsendable(), batch_size=3, seed=4) as unsendable:
            assert len(list(unsendable)) == 2 and unsendable.stats().workers == 0
    test_samples_that_draw_from_no_global_generator_are_made_in_the_loop_unseeded()


def test_a_sample_that_reads_torchs_seed_without_drawing_reads_its_own() -> None:
    """``torch.initial_seed()`` moves no generator, so no check would see it: torch's is
    seeded per sample in the loop still."""
    DRAWS["torch-seed"] = lambda: float(torch.initial_seed() % 1000)
    try:
        with _loader(LateDraws(64, "torch-seed"), num_workers=2) as fixed:
            expected, after = _seeded_then_drawn(fixed, None)
        with _loader(LateDraws(64, "torch-seed")) as loader:
            got, got_after = _seeded_then_drawn(loader, 4)
            loop = loader._parts.engine._loop
            assert loop._unseeded is not None and not loop.drew
    finally:
        del DRAWS["torch-seed"]
    assert_batches_equal(expected, got)
    assert got_after == after


@pytest.mark.parametrize("kind", sorted(DRAWS))
def test_a_draw_the_workers_did_not_see_is_caught_and_its_batch_made_again_seeded(
    kind: str,
) -> None:
    with _loader(LateDraws(64, kind, at=40), num_workers=2) as fixed:
        expected, after = _seeded_then_drawn(fixed, None)
    data = LateDraws(64, kind, at=40)
    with _loader(data) as loader:
        got, got_after = _seeded_then_drawn(loader, 4)
        loop = loader._parts.engine._loop
        # torch's generator is seeded per sample still: its draws need no second making
        caught = kind != "torch"
        assert loop.drew is caught and (loop._unseeded is None) is caught
    assert_batches_equal(expected, got)
    assert got_after == after
    twice = sorted(i for i, n in Counter(data.calls).items() if n == 2)
    assert twice == ([40, 41, 42, 43] if caught else [])
    assert sorted(set(data.calls)) == list(range(16, 64))


def test_a_collate_fn_that_draws_is_caught_as_well() -> None:
    def collate(samples: list[Any]) -> Any:
        noise = (random.random(), float(torch.rand(1)))
        return {**torch.utils.data.default_collate(samples), "noise": noise}

    with _loader(LateDraws(64), num_workers=2, collate_fn=collate) as fixed:
        expected, after = _seeded_then_drawn(fixed, None)
    with _loader(LateDraws(64), collate_fn=collate) as loader:
        got, got_after = _seeded_then_drawn(loader, 4)
        assert loader._parts.engine._loop.drew
    assert_batches_equal(expected, got)
    assert got_after == after


def test_samples_seen_drawing_are_reseeded_in_the_loop_from_the_start() -> None:
    with _loader(LateDraws(64, "torch"), num_workers=2) as fixed:
        expected, _ = _seeded_then_drawn(fixed, None)
    data = LateDraws(64, "torch")
    with _loader(data) as loader:
        got, _ = _seeded_then_drawn(loader, 4)
        loop = loader._parts.engine._loop
        assert loop._unseeded is None and not loop.drew
    assert_batches_equal(expected, got)
    assert sorted(data.calls) == list(range(16, 64))
