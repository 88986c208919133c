"""What every benchmark workload provides, so each system runs the same logical pipeline."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from drapps.bench.throttle import IoThrottle

SIZES = ("smoke", "quick", "default")
"""Data sizes: ``smoke`` for the tests, ``quick`` for ``--quick``, ``default`` otherwise."""

Batch = tuple[torch.Tensor, torch.Tensor]


class Workload(ABC):
    """One pipeline, made three ways: a map-style dataset (for DataLoader and drapps), a
    tf.data pipeline in TensorFlow's own ops, and what the training step does with a batch.

    A workload is built in two steps: ``prepare`` (in the benchmark's process, once) makes or
    finds the data and returns JSON-able ``params``; each timed case, in its own process,
    rebuilds the workload from those params.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for ``drapps bench --list`` and the report."""
    batch_size: ClassVar[int]
    step_ms: ClassVar[float]
    """The ``sleep`` consumer's step per batch: roughly what 2 cores of workers can feed."""
    reads_files: ClassVar[bool] = True
    """Whether samples come from files (the ``slow-io`` scenario throttles those reads)."""
    python_step: ClassVar[bool] = False
    """Whether each sample runs a step of pure Python (``image-gil``): systems that build the
    pipeline in their own ops or cache a deterministic part have no place for it, and refuse
    the workload."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    @classmethod
    @abstractmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        """Make (or find cached) data for ``size``; return the params cases rebuild from."""

    @abstractmethod
    def dataset(self, throttle: IoThrottle | None) -> Any:
        """A map-style dataset of ``(x, y)`` samples; reads go through ``throttle`` if given."""

    @abstractmethod
    def tf_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        """An endless ``tf.data.Dataset`` of batches shaped like the torch ones, AUTOTUNEd."""

    @abstractmethod
    def expected(self, batch_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Shape and dtype of each tensor in a batch; every system must deliver exactly these."""

    def cached_dataset(self, throttle: IoThrottle | None) -> tuple[Any, Any]:
        """The same samples as ``(dataset, transform)`` for a sample cache: the dataset's
        deterministic part (read, decode, tokenise) and the random rest as the transform
        (None: nothing random)."""
        return self.dataset(throttle), None

    def tf_cached_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        """The tf.data pipeline with ``.cache()`` after its deterministic part (what a tf.data
        user writes to stop re-decoding), or None where the workload has no such form."""
        return None

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        """The batched step on the training side before the model (e.g. normalisation)."""
        return x

    @abstractmethod
    def cpu_model(self) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """A small real model's forward and backward on one batch, for the cpu-model consumer."""

    def cuda_model(self, device: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """A real model's mixed-precision training step on the GPU ``device``, for the
        cuda-model consumer.

        Raises:
            ValueError: this workload has none (the image workload trains ResNet-50).
        """
        raise ValueError(
            f"the cuda-model consumer trains ResNet-50 on the image workloads; {self.name!r} "
            "has no GPU model: use --consumer sleep or cpu-model"
        )

    def warm(self) -> None:  # noqa: B027 - synthetic data has nothing to warm
        """Read the data once so runs start alike, not whichever finds a warm page cache."""

    def __len__(self) -> int:
        return int(self.params["samples"])


def autotuned(dataset: Any, load: Callable[..., Any], size: int, batch_size: int, seed: int) -> Any:
    """The tf.data recipe every workload uses on its ``size`` elements: reshuffled each epoch,
    repeated, ``load`` mapped in parallel and batches prefetched, both AUTOTUNEd, whole batches
    only (as ``drop_last=True`` on the torch side)."""
    import tensorflow as tf

    return (
        dataset.shuffle(size, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def autotuned_cached(
    dataset: Any,
    make: Callable[..., Any],
    augment: Callable[..., Any],
    size: int,
    batch_size: int,
    seed: int,
) -> Any:
    """:func:`autotuned` with tf.data's in-memory ``.cache()`` between the deterministic part
    (``make``: read and decode) and the random one (``augment``), reshuffling the cached
    elements every epoch (a buffer of the whole dataset, as the torch side's sampler)."""
    import tensorflow as tf

    return (
        dataset.map(make, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(size, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


class SgdStep:
    """One SGD step of ``model`` on a batch: the ``cpu-model`` consumer's training step.

    Args:
        model: built after ``torch.manual_seed(seed)``, so every case trains the same weights.
        loss: ``(output, y) -> loss``; cross-entropy by default.
    """

    def __init__(
        self,
        model: Callable[[], nn.Module],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.model = model()
        self.loss = loss
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = self.loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
