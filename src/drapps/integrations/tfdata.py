"""tf.data for TensorFlow users: a drapps loader as a ``tf.data.Dataset``, and drapps'
telemetry over a tf.data pipeline you already have.

:func:`as_dataset` hands the loader's batches to TensorFlow as NumPy views of the batch
tensors (no copy on drapps' side; TensorFlow makes its own tensor from each), so a Keras
``model.fit`` reads them while drapps' controller keeps tuning the loader's workers.
:func:`watch` goes the other way: it times a tf.data pipeline's ``next()`` from the training
loop and gives drapps' bottleneck report.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from drapps._optional import require


def _numpy(batch: Any) -> Any:
    """The batch with tensors as NumPy views (lists as tuples, as tf.data nests them)."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().cpu().numpy()
    if isinstance(batch, np.ndarray):
        return batch
    if isinstance(batch, dict):
        return {k: _numpy(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return tuple(_numpy(v) for v in batch)
    if isinstance(batch, (bool, int, float, str, bytes, np.generic)):
        return np.asarray(batch)
    raise TypeError(
        f"as_dataset: a batch holds a {type(batch).__name__}, which tf.data cannot carry "
        "(tensors, arrays, numbers, strings, and dicts, lists and tuples of them can)"
    )


def _signature(tf: Any, batch: Any) -> Any:
    """tf.TensorSpecs for ``batch``: its shapes with the first dimension left open (the last
    batch may be short) and its dtypes."""
    if isinstance(batch, dict):
        return {k: _signature(tf, v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_signature(tf, v) for v in batch)
    shape = list(batch.shape)
    if shape:
        shape[0] = None
    return tf.TensorSpec(shape=shape, dtype=tf.as_dtype(batch.dtype))


def as_dataset(loader: Any) -> Any:
    """A ``tf.data.Dataset`` whose elements are ``loader``'s batches.

    Each pass over the dataset (a Keras epoch) is one ``iter(loader)``, so a loader with a
    seed gives the same epochs as in PyTorch. The element signature comes from the first
    batch (made when this is called); lists in a batch become tuples. The dataset knows its
    length when the loader does (``len(loader)``), so Keras shows progress. TensorFlow keeps
    the generator, and so the loader, after the dataset is gone: close the loader when done
    (``with drapps.Loader(...) as loader:``).

    Example:
        >>> import drapps, torch
        >>> from drapps.tf import as_dataset
        >>> data = [(torch.ones(3), torch.tensor(1))] * 8
        >>> ds = as_dataset(drapps.Loader(data, batch_size=4, workers=0))  # doctest: +SKIP
        >>> [tuple(x.shape) for x, y in ds]  # doctest: +SKIP
        [(4, 3), (4, 3)]

    Raises:
        ImportError: TensorFlow is not installed (``pip install 'drapps-loader[tf]'``).
        ValueError: the loader gives no batch to take the signature from.
    """
    tf = require("tensorflow")
    first_pass = iter(loader)
    try:
        first = _numpy(next(first_pass))
    except StopIteration:
        raise ValueError("as_dataset: the loader gave no batch") from None
    signature = _signature(tf, first)
    pending: list[tuple[Any, Iterator[Any]]] = [(first, first_pass)]

    def batches() -> Iterator[Any]:
        if pending:  # the pass the signature was taken from goes on where it stopped
            head, rest = pending.pop()
            yield head
        else:
            rest = iter(loader)
        for batch in rest:
            yield _numpy(batch)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    try:
        length = len(loader)
    except TypeError:
        return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(length))


class Watched:
    """A tf.data pipeline (any iterable) timed from the training loop's side; see :func:`watch`."""

    def __init__(self, dataset: Any, *, interval: float, trace: str | None) -> None:
        from drapps.control.policy import make_policy
        from drapps.engines.tuner import AutoTuner

        self.dataset = dataset
        self.samples = 0
        self.batches = 0
        self.wait_s = 0.0
        me = weakref.ref(self)  # the sampling thread must not keep this object alive

        def snapshot() -> Any:
            from drapps.runtime.stats import inline_snapshot

            watched = me()
            if watched is None:
                return inline_snapshot(0, 0.0, 0)
            return inline_snapshot(watched.samples, watched.wait_s, 0)

        self._tuner = AutoTuner(
            snapshot,
            [],
            make_policy("static"),
            interval=interval,
            trace_path=trace,
            progress=False,
            config={"source": type(dataset).__name__},
        )
        self._finalizer = weakref.finalize(self, self._tuner.stop)

    def __iter__(self) -> Iterator[Any]:
        self._tuner.start()
        iterator = iter(self.dataset)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.wait_s += time.perf_counter() - t0
            self.batches += 1
            self.samples += _batch_size(batch)
            yield batch

    def report(self) -> str:
        """drapps' bottleneck report over what was watched so far."""
        from drapps.telemetry.report import bottleneck_report

        stats = {"batches": self.batches, "samples": self.samples, "wait_s": self.wait_s}
        return bottleneck_report(list(self._tuner.rows), stats, external="tf.data")

    def close(self) -> None:
        """Stop sampling (and close the trace). Idempotent; also done on garbage collection."""
        self._finalizer()

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def watch(dataset: Any, *, interval: float = 0.5, trace: str | None = None) -> Watched:
    """Iterate ``dataset`` (a ``tf.data.Dataset`` or any iterable of batches) through this to
    get drapps' telemetry on it: how long the loop waited, throughput, CPU and memory per tick
    (to ``trace`` as JSONL too), and :meth:`Watched.report`.

    Example:
        >>> from drapps.tf import watch
        >>> with watch([[1, 2], [3, 4]], interval=0.1) as watched:
        ...     sum(len(b) for b in watched)
        4
    """
    return Watched(dataset, interval=interval, trace=trace)


def _batch_size(batch: Any) -> int:
    """The leading dimension of the batch's first array-like leaf (1 if it has none)."""
    while isinstance(batch, (dict, list, tuple)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    return 1
