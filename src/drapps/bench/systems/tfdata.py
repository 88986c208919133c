"""``tf-autotune``: the workload's tf.data pipeline with AUTOTUNE parallelism and prefetch;
``tf-autotune-cache``: the same with ``.cache()`` after its deterministic part."""

from __future__ import annotations

import importlib.util
from collections.abc import Generator, Iterator
from typing import Any

import torch

from drapps._optional import install_hint, require
from drapps.bench.systems._base import Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload


class _TfSource(Source):
    def __init__(self, dataset: Any) -> None:
        self._batches: Any = dataset.as_numpy_iterator()
        self._it = self._torch_batches()

    def _torch_batches(self) -> Generator[Any, None, None]:
        for x, y in self._batches:
            yield torch.from_numpy(x), torch.from_numpy(y)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def workers(self) -> Workers:
        return "AUTOTUNE"

    def close(self) -> None:
        self._it.close()
        self._batches = None  # drops tf's iterator; its threads stop with it


class TfDataSystem(System):
    name = "tf-autotune"
    summary = (
        "tf.data: map(num_parallel_calls=AUTOTUNE) + prefetch(AUTOTUNE), TensorFlow's own "
        "ops where it has them (extra 'tf')"
    )

    @classmethod
    def unavailable(cls) -> str | None:
        if importlib.util.find_spec("tensorflow") is None:
            return f"TensorFlow is not installed: {install_hint('tf')}"
        return None

    @classmethod
    def load(cls) -> None:
        require("tensorflow")

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        return _TfSource(self.pipeline(workload, batch_size, seed, throttle))

    def pipeline(
        self, workload: Workload, batch_size: int, seed: int, throttle: IoThrottle | None
    ) -> Any:
        """The workload's tf.data pipeline this system runs."""
        return workload.tf_dataset(batch_size, seed, throttle)


class TfDataCacheSystem(TfDataSystem):
    name = "tf-autotune-cache"
    summary = "tf-autotune with .cache() after read and decode (tf.data's own sample cache)"
    opt_in = True  # run by ``drapps bench --cache``, or when named

    def pipeline(
        self, workload: Workload, batch_size: int, seed: int, throttle: IoThrottle | None
    ) -> Any:
        dataset = workload.tf_cached_dataset(batch_size, seed, throttle)
        if dataset is None:
            raise ValueError(f"{self.name} has no cached tf.data form of {workload.name!r}")
        return dataset
