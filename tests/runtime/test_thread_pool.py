"""Thread workers (``backend="thread"``): the process pool's guarantees, from threads of the
training process, and processes kept for a dataset threads cannot make deterministic."""

from __future__ import annotations

import random
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info  # bound before any thread pool exists

import drapps


class Seeded:
    """Samples that draw from their own generator and say which worker made them."""

    def __init__(self, n: int = 40, fail_at: int | None = None, sleep_s: float = 0.0) -> None:
        self.n, self.fail_at, self.sleep_s = n, fail_at, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i == self.fail_at:
            raise ValueError(f"sample {i} is broken")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        info = get_worker_info()
        return {
            "index": torch.tensor(i),
            "draw": torch.tensor(drapps.sample_rng().random()),
            "worker": torch.tensor(-1 if info is None else info.id),
            "workers": torch.tensor(-1 if info is None else info.num_workers),
        }


class DrawsGlobally(Seeded):
    def __init__(self, rng: str, odd_only: bool = False) -> None:
        super().__init__(12)
        self.rng, self.odd_only = rng, odd_only

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(i)
        if self.odd_only and i % 2 == 0:
            return sample
        draws = {
            "random": random.random,
            "numpy": lambda: float(np.random.rand()),
            "torch": lambda: float(torch.rand(1)[0]),
        }
        sample["global"] = torch.tensor(draws[self.rng]())
        return sample


def _batches(loader: drapps.Loader, epochs: int = 2) -> list[list[tuple[int, float]]]:
    out = []
    for _ in range(epochs):
        out += [list(zip(b["index"].tolist(), b["draw"].tolist(), strict=True)) for b in loader]
    return out


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("drapps-worker")]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_threads_give_the_batches_processes_and_the_training_process_give(workers: int) -> None:
    kwargs = {"batch_size": 3, "shuffle": True, "seed": 5}
    with drapps.Loader(Seeded(), num_workers=0, **kwargs) as inline:
        expected = _batches(inline)
    with drapps.Loader(Seeded(), num_workers=workers, backend="thread", **kwargs) as threads:
        assert _batches(threads) == expected
        stats = threads.stats()
        assert stats.executor == "threads"
        assert stats.worker_pids == ()  # no process was started
    with drapps.Loader(Seeded(), num_workers=2, backend="process", **kwargs) as processes:
        assert _batches(processes) == expected
        assert processes.stats().executor == "processes"
    assert not _threads()


class Kept:
    """A dataset that holds its samples in memory and returns them as they are: rows of one
    tensor (views of it) and a list per sample."""

    def __init__(self, n: int = 12) -> None:
        self.rows = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        self.lists = [[i] for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, list[int]]:
        return self.rows[i], self.lists[i]


def _keep(batch: Any) -> Any:
    return batch


@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": None}, {"batch_size": 3, "collate_fn": _keep}],
    ids=["batch_size=None", "a collate_fn that keeps samples"],
)
def test_writing_into_a_batch_from_a_thread_changes_no_sample(kwargs: dict[str, Any]) -> None:
    """As from DataLoader's worker processes: the loop's batch is its own memory, so a loop
    that writes into it (a normalization in place) changes no sample of a later epoch."""
    data = Kept()
    rows, lists = data.rows.clone(), [list(x) for x in data.lists]
    with drapps.Loader(data, num_workers=2, backend="thread", **kwargs) as loader:
        for _ in range(2):
            for batch in loader:
                samples = [batch] if kwargs["batch_size"] is None else batch
                for row, labels in samples:
                    row.add_(100)
                    labels.append(-1)
        assert loader.stats().executor == "threads"
    assert torch.equal(data.rows, rows)
    assert data.lists == lists


def test_each_thread_is_a_worker_to_get_worker_info_and_the_training_loop_is_not() -> None:
    with drapps.Loader(Seeded(), batch_size=4, num_workers=3, backend="thread") as loader:
        batches = list(loader)
        assert get_worker_info() is None and torch.utils.data.get_worker_info() is None
    workers = {int(w) for b in batches for w in b["worker"]}
    assert workers <= {0, 1, 2} and workers
    assert {int(n) for b in batches for n in b["workers"]} == {3}


@pytest.mark.parametrize("rng", ["random", "numpy", "torch"])
def test_a_dataset_that_draws_from_a_global_generator_keeps_processes_and_says_why(
    rng: str,
) -> None:
    kwargs = {"batch_size": 3, "seed": 1, "num_workers": 2}
    with pytest.warns(UserWarning, match=r"backend='thread'.*draws from .*runs? as processes"):
        loader = drapps.Loader(DrawsGlobally(rng), backend="thread", **kwargs)
    with loader, drapps.Loader(DrawsGlobally(rng), **kwargs) as processes:
        got = [b["global"].tolist() for b in loader]
        assert got == [b["global"].tolist() for b in processes]
        stats = loader.stats()
        assert stats.executor == "processes"
        assert "threads were asked for" in (stats.executor_why or "")


def test_a_dataset_whose_odd_samples_draw_is_seen_too() -> None:
    with pytest.warns(UserWarning, match="draws from torch's default generator"):
        drapps.Loader(
            DrawsGlobally("torch", odd_only=True), batch_size=2, num_workers=2, backend="thread"
        ).close()


class Asked(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples named by string keys (a dict, as a dataset of files by name is); records every
    key it is asked for, as it was given."""

    def __init__(self, names: list[str]) -> None:
        self.samples = {name: i for i, name in enumerate(names)}
        self.asked: list[Any] = []

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: Any) -> int:
        self.asked.append(key)
        if isinstance(key, tuple):  # (name, version)
            key = key[0]
        return self.samples[key if isinstance(key, str) else f"f{int(key)}"]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"sampler": ["f3", "f1", "f0", "f2"], "batch_size": 2}, id="names"),
        pytest.param({"sampler": [("f3", 1), ("f0", 1)], "batch_size": 2}, id="tuple-keys"),
        pytest.param({"batch_sampler": [["f2", "f0"], ["f3", "f1"]]}, id="batches-of-names"),
        pytest.param({"sampler": torch.tensor([3, 1, 0, 2], dtype=torch.int32)}, id="tensor"),
        pytest.param({"sampler": np.array([3, 1, 0, 2], dtype=np.int16)}, id="array"),
    ],
)
def test_the_dataset_is_asked_only_for_keys_its_sampler_gives(kwargs: dict[str, Any]) -> None:
    """Looking for draws before the threads start makes samples of the sampler's own keys,
    where it holds them, not of ints the dataset may not take (DataLoader asks for no other)."""
    dataset = Asked([f"f{i}" for i in range(4)])
    given = kwargs.get("sampler", kwargs.get("batch_sampler"))
    keys = [k for b in given for k in b] if "batch_sampler" in kwargs else list(given)
    with drapps.Loader(dataset, num_workers=2, backend="thread", **kwargs) as loader:
        assert loader.stats().executor == "threads"
        expected = sorted(Asked([f"f{i}" for i in range(4)])[k] for k in keys)
        assert sorted(int(x) for b in loader for x in b) == expected
    assert {(type(k), getattr(k, "dtype", None)) for k in dataset.asked} == {
        (type(k), getattr(k, "dtype", None)) for k in keys
    }

    def plain(key: Any) -> Any:
        return key if isinstance(key, str | tuple) else int(key)

    assert {plain(k) for k in dataset.asked} <= {plain(k) for k in keys}


def test_looking_for_draws_leaves_the_callers_generators_as_they_were() -> None:
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    expected = torch.rand(2), random.random(), np.random.rand()
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        drapps.Loader(DrawsGlobally("torch"), batch_size=2, num_workers=2, backend="thread").close()
        drapps.Loader(Seeded(), batch_size=2, num_workers=2, backend="thread").close()
    assert torch.equal(torch.rand(2), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_a_worker_init_fn_keeps_processes() -> None:
    with pytest.warns(UserWarning, match="worker_init_fn"):
        loader = drapps.Loader(
            Seeded(), batch_size=4, num_workers=2, backend="thread", worker_init_fn=print
        )
    with loader:
        assert len(list(loader)) == 10
        assert loader.stats().executor == "processes"


def test_an_iterable_dataset_is_refused_by_name() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match=r"backend='thread' needs a map-style dataset.*Stream"):
        drapps.Loader(Stream(), num_workers=2, backend="thread")


def test_a_failing_sample_is_named_and_skipping_it_loses_nothing_else() -> None:
    with drapps.Loader(Seeded(fail_at=7), batch_size=4, num_workers=2, backend="thread") as loader:
        with pytest.raises(ValueError, match="sample 7 is broken") as caught:
            list(loader)
        assert "7" in str(caught.value)
    with drapps.Loader(
        Seeded(fail_at=7), batch_size=4, num_workers=2, backend="thread", on_error="skip"
    ) as loader:
        seen = sorted(int(i) for b in loader for i in b["index"])
    assert seen == [i for i in range(40) if i != 7]
    assert not _threads()


def test_resize_and_resume_lose_and_repeat_nothing() -> None:
    kwargs = {"batch_size": 2, "shuffle": True, "seed": 9, "backend": "thread"}
    with drapps.Loader(Seeded(), num_workers=0, seed=9, batch_size=2, shuffle=True) as inline:
        expected = [b["index"].tolist() for b in inline]
    with drapps.Loader(Seeded(sleep_s=0.002), num_workers=1, **kwargs) as loader:
        it = iter(loader)
        got = [next(it)["index"].tolist() for _ in range(5)]
        loader.resize(3)
        got += [next(it)["index"].tolist() for _ in range(5)]
        state = loader.state_dict()
    torch.manual_seed(123)  # another process's torch generator
    with drapps.Loader(Seeded(), num_workers=2, **kwargs) as resumed:
        resumed.load_state_dict(state)
        got += [b["index"].tolist() for b in resumed]
    assert got == expected


def test_a_thread_stuck_past_the_timeout_is_replaced_and_its_batch_made_once() -> None:
    class StuckOnce(Seeded):
        stuck = threading.Event()

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            if i == 5 and not self.stuck.is_set():
                self.stuck.set()
                time.sleep(3.0)
            return super().__getitem__(i)

    with drapps.Loader(
        StuckOnce(20), batch_size=2, num_workers=2, backend="thread", timeout=1.0
    ) as loader:
        seen = [int(i) for b in loader for i in b["index"]]
    assert seen == list(range(20))


def test_the_report_says_threads_ran_and_why() -> None:
    with drapps.Loader(
        Seeded(200, sleep_s=0.002), batch_size=4, num_workers=2, backend="thread",
        control_interval=0.05,
    ) as loader:  # fmt: skip
        for _ in range(3):
            list(loader)
        report = loader.report()
    assert "Executor: threads of the training process, asked for (backend='thread')" in report
    assert "each a thread of the training process" in report


def test_the_sample_cache_keeps_processes() -> None:
    """Its handles are one per worker process: asked for with threads, it is refused by name;
    under cache="auto" the threads run without it."""
    with pytest.raises(ValueError, match=r"cache: .*backend='thread'"):
        drapps.Loader(Seeded(), num_workers=2, backend="thread", cache=drapps.Cache())

    class Deterministic(Seeded):
        def cache_fingerprint(self) -> str:
            return "seeded-40"

    with drapps.Loader(
        Deterministic(), batch_size=4, num_workers=2, backend="thread", seed=0
    ) as loader:
        assert len(list(loader)) == 10
        stats = loader.stats()
        assert stats.executor == "threads" and stats.cache is None


def test_the_report_says_where_auto_starts_and_a_fixed_count_stays() -> None:
    """Under workers="auto" the report says the processes are where the controller starts,
    free to move to threads; a fixed count's are DataLoader's default; a reason, where there
    is one, is said either way."""
    from drapps.telemetry._sections import executor_story

    assert executor_story({"executor": "processes", "executor_choice": True}) == [
        "Executor: worker processes, where workers='auto' starts; it moves them to threads "
        "where it measures threads ahead."
    ]
    assert executor_story({"executor": "processes"}) == [
        "Executor: worker processes (the default)."
    ]
    why = "threads not tried: the dataset draws from random, which threads share"
    said = executor_story({"executor": "processes", "executor_why": why, "executor_choice": True})
    assert said == [f"Executor: worker processes: {why}."]
