"""The messages between the training process and its workers, one named type each.

A worker of the pool (a process, a Ray actor) takes :class:`BatchTask` and :class:`SlabsFreed`
and answers each task with :class:`BatchMade` or :class:`BatchFailed`; a worker about to die
sends :class:`WorkerFatal`. A stream worker takes :class:`StreamStart` and :class:`StreamNext`
and answers with :class:`StreamStarted`, :class:`StreamBatch`, :class:`StreamFailed` or
:class:`StreamEnded`. ``None`` asks a worker to stop after what it holds.

They are named tuples: as cheap to pickle and compare as the plain tuples they replace, and
read by field name everywhere.
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

import numpy as np
import torch

from drapps.runtime.errors import SampleError
from drapps.runtime.plan import Repeats
from drapps.runtime.transport import Packed


class BatchTask(NamedTuple):
    """Make the samples ``indices`` of batch ``batch_id`` of ``epoch``: collated whole
    (``part`` None), or uncollated as part ``part`` of a batch cut among workers."""

    generation: int
    """The dispatcher's epoch generation the task belongs to (replies of an older one are
    stale)."""
    seed: int
    """The epoch's base seed, which per-sample seeds and ``get_worker_info().seed`` come from."""
    epoch: int
    batch_id: int
    indices: list[Any]
    num_workers: int
    """The pool's size now, for ``get_worker_info().num_workers``."""
    split: Any
    """Where a Pipeline transform stops in the worker (None: it runs whole)."""
    part: int | None
    sample_threads: int = 1
    """How many of the task's samples the worker makes at once, each in a thread of its own
    (1: one after another; see :func:`drapps.runtime.worker.make_batch`)."""
    repeats: Repeats = None
    """How many times the epoch drew each of ``indices`` before (None: none)."""


def task_keys(indices: list[Any]) -> list[Any]:
    """``indices`` as a task carries them: as they are, or, where a key is a tensor (a
    sampler over a tensor of indices), as :class:`TensorKeys`."""
    if any(isinstance(key, torch.Tensor) for key in indices):
        return TensorKeys(indices)
    return indices


class TensorKeys(list[Any]):
    """A task's keys, some of them tensors, pickled by value. torch's reductions would move
    the sampler's whole tensor into shared memory and hand each task's worker a descriptor
    of it through multiprocessing's resource sharer (a socket connection per task), whose
    duplicate of it stays open in the training process where the worker dies before it
    takes it. The worker gets a list of the same keys: 0-d tensors of one dtype as views
    of one tensor, as DataLoader's worker gets them."""

    def __reduce__(self) -> tuple[Any, ...]:
        first = self[0]
        if all(_plain_scalar(key, first) for key in self):
            try:
                return (_unstacked, (torch.stack(list(self)).numpy(),))
            except (TypeError, RuntimeError):  # a dtype NumPy has not (bfloat16)
                pass
        keys = [key.clone() if isinstance(key, torch.Tensor) else key for key in self]
        return (pickle.loads, (pickle.dumps(keys, protocol=pickle.HIGHEST_PROTOCOL),))


def _plain_scalar(key: Any, first: Any) -> bool:
    return (
        isinstance(key, torch.Tensor)
        and key.dim() == 0
        and key.dtype == first.dtype
        and key.device.type == "cpu"
        and not key.requires_grad
    )


def _unstacked(values: np.ndarray) -> list[torch.Tensor]:
    return list(torch.from_numpy(values).unbind())


class BatchMade(NamedTuple):
    """A task's batch (or part), made."""

    generation: int
    batch_id: int
    packed: Packed | None
    """The batch's bytes (None: every sample was skipped)."""
    skipped: list[tuple[Any, str]]
    """Samples skipped under ``on_error="skip"``: (index, why)."""
    seconds: tuple[float, float, float]
    """Seconds spent in ``__getitem__``, the transform and ``collate_fn``."""
    costs: list[float]
    """Each sample's cost in seconds, in the task's order."""
    part: int | None
    kept: list[int] | None
    """A part's positions (in the task's indices) of the samples it holds (None for a whole
    batch)."""
    watched: int = 0
    """Samples the worker watched for draws from a global generator since its last reply
    (``BatchRecipe.watch_draws``)."""
    drew: str | None = None
    """The first such draw it saw, in words (None: none)."""
    python_s: float = 0.0
    """Of the watched samples' time, the seconds that ran Python bytecode, which holds the
    GIL (:mod:`drapps.runtime.gil`)."""
    measured_s: float = 0.0
    """The watched samples' time measured for it."""
    cpu_s: float = 0.0
    """The CPU time the task's samples took, in the threads that made them (against their
    ``costs``: what is not CPU is waiting, on reads or on the GIL)."""
    alone: str | None = None
    """Why the worker made the samples one at a time though ``sample_threads`` asked for
    more, in words (None: it did not refuse)."""


class BatchFailed(NamedTuple):
    """A task's batch (or part) failed, with the error to raise in its place."""

    generation: int
    batch_id: int
    error: SampleError
    part: int | None


class WorkerFatal(NamedTuple):
    """A worker's last words: the traceback of what kills it."""

    traceback: str


class SlabsFreed(NamedTuple):
    """The training process has released these slabs of the worker (they may be written
    over)."""

    notices: Any


class StreamStart(NamedTuple):
    """Begin pass ``generation`` over an iterable dataset."""

    generation: int
    seed: int
    num_workers: int
    solo_unless_sharded: bool
    """A worker past the first ends its stream at the first item unless the dataset has read
    ``get_worker_info()`` by then."""
    rngs: Any
    """The global RNG states to start the pass from (a resumed checkpoint's), or None."""
    report: bool
    """Answer :class:`StreamStarted` with the states the pass starts from."""
    pipe_seed: int = 0
    """What a datapipe's shuffles draw from, the same in every worker (``stream.pipe_seed``)."""


class StreamNext(NamedTuple):
    """Send the next batch of pass ``generation``."""

    generation: int


class StreamStarted(NamedTuple):
    generation: int
    rngs: Any


class StreamBatch(NamedTuple):
    generation: int
    packed: Packed
    skipped: list[tuple[Any, str]]


class StreamFailed(NamedTuple):
    generation: int
    error: SampleError | None
    over: bool = True
    """The stream cannot go on (it failed to start); False: only this batch failed, and the
    next request takes the stream's next items, as DataLoader's workers do."""


class StreamEnded(NamedTuple):
    generation: int
    unsharded: bool = False
    """The stream ended at its first item because the dataset does not shard itself."""


WorkerReply = BatchMade | BatchFailed | WorkerFatal
"""What a pool worker sends back."""
StreamReply = StreamStarted | StreamBatch | StreamFailed | StreamEnded
"""What a stream worker sends back."""
