"""The device stage: a Pipeline's ops after its split, run on each batch where training runs.

Each batch that leaves the reorder buffer is moved to ``device`` and the ops from the batch's
split on run on it there, batched. On CUDA this happens on a side stream: the copy is
non-blocking (the dispatcher pinned the batch), the ops are queued behind it, and an event
recorded at the end makes the training loop's stream wait for them, so the host never blocks
and the GPU overlaps the stage with whatever the loop queued before. Without CUDA the same
stage runs on the CPU, in the training process: useful in itself when the workers are the
bottleneck and the loop has idle CPU, and what the CPU tests exercise.

The loader stages each batch one ahead in the stage's own thread (:meth:`DeviceStage.ahead`),
so the stage overlaps the training step rather than adding to it.

The stage keeps its own time per batch (host wall time on the CPU; CUDA event time on a GPU,
read once the events complete, never by synchronising), which the controller's State reports.

Example:
    >>> import torch
    >>> from drapps.ops import DeviceStage, Normalize, Pipeline, ToCHWTensor
    >>> pipeline = Pipeline([ToCHWTensor(), Normalize([0.0], [1.0], scale=1.0)], split=1)
    >>> stage = DeviceStage(pipeline, "cpu")
    >>> stage.run(torch.ones(2, 1, 2, 2, dtype=torch.uint8), [11, 12], 1).dtype
    torch.float32
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from drapps.ops.cut import Mixed
from drapps.ops.op import running_on
from drapps.ops.pipeline import Pipeline


def move(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Every tensor of ``batch`` (nested in lists, tuples and dicts) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mixed):
        return batch.map_tensors(lambda t: t.to(device, non_blocking=non_blocking))
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move(x, device, non_blocking=non_blocking) for x in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move(x, device, non_blocking=non_blocking) for x in batch)
    if isinstance(batch, dict):
        return {k: move(v, device, non_blocking=non_blocking) for k, v in batch.items()}
    return batch


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, list | tuple):
        return [t for x in batch for t in _tensors(x)]
    if isinstance(batch, dict):
        return [t for x in batch.values() for t in _tensors(x)]
    return []


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (an index added for "cuda"), None for None.

    Raises:
        ValueError: not a device name torch knows, or CUDA asked for and not available.
    """
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be None or a torch device name, got {device!r}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, which this machine does not have")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


@dataclass
class Staged:
    """A batch whose stage has been started (see :meth:`DeviceStage.start`)."""

    batch: Any
    ended: Any = None
    """CUDA event recorded after the stage's work on the side stream (None on the CPU)."""


class DeviceStage:
    """Moves batches to ``device`` and runs ``pipeline``'s ops from a split on them there.

    :meth:`run` does it in the calling thread. :meth:`ahead` does it in the stage's own
    thread (``drapps-device-stage``), so that the next batch is staged while the training loop
    steps on this one: on the CPU, that is what lets the stage use the time the loop spends
    waiting on its accelerator; on a GPU it takes the per-sample Python work off the loop.

    Under device memory pressure the stage shrinks: while the device's free memory is under
    ``reserve`` of its total it runs the ops on pieces of each batch (halved per batch), and a
    piece that still runs out of memory is halved and retried, at one sample on the CPU; the
    controller then lowers the offload share (:attr:`squeezed` counts such batches).

    Args:
        pipeline: the loader's Pipeline (None: batches are only moved).
        device: where the stage runs ("cpu", "cuda", "cuda:1", ...).
        memory: ``() -> (free, total)`` bytes of the device (None: CUDA's ``mem_get_info`` on
            a GPU, nothing on the CPU).
        reserve: the share of the device's memory kept free for the model's step.
    """

    def __init__(
        self,
        pipeline: Pipeline | None,
        device: str | torch.device,
        *,
        memory: Callable[[], tuple[int, int]] | None = None,
        reserve: float = 0.1,
    ) -> None:
        resolved = resolve_device(device)
        assert resolved is not None
        if not 0.0 <= reserve < 1.0:
            raise ValueError(f"reserve must be in [0, 1), got {reserve!r}")
        self.pipeline = pipeline
        self.device = resolved
        self.cuda = resolved.type == "cuda"
        if memory is None and self.cuda:
            memory = functools.partial(torch.cuda.mem_get_info, resolved)
        self._memory = memory
        self.reserve = reserve
        self.piece: int | None = None
        """Samples the ops run on at once (None: the whole batch); halved under memory
        pressure, doubled back when the device has room again."""
        self.squeezed = 0
        """Batches run in pieces, or on the CPU, for want of device memory."""
        self._stream = torch.cuda.Stream(resolved) if self.cuda else None
        self._timed: deque[tuple[Any, Any]] = deque()  # CUDA (start, end) events not yet read
        self._lock = threading.Lock()  # the controller thread reads the timers too
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.seconds = 0.0
        """Seconds spent in the stage so far (completed batches)."""
        self.batches = 0
        """Batches the stage has run."""

    def idle(self, start: Any) -> bool:
        """Whether a batch made with split ``start`` needs nothing here (no op to run, and
        the CPU is where it already is)."""
        return self.device.type == "cpu" and not self.has_ops(start)

    def run(self, batch: Any, sample_seeds: Sequence[int], start: Any) -> Any:
        """``batch`` on the device with ops ``start..`` applied (``start`` None or the
        pipeline's length: moved only). ``sample_seeds``: the batch's samples' seeds, in order."""
        if self.idle(start):
            return batch
        return self.finish(self.start(batch, sample_seeds, start))

    def ahead(self, batch: Any, sample_seeds: Sequence[int], start: Any) -> Future[Staged]:
        """:meth:`start` in the stage's thread; pass the result to :meth:`finish` in the
        thread that uses the batch.

        Raises:
            RuntimeError: the stage is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the device stage is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="drapps-device-stage")
            return self._executor.submit(self.start, batch, sample_seeds, start)

    def start(self, batch: Any, sample_seeds: Sequence[int], start: Any) -> Staged:
        """Move ``batch`` and run the ops (on CUDA: queued on the side stream)."""
        if self._stream is None:
            t0 = time.perf_counter()
            out = self._apply(move(batch, self.device), sample_seeds, start)
            self.seconds += time.perf_counter() - t0
            self.batches += 1
            return Staged(out)
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            began.record()
            out = self._apply(move(batch, self.device, non_blocking=True), sample_seeds, start)
            ended.record()
        with self._lock:
            self._timed.append((began, ended))
        return Staged(out, ended)

    def finish(self, staged: Staged) -> Any:
        """The staged batch, ready for the calling thread's current CUDA stream."""
        if staged.ended is None:
            return staged.batch
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(staged.ended)
        for tensor in _tensors(staged.batch):
            if tensor.device.type == "cuda":
                # Made on the side stream, used on the loop's: keep the allocator from
                # reusing its memory before the loop's stream is done with it.
                tensor.record_stream(consumer)
        self._read_timers()
        return staged.batch

    def has_ops(self, start: Any) -> bool:
        """Whether a batch made with split ``start`` has ops to run here."""
        pipeline = self.pipeline
        return (
            pipeline is not None
            and start is not None
            and pipeline.stop_of(start) < len(pipeline.ops)
        )

    def _apply(self, batch: Any, sample_seeds: Sequence[int], start: Any) -> Any:
        if not self.has_ops(start):
            return batch
        assert self.pipeline is not None and start is not None
        squeezed = self._follow_memory(len(sample_seeds))
        while True:
            try:
                with running_on(self.device):
                    out = self.pipeline.run_batch(batch, sample_seeds, start, piece=self.piece)
                break
            except torch.OutOfMemoryError:
                # The loader must never be why the model's step runs out of memory: retry in
                # smaller pieces, and at one sample a piece, on the CPU.
                squeezed = True
                if self.cuda:
                    torch.cuda.empty_cache()
                if self.piece == 1 or len(sample_seeds) <= 1:
                    cpu = torch.device("cpu")
                    with running_on(cpu):
                        made = self.pipeline.run_batch(move(batch, cpu), sample_seeds, start)
                    out = move(made, self.device)
                    break
                self.piece = max(1, (self.piece or len(sample_seeds)) // 2)
        self.squeezed += squeezed
        return out

    def _follow_memory(self, samples: int) -> bool:
        """Halve :attr:`piece` while the device's free memory is under ``reserve`` of it,
        double it back (to whole batches) once over twice that; whether this batch is
        squeezed."""
        if self._memory is None:
            return self.piece is not None
        free, total = self._memory()
        if free < self.reserve * total:
            self.piece = max(1, (self.piece or samples) // 2)
        elif self.piece is not None and free > 2 * self.reserve * total:
            self.piece = None if 2 * self.piece >= samples else 2 * self.piece
        return self.piece is not None

    def _read_timers(self) -> None:
        with self._lock:
            while self._timed and self._timed[0][1].query():
                began, ended = self._timed.popleft()
                self.seconds += began.elapsed_time(ended) / 1000.0
                self.batches += 1

    def totals(self) -> tuple[float, int]:
        """(seconds, batches) over the batches whose stage has completed."""
        if self._timed:
            self._read_timers()
        return self.seconds, self.batches

    def close(self) -> None:
        """Stop the stage's thread (a batch being staged finishes first). Idempotent."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __repr__(self) -> str:
        return f"DeviceStage(device={str(self.device)!r})"
