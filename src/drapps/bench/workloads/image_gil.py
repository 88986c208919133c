"""``image-gil``: the image pipeline plus a pure-Python step that holds the GIL.

The ``image`` workload's read, decode, crop and flip (which release the GIL), then a step of
fixed pure-Python work per sample (:data:`PYTHON_STEPS` iterations of integer arithmetic,
about 2 ms on the 2-core VM) that returns the sample unchanged: it stands for an augmentation
written in Python, which no two threads of one process run at once. Threads of one process
lose here where they win on ``image``; worker processes each have their own interpreter.
DataLoader, drapps and torchdata's mapper run it in the dataset; tf.data runs it through
``tf.numpy_function``, as a tf.data user runs Python. DALI, SPDL and drapps' own op pipelines
build the image ops from the files and have no place for it: they refuse the workload.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads.image import SIZE, ImageWorkload

PYTHON_STEPS = 48_000
"""Iterations of the pure-Python step per sample (about 2 ms here)."""


def python_step(steps: int = PYTHON_STEPS) -> int:
    """Fixed pure-Python work that holds the GIL throughout; returns its checksum."""
    x = 0
    for i in range(steps):
        x = (x * 31 + i) & 0xFFFF
    return x


class WithPythonStep:
    """``dataset``'s samples, each after :func:`python_step` (picklable, for worker
    processes)."""

    def __init__(self, dataset: Any, steps: int = PYTHON_STEPS) -> None:
        self.dataset = dataset
        self.steps = steps

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        sample = self.dataset[index]
        python_step(self.steps)
        return sample


def _numpy_step(image: np.ndarray) -> np.ndarray:
    python_step()
    return image


class ImageGilWorkload(ImageWorkload):
    name = "image-gil"
    summary = (
        "the image workload plus a pure-Python step per sample (about 2 ms of integer "
        "arithmetic) that holds the GIL; batch 32"
    )
    step_ms = 40.0
    python_step = True

    def dataset(self, throttle: IoThrottle | None) -> WithPythonStep:  # type: ignore[override]
        return WithPythonStep(super().dataset(throttle))

    def cached_dataset(self, throttle: IoThrottle | None) -> Any:
        raise ValueError("image-gil has no cached form: its Python step is not an op")

    def pipeline_dataset(self, throttle: IoThrottle | None) -> Any:
        raise ValueError("image-gil has no op pipeline: its Python step is not an op")

    def tf_after(self, image: Any) -> Any:
        """The Python step, through ``tf.numpy_function`` (as a tf.data user runs Python)."""
        import tensorflow as tf

        stepped = tf.numpy_function(_numpy_step, [image], tf.uint8)
        return tf.ensure_shape(stepped, [3, SIZE, SIZE])

    def tf_cached_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        return None
