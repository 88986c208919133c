"""Running a loader to an outcome, and comparing two outcomes exactly.

An outcome is what a training loop sees: the batches of each epoch, in order, with the
errors ``next()`` raised among them (the loop goes on after one, as a loop that logs and
continues does: DataLoader then gives the batches after it, and an iterable dataset's stream
goes on from its next item), and the error that ended them (if any). Two outcomes are the same
when every batch holds the same values with the same types (named tuples, dicts, lists), dtypes
(structured ones with their fields), shapes and, where the reference keeps them, strides; and
when they raise errors of the same kind in the same places.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import random
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from helpers import drapps_children, leaks, wait_until
from numpy.lib.array_utils import byte_bounds

import drapps
from drapps.runtime.worker import runqueue_wait


@dataclass(frozen=True)
class Raised:
    """An error ``next()`` raised in the place of a batch; the loop went on. Only its type and
    words are kept: its traceback would keep the iterator that raised it alive."""

    kind: type[BaseException]
    message: str

    @staticmethod
    def of(error: BaseException) -> Raised:
        return Raised(type(error), str(error)[:500])


RAISED_PER_EPOCH = 20
"""Errors one epoch may raise before the loop stops (a batch that fails every time, a
stream that raises on every item): the next one ends the outcome."""


@dataclass
class Outcome:
    """What a loop received: ``epochs[e]`` the batches of epoch ``e`` (and a :class:`Raised`
    where ``next()`` raised instead); ``error`` what ended it (None: every epoch ran out),
    with ``where``: "construction" or "epoch e"."""

    epochs: list[list[Any]] = field(default_factory=list)
    error: BaseException | None = None
    where: str = ""
    length: int | str = ""
    """``len(loader)``, or the name of the error it raised."""
    after: list[tuple[int, float, float]] = field(default_factory=list)
    """A draw from torch's default generator, Python's and NumPy's global ones after each
    epoch that ran out: where the loader left the training loop's generators."""
    iter_lengths: list[tuple[int | str, int | str]] = field(default_factory=list)
    """``len(iterator)`` of each epoch that ran out, as it began and once it had ended (or
    the name of the error it raised; :data:`NO_LENGTH` for DataLoader's stream iterator)."""
    left_workers: int | None = None
    """The worker processes still running once the loop had let go of the epoch it left
    early, where its workers are not persistent (None: no epoch was left so)."""

    def indices(self, epoch: int) -> list[int]:
        """The sample indices epoch ``epoch`` delivered, in order."""
        return [i for batch in self.epochs[epoch] for i in batch_indices(batch)]

    @property
    def failed(self) -> bool:
        """Whether any error was raised."""
        return self.error is not None or any(
            isinstance(b, Raised) for epoch in self.epochs for b in epoch
        )

    def first(self, epochs: int) -> Outcome:
        """What the loop received in its first ``epochs`` epochs."""
        ended = self.error is not None and (
            self.where == "construction" or int(self.where.split()[1]) < epochs
        )
        return Outcome(
            self.epochs[:epochs],
            self.error if ended else None,
            self.where if ended else "",
            self.length,
            self.after[:epochs],
            self.iter_lengths[:epochs],
            self.left_workers,
        )

    def error_kinds(self) -> list[type[BaseException]]:
        """The types of every error raised, in order (the one that ended it last)."""
        kinds = [b.kind for epoch in self.epochs for b in epoch if isinstance(b, Raised)]
        return kinds + ([type(self.error)] if self.error is not None else [])


def _set_epoch(loader: Any, epoch: int) -> None:
    """As a DDP loop does before each epoch: ``set_epoch`` on the sampler it gave the loader
    (a ``DistributedSampler``), alone or in its batch sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
            return


def run(
    make: Callable[[], Any],
    epochs: int = 2,
    peek: int | None = None,
    leave: int | None = None,
    between: Callable[[Any], None] | None = None,
) -> Outcome:
    """Make a loader, iterate ``epochs`` epochs and close it (a drapps loader). An error from
    ``next()`` is kept in its place and the loop goes on, up to :data:`RAISED_PER_EPOCH` in
    an epoch; one from construction, ``iter()`` or past that ends the outcome, where it
    happened. ``peek``: after that many batches of the first epoch, a second iterator gives
    one batch (``next(iter(loader))`` in the loop), kept in the epoch in its place.
    ``leave``: after that many batches (a peeked one too) the loop leaves the first epoch
    (a ``break``) and begins the next. ``between``: called with the loader after the first
    epoch (an attribute set on it, read at the next ``iter()``)."""
    outcome = Outcome()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator, and the like
        try:
            loader = make()
        except Exception as exc:
            outcome.error, outcome.where = exc, "construction"
            _settle(exc)
            return outcome
        try:
            outcome.length = len(loader)
        except Exception as exc:
            outcome.length = type(exc).__name__
        iterator, left = None, False
        try:
            for _ in range(epochs):
                outcome.epochs.append([])
                _set_epoch(loader, len(outcome.epochs) - 1)
                iterator = iter(loader)
                began = _iter_length(iterator)
                raised = 0
                while True:
                    first = len(outcome.epochs) == 1
                    if first and leave is not None and len(outcome.epochs[0]) >= leave:
                        left = True
                        break
                    if first and len(outcome.epochs[0]) == peek:
                        _peek(loader, outcome.epochs[0])
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        break
                    except Exception as exc:
                        raised += 1
                        if raised > RAISED_PER_EPOCH:
                            raise
                        outcome.epochs[-1].append(Raised.of(exc))
                        # As a loop that lets go of the error's frames does: that must not
                        # end what the loader iterates (a generator's frame, cleared, closes).
                        traceback.clear_frames(exc.__traceback__)
                        continue
                    outcome.epochs[-1].append(batch)
                outcome.iter_lengths.append((began, _iter_length(iterator)))
                iterator = None  # let go of before the next iter(), as a for loop lets go
                if left and not getattr(loader, "persistent_workers", False):
                    outcome.left_workers = _workers_once_let_go(loader)
                left = False
                outcome.after.append(_generators_now())
                if between is not None and len(outcome.epochs) == 1:
                    between(loader)
        except Exception as exc:
            outcome.error, outcome.where = exc, f"epoch {len(outcome.epochs) - 1}"
        finally:
            if hasattr(loader, "close"):
                loader.close()
            for held in (iterator, getattr(loader, "_iterator", None)):
                if hasattr(held, "_shutdown_workers"):  # DataLoader's, held by a traceback
                    try:
                        held._shutdown_workers()
                    except RuntimeError as exc:
                        # DataLoader's own worker died as it shut down (seen once under
                        # spawn after a sample failed: "terminate called without an active
                        # exception", SIGABRT): the reference's outcome is what came before.
                        if "DataLoader worker" not in str(exc):
                            raise
            del loader, iterator
    _settle(outcome.error)
    return outcome


def _workers_once_let_go(loader: Any) -> int:
    """The worker processes still running after the loop let go of an epoch it left early:
    DataLoader's iterator stops them as it is collected; a drapps loader's are given up to a
    minute to exit (a thread of its own waits for them)."""
    gc.collect()  # an iterator a reference cycle holds is let go of too
    if isinstance(loader, drapps.Loader):
        wait_until(lambda: not drapps_children(), timeout=60)
    return len(drapps_children())


def _generators_now() -> tuple[int, float, float]:
    """A draw from torch's, Python's and NumPy's global generators, each left where it was."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        draws = (int(torch.randint(1 << 62, ()).item()), random.random(), np.random.random())
    random.setstate(python)
    np.random.set_state(numpy)
    return draws


NO_LENGTH = "no length"
"""DataLoader's iterator over an iterable dataset has none, even where the dataset and the
loader have one (its sampler is endless); drapps' says the loader's ``len()``."""


def _iter_length(iterator: Any) -> int | str:
    try:
        return len(iterator)
    except TypeError as exc:
        return NO_LENGTH if "_InfiniteConstantSampler" in str(exc) else type(exc).__name__
    except Exception as exc:
        return type(exc).__name__


def _peek(loader: Any, epoch: list[Any]) -> None:
    """One batch from a second iterator of ``loader``, or the error it raised, into ``epoch``
    (nothing where it has none)."""
    try:
        epoch.append(next(iter(loader)))
    except StopIteration:
        epoch.append(None)  # a place held, so the peek comes once
    except Exception as exc:
        epoch.append(Raised.of(exc))
        traceback.clear_frames(exc.__traceback__)


def _settle(error: BaseException | None) -> None:
    """Let what a loader left to the garbage collector finish before the next one starts.

    A DataLoader iterator that raises while it starts (its sampler fails as it sends the
    first indices) is never returned: the error's traceback holds it, and its workers and
    queues are shut down by its ``__del__`` when the collector reaches it. A queue's
    descriptors are then closed twice, by the collector and by the queue's feeder thread, so
    the second close can take a descriptor that another loader has just opened (seen as
    EBADF in drapps' construction, under forkserver, in the example after such an error).
    So the error lets go of its frames' locals, the collector runs and the feeder threads of
    closed queues finish here, within the loader that caused it.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
    gc.collect()
    deadline = time.monotonic() + 5.0
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(max(0.0, deadline - time.monotonic()))


def batch_indices(batch: Any) -> list[int]:
    """The indices of the samples in a batch: ``[indices, payloads]`` from the default
    collate, a list of ``(index, payload)`` samples from an identity one, or one sample; none
    from an empty batch or a collate_fn that gives None, or an error raised in its place. A
    batch a collate_fn set after the first epoch marked (``("marked", batch)``) is its batch's."""
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], str):
        return batch_indices(batch[1]) if batch[0] == "marked" else []
    if batch is None or isinstance(batch, Raised) or len(batch) == 0:
        return []
    first = batch[0]
    if isinstance(first, int | np.integer):
        return [int(first)]  # one sample (batch_size=None)
    if isinstance(first, torch.Tensor):
        return [int(i) for i in first.reshape(-1)]
    return [int(sample[0]) for sample in batch]


def assert_same(
    reference: Outcome, got: Outcome, *, any_order: bool = False, generator: bool = True
) -> None:
    """``got`` is ``reference``: the same batches, and errors of the same kinds in the same
    places (out of order, ``any_order``: as multisets per epoch, as many errors), ending with
    an error of the same kind at the same place, and (with ``generator``) torch's, Python's
    and NumPy's global generators left where the reference left them after each epoch."""
    if reference.error is not None or got.error is not None:
        assert got.error is not None, f"no error where the reference raised {reference.error!r}"
        assert reference.error is not None, f"raised {got.error!r} where the reference did not"
        # Out of order, which of several failing batches a loop meets first is the workers'.
        assert any_order or same_kind(got.error, reference.error), (
            f"raised {type(got.error).__name__}: {str(got.error)[:500]}\n"
            f"where the reference raised {type(reference.error).__name__}: "
            f"{str(reference.error)[:500]}"
        )
        assert got.where == reference.where, f"raised in {got.where}, reference {reference.where}"
        if any_order:
            return  # so is how far it got before
    assert got.length == reference.length, f"len() {got.length!r}, reference {reference.length!r}"
    if reference.left_workers is not None and got.left_workers is not None:
        assert got.left_workers == reference.left_workers, (
            f"{got.left_workers} worker processes still running once the loop let go of the "
            f"epoch it left, reference {reference.left_workers}"
        )
    assert len(got.epochs) == len(reference.epochs), (len(got.epochs), len(reference.epochs))
    lengths = zip(reference.iter_lengths, got.iter_lengths, strict=True)  # epochs that ran out
    for e, (left, right) in enumerate(lengths):
        if NO_LENGTH not in left:  # else drapps' says len(loader), which is checked above
            assert right == left, f"epoch {e}: len(iter(loader)) {right}, reference {left}"
    for e, (left, right) in enumerate(zip(reference.epochs, got.epochs, strict=True)):
        if any_order:
            left, right = _by_indices(left), _by_indices(right)
        assert len(right) == len(left), (
            f"epoch {e}: {len(right)} batches and errors, reference {len(left)}: "
            f"{_errors_in(right)} against {_errors_in(left)}"
        )
        for b, (x, y) in enumerate(zip(left, right, strict=True)):
            if isinstance(x, Raised) or isinstance(y, Raised):
                assert isinstance(x, Raised) and isinstance(y, Raised), (
                    f"epoch {e} batch {b}: {_said(y)}, reference {_said(x)}"
                )
                assert issubclass(y.kind, x.kind) or issubclass(x.kind, y.kind), (
                    f"epoch {e} batch {b}: {_said(y)}, reference {_said(x)}"
                )
                continue
            assert_equal(x, y, f"epoch {e} batch {b}")
    if generator:
        assert got.after == reference.after, (
            f"torch's, Python's and NumPy's generators after each epoch: {got.after}, "
            f"reference {reference.after}"
        )


def same_kinds(got: Outcome, reference: Outcome) -> bool:
    """Whether ``got`` raised as many errors as ``reference``, each of the same kind as one of
    the reference's (in any order)."""
    left, right = got.error_kinds(), reference.error_kinds()
    if len(left) != len(right):
        return False
    # A matching of the two, not the first fit for each: drapps' SampleError[KeyError] is a
    # RuntimeError too, and taking a reference's RuntimeError for it left none for its own
    # SampleError[RuntimeError] (found by a campaign). Each error finds a partner by moving
    # those already matched along (augmenting paths).
    owner: list[int | None] = [None] * len(right)  # each reference error's partner in got

    def fits(a: type[BaseException], b: type[BaseException]) -> bool:
        return issubclass(a, b) or issubclass(b, a)

    def partner(i: int, seen: set[int]) -> bool:
        for j, kind in enumerate(right):
            if j not in seen and fits(left[i], kind):
                seen.add(j)
                held = owner[j]
                if held is None or partner(held, seen):
                    owner[j] = i
                    return True
        return False

    return all(partner(i, set()) for i in range(len(left)))


def same_kind(got: BaseException, reference: BaseException) -> bool:
    """drapps raises a subclass of the original error (``SampleError[KeyError]``);
    DataLoader's workers raise the original type again."""
    return isinstance(got, type(reference)) or isinstance(reference, type(got))


def _by_indices(batches: list[Any]) -> list[Any]:
    """Batches sorted by their indices, errors last (by type)."""
    fine = [b for b in batches if not isinstance(b, Raised)]
    errors = [b for b in batches if isinstance(b, Raised)]
    return sorted(fine, key=batch_indices) + sorted(errors, key=lambda r: raised_as(r.kind))


def raised_as(kind: type[BaseException]) -> str:
    """The name of the error as it was raised: drapps' ``SampleError[KeyError]`` is the
    ``KeyError`` a sample raised (sorted by it, beside DataLoader's)."""
    name = kind.__name__
    return name[name.index("[") + 1 : -1] if name.endswith("]") else name


def _said(value: Any) -> str:
    if isinstance(value, Raised):
        return f"raised {value.kind.__name__}: {value.message}"
    return f"a batch of indices {batch_indices(value)}"


def _errors_in(batches: list[Any]) -> str:
    return f"{sum(isinstance(b, Raised) for b in batches)} errors"


def assert_equal(x: Any, y: Any, where: str) -> None:
    """``y`` equals ``x`` exactly: types, dtypes, shapes, strides, values (bit for bit)."""
    assert type(y) is type(x), f"{where}: {type(y).__name__}, reference {type(x).__name__}"
    if isinstance(x, torch.Tensor):
        _assert_tensors(x, y, where)
    elif isinstance(x, torch.UntypedStorage):
        assert y.device == x.device, f"{where}: storage on {y.device}, reference {x.device}"
        assert bytes(y) == bytes(x), f"{where}: storage bytes differ"
    elif isinstance(x, np.ma.MaskedArray):
        assert np.array_equal(x.mask, y.mask), f"{where}: masks differ"
        _assert_arrays(x.data, y.data, where)
    elif isinstance(x, np.ndarray):
        _assert_arrays(x, y, where)
    elif isinstance(x, dict):
        assert list(y) == list(x), f"{where}: keys {list(y)}, reference {list(x)}"
        for key in x:
            assert_equal(x[key], y[key], f"{where}[{key!r}]")
    elif isinstance(x, list | tuple):
        assert len(y) == len(x), f"{where}: length {len(y)}, reference {len(x)}"
        for i, (a, b) in enumerate(zip(x, y, strict=True)):
            assert_equal(a, b, f"{where}[{i}]")
    elif isinstance(x, float) and x != x:
        assert y != y, f"{where}: {y!r}, reference nan"
    else:
        assert y == x, f"{where}: {y!r}, reference {x!r}"


def _assert_tensors(x: torch.Tensor, y: torch.Tensor, where: str) -> None:
    assert y.dtype == x.dtype, f"{where}: dtype {y.dtype}, reference {x.dtype}"
    assert y.shape == x.shape, f"{where}: shape {tuple(y.shape)}, reference {tuple(x.shape)}"
    assert y.is_quantized == x.is_quantized, f"{where}: quantized {y.is_quantized}"
    assert y.layout == x.layout, f"{where}: layout {y.layout}, reference {x.layout}"
    if x.is_quantized:
        assert (y.q_scale(), y.q_zero_point()) == (x.q_scale(), x.q_zero_point()), where
        x, y = x.int_repr(), y.int_repr()
    if x.layout != torch.strided:  # sparse: the values it stands for
        x, y = x.to_dense(), y.to_dense()
    x, y = x.resolve_conj().resolve_neg(), y.resolve_conj().resolve_neg()
    if x.numel() > 1:  # a stride of a dimension of size 1 (or of an empty tensor) is free
        assert _strides(y) == _strides(x), f"{where}: strides {y.stride()}, reference {x.stride()}"
    assert _bits(y) == _bits(x), f"{where}: values\n{y}\nreference\n{x}"


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)


def _bits(t: torch.Tensor) -> bytes:
    """The values' bytes (float8 and bfloat16 have no ==, NaN is not equal to itself)."""
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_arrays(x: np.ndarray, y: np.ndarray, where: str) -> None:
    assert y.dtype == x.dtype, f"{where}: dtype {y.dtype}, reference {x.dtype}"
    assert y.dtype.names == x.dtype.names, f"{where}: fields {y.dtype.names}, reference"
    assert y.shape == x.shape, f"{where}: shape {y.shape}, reference {x.shape}"
    # Fortran order is kept; a stepped view may come back contiguous (pickled, as from
    # DataLoader's workers) where the reference kept the view (no workers).
    assert np.isfortran(y) == np.isfortran(x), f"{where}: Fortran order differs"
    if x.dtype.hasobject:
        assert y.tolist() == x.tolist(), f"{where}: {y!r}, reference {x!r}"
    else:
        assert np.ascontiguousarray(y).tobytes() == np.ascontiguousarray(x).tobytes(), (
            f"{where}: {y!r}, reference {x!r}"
        )


# ------------------------------------------------------------------------------ resources


@functools.cache
def _warm_up() -> None:
    """Open what a process opens once and keeps: this thread's schedstat, multiprocessing's
    shared heap (the progress clocks' arrays live there), the pipes to its resource
    tracker and forkserver (started by the first spawned or forkserver worker), and the
    socket its resource sharer listens on (opened as a tensor's memory is first sent to a
    worker: a sampler's tensor keys)."""
    from multiprocessing import forkserver, resource_tracker

    runqueue_wait()
    resource_tracker.ensure_running()
    forkserver.ensure_running()
    for data in ([torch.tensor(i) for i in range(4)], _Stream()):
        with drapps.Loader(data, batch_size=2, num_workers=2) as loader:
            list(loader)
    with drapps.Loader(range(4), batch_size=2, num_workers=2, sampler=torch.arange(4)) as loader:
        list(loader)


class _Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        return iter(range(info.id, 4, info.num_workers))


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def nothing_left() -> Iterator[None]:
    """The block leaves no process, thread, slab, name in /dev/shm or descriptor behind."""
    _warm_up()
    gc.collect()
    before = open_descriptors()
    yield
    left = leaks()
    assert not left, f"left behind: {left}"
    deadline = time.monotonic() + 5.0
    while open_descriptors() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert open_descriptors() <= before, f"{open_descriptors() - before} descriptors left open"


def assert_owned(got: Outcome, dataset: Any) -> None:
    """No batch in ``got`` shares memory, or a list or dict, with a sample ``dataset`` keeps
    (its ``kept`` samples, made in this process): as with batches from DataLoader's worker
    processes, a loop that writes into a batch changes no sample, and so no later batch."""
    kept = getattr(dataset, "kept", None)
    if not kept:
        return
    containers: set[int] = set()
    spans: list[tuple[int, int]] = []
    for sample in kept.values():
        _memory_of(sample, containers, spans)
    for e, epoch in enumerate(got.epochs):
        for b, batch in enumerate(epoch):
            mine: set[int] = set()
            mine_spans: list[tuple[int, int]] = []
            _memory_of(batch, mine, mine_spans)
            shared = containers & mine
            assert not shared, f"epoch {e} batch {b}: holds a list or dict the dataset keeps"
            for start, end in mine_spans:
                assert not any(start < e2 and s2 < end for s2, e2 in spans), (
                    f"epoch {e} batch {b}: a tensor or array shares memory with a sample the "
                    "dataset keeps"
                )


def assert_aligned(got: Outcome) -> None:
    """Every tensor and array in ``got``'s batches starts aligned for its dtype, as
    DataLoader's do: torch's kernels assume it (a misaligned complex tensor crashed its stack,
    found by a campaign through the sample cache)."""
    for e, epoch in enumerate(got.epochs):
        for b, batch in enumerate(epoch):
            for where, pointer, size in _starts(batch):
                assert pointer % min(size, 16) == 0, (
                    f"epoch {e} batch {b}: {where} starts at {pointer:#x}, not aligned to the"
                    f" {min(size, 16)} bytes its elements need"
                )


def _starts(value: Any, where: str = "batch") -> list[tuple[str, int, int]]:
    """(where, data pointer, element size: a string array's, its character's) of each dense
    tensor and array in ``value``."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _starts(v, f"{where}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [s for i, v in enumerate(value) for s in _starts(v, f"{where}[{i}]")]
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and value.numel():
        return [(where, value.data_ptr(), value.element_size())]
    if isinstance(value, np.ndarray) and value.size and value.itemsize:
        numeric = value.dtype.kind in "biufc"
        return [(where, value.ctypes.data, value.itemsize if numeric else value.dtype.alignment)]
    return []


def _memory_of(value: Any, containers: set[int], spans: list[tuple[int, int]]) -> None:
    """Collect the ids of ``value``'s lists and dicts and the byte spans of its tensors and
    arrays."""
    if isinstance(value, (list, dict)):
        containers.add(id(value))
    if isinstance(value, dict):
        for item in value.values():
            _memory_of(item, containers, spans)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _memory_of(item, containers, spans)
    elif isinstance(value, torch.Tensor):
        if value.layout == torch.sparse_coo:
            parts = [value._indices(), value._values()]
        elif value.layout == torch.sparse_csr:
            parts = [value.crow_indices(), value.col_indices(), value.values()]
        else:
            parts = [value]
        for part in parts:
            storage = part.untyped_storage()
            if storage.nbytes():
                spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    elif isinstance(value, torch.UntypedStorage):
        if value.nbytes():
            spans.append((value.data_ptr(), value.data_ptr() + value.nbytes()))
    elif isinstance(value, np.ndarray):
        arrays = [value.data, value.mask] if isinstance(value, np.ma.MaskedArray) else [value]
        for array in arrays:
            if isinstance(array, np.ndarray) and array.size and array.itemsize:
                spans.append(byte_bounds(array))
                if array.dtype.hasobject:
                    for item in array.flat:
                        _memory_of(item, containers, spans)
