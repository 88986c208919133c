"""``synthetic``: a sample with a set CPU cost and a set output size, for controlled sweeps.

Each sample does ``cost_ms`` of real arithmetic (64x64 float32 matrix products in NumPy,
which release the GIL, so tf.data's threads run them in parallel too) and returns
``sample_kb`` of uint8. The number of products is calibrated once, in the benchmark's own
process, and every case then does the same work whatever its timing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads._base import SgdStep, Workload, autotuned

_SAMPLES = {"smoke": 64, "quick": 4096, "default": 8192}
COST_MS = 2.0
SAMPLE_KB = 147  # a 224x224x3 image


def _products_per_ms() -> float:
    a = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    for _ in range(20):  # warm up BLAS
        a @ a
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 0.2:
        a @ a
        n += 1
    return n / ((time.perf_counter() - start) * 1000)


class SyntheticSamples:
    """Sample ``i``: ``products`` 64x64 matrix products, then ``size`` uint8 bytes from them."""

    def __init__(self, samples: int, products: int, size: int) -> None:
        self.samples, self.products, self.size = samples, products, size

    def __len__(self) -> int:
        return self.samples

    def array(self, index: int) -> np.ndarray:
        if not 0 <= index < self.samples:
            raise IndexError(f"index {index} out of range for {self.samples} samples")
        rng = np.random.default_rng(index)
        a = rng.random((64, 64), dtype=np.float32) / 64
        for _ in range(self.products):
            a = a @ a + 0.5
            a /= a.max()
        seed = int(a.sum() * 1e6) % 2**32
        return np.random.default_rng(seed).integers(0, 256, self.size, dtype=np.uint8)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.array(index)), index % 10


class SyntheticWorkload(Workload):
    name = "synthetic"
    summary = (
        f"{COST_MS:g} ms of NumPy matrix products per sample -> {SAMPLE_KB} KB uint8 "
        "(set DRAPPS_SYNTHETIC_COST_MS, DRAPPS_SYNTHETIC_SAMPLE_KB); batch 32"
    )
    batch_size = 32
    step_ms = 40.0
    reads_files = False

    @classmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        try:
            cost_ms = float(os.environ.get("DRAPPS_SYNTHETIC_COST_MS", COST_MS))
            sample_kb = int(os.environ.get("DRAPPS_SYNTHETIC_SAMPLE_KB", SAMPLE_KB))
        except ValueError as exc:
            raise ValueError(f"DRAPPS_SYNTHETIC_COST_MS/_SAMPLE_KB: {exc}") from None
        if cost_ms < 0 or sample_kb < 1:
            raise ValueError(
                f"DRAPPS_SYNTHETIC_COST_MS must be >= 0 and DRAPPS_SYNTHETIC_SAMPLE_KB >= 1, "
                f"got {cost_ms} and {sample_kb}"
            )
        return {
            "samples": _SAMPLES[size],
            "products": round(cost_ms * _products_per_ms()),
            "bytes": sample_kb * 1024,
            "cost_ms": cost_ms,
        }

    def dataset(self, throttle: IoThrottle | None) -> SyntheticSamples:
        p = self.params
        return SyntheticSamples(p["samples"], p["products"], p["bytes"])

    def tf_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        import tensorflow as tf

        samples = self.dataset(throttle)

        def load(index: Any) -> tuple[Any, Any]:
            data = tf.numpy_function(lambda i: samples.array(int(i)), [index], tf.uint8)
            return tf.ensure_shape(data, [samples.size]), index % 10

        indices = tf.data.Dataset.range(len(samples))
        return autotuned(indices, load, len(samples), batch_size, seed)

    def expected(self, batch_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [((batch_size, self.params["bytes"]), torch.uint8), ((batch_size,), torch.int64)]

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().div_(255.0)

    def cpu_model(self) -> Callable[[torch.Tensor, torch.Tensor], None]:
        inputs = self.params["bytes"]
        return SgdStep(
            lambda: torch.nn.Sequential(
                torch.nn.Linear(inputs, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
            )
        )
