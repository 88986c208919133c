"""What the differential harness generates: datasets, samples and loader settings.

Everything here is plain data (frozen dataclasses) turned into datasets by module-level
classes, so a case pickles into spawned and forkserver workers, prints as a readable
regression example, and makes the same samples in every process. Each sample is
``(index, payload)``: the payload is whatever the case asks for (tensors of every dtype and
layout, NumPy arrays of every kind, Python values, containers), and the index lets every
check count what arrived.
"""

from __future__ import annotations

import random
import time
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, default_collate, get_worker_info
from torch.utils.data._utils.collate import default_convert

import drapps

Pair = namedtuple("Pair", "first second")
"""A named tuple every process can import by name (DataLoader's collate keeps the type)."""

TENSOR_DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "quint8",
)  # fmt: skip
TENSOR_LAYOUTS = (
    "contiguous", "transposed", "stepped", "expanded", "offset", "two_views", "zero_size",
    "scalar", "conj", "sparse_coo", "sparse_csr", "storage",
)  # fmt: skip
NOT_SPARSE = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
"""Dtypes torch cannot make sparse (their "sparse" layouts are contiguous instead)."""
ARRAY_DTYPES = (
    "bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex64",
    ">i4", "<U3", "S3", "datetime64[D]", "object", "structured",
)  # fmt: skip
ARRAY_LAYOUTS = ("contiguous", "fortran", "readonly", "stepped", "masked", "scalar")
PYTHON_VALUES = ("int", "float", "str", "bytes", "none", "bool")
CONTAINERS = ("tuple", "list", "dict", "namedtuple")
RNGS = ("random", "numpy", "torch")
DRAWS = (*RNGS, "worker")
"""What a sample may draw: a global RNG, or ``get_worker_info()`` (id, count, seed)."""


# ------------------------------------------------------------------------------ payloads


@dataclass(frozen=True)
class Leaf:
    """One value of a sample: a tensor, an array or a Python value."""

    kind: str  # "tensor", "array" or "python"
    dtype: str = "float32"
    layout: str = "contiguous"
    shape: tuple[int, ...] = (2, 3)

    def make(self, i: int) -> Any:
        if self.kind == "tensor":
            return _tensor(self.dtype, self.layout, self.shape, i)
        if self.kind == "array":
            return _array(self.dtype, self.layout, self.shape, i)
        return _python(self.dtype, i)


@dataclass(frozen=True)
class Payload:
    """A sample's payload: a leaf, or a container of payloads; ``alternate`` is used for odd
    indices instead (a dataset whose samples change structure between indices)."""

    leaf: Leaf | None = None
    container: str | None = None
    items: tuple[Payload, ...] = ()
    alternate: Payload | None = None
    draw: str | None = None
    """Add a draw from this global RNG ("random", "numpy", "torch") to the sample, or what
    ``get_worker_info()`` says ("worker")."""

    def make(self, i: int) -> Any:
        if self.alternate is not None and i % 2:
            return self.alternate.make(i)
        value = self._make(i)
        if self.draw is None:
            return value
        return (value, _draw(self.draw))

    def _make(self, i: int) -> Any:
        if self.leaf is not None:
            return self.leaf.make(i)
        parts = [p.make(i) for p in self.items]
        if self.container == "list":
            return parts
        if self.container == "dict":
            return {f"k{n}": part for n, part in enumerate(parts)}
        if self.container == "namedtuple":
            return Pair(parts[0], parts[1] if len(parts) > 1 else None)
        return tuple(parts)


def _draw(rng: str) -> Any:
    if rng == "worker":
        info = get_worker_info()
        return None if info is None else (info.id, info.num_workers, info.seed)
    if rng == "random":
        return random.random()
    if rng == "numpy":
        return np.random.rand(2)
    return torch.rand(2)


def _tensor(dtype: str, layout: str, shape: tuple[int, ...], i: int) -> Any:
    numel = 1
    for size in shape:
        numel *= size
    base = torch.arange(numel * 4, dtype=torch.float64) + i  # room for every view below
    if dtype == "quint8":
        q = torch.quantize_per_tensor(base[:numel].float() % 25, 0.5, 3, torch.quint8)
        return q.reshape(shape)
    values = _cast(base, dtype)
    if layout == "transposed" and len(shape) >= 2:
        return values[:numel].reshape(shape[::-1]).transpose(0, -1)
    if layout == "stepped":
        return values[: numel * 2 : 2].reshape(shape)
    if layout == "expanded":
        return values[: shape[-1]].expand(*shape)
    if layout == "offset":
        return values[3 : 3 + numel].reshape(shape)
    if layout == "two_views":  # two overlapping views of one storage
        return values[:numel].reshape(shape), values[2 : numel + 2].reshape(shape)
    if layout == "zero_size":
        return values[:0].reshape(0, *shape[1:])
    if layout == "scalar":
        return values[0].clone()
    if layout == "conj" and values.is_complex():
        return values[:numel].reshape(shape).conj()
    if layout == "storage":  # a bare storage, as torch.save writes and DataLoader shares
        return values[:numel].clone().untyped_storage()
    if layout.startswith("sparse") and dtype not in NOT_SPARSE:
        if layout == "sparse_csr":  # two dimensions
            return values[:numel].reshape(-1, shape[-1]).to_sparse_csr()
        return values[:numel].reshape(shape).to_sparse()
    return values[:numel].reshape(shape)


def _cast(base: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype == "bool":
        return (base % 2).bool()
    if dtype.startswith("complex"):
        return (base + 1j * (base % 5)).to(getattr(torch, dtype))
    if dtype.startswith("float8"):
        return (base % 8).to(getattr(torch, dtype))
    if dtype.startswith(("int", "uint")):
        return (base % 100).to(getattr(torch, dtype))
    return (base / 4).to(getattr(torch, dtype))


def _array(dtype: str, layout: str, shape: tuple[int, ...], i: int) -> Any:
    numel = 1
    for size in shape:
        numel *= size
    if dtype == "structured":
        flat = np.zeros(numel * 2, dtype=[("a", "<i4"), ("b", "<f8")])
        flat["a"], flat["b"] = np.arange(numel * 2) + i, (np.arange(numel * 2) + i) / 2
    elif dtype == "object":
        flat = np.empty(numel * 2, dtype=object)
        flat[:] = [f"o{i}-{k}" for k in range(numel * 2)]
    elif dtype in ("<U3", "S3"):
        flat = np.array([f"{(i + k) % 1000}" for k in range(numel * 2)], dtype=dtype)
    elif dtype == "datetime64[D]":
        flat = np.arange(numel * 2).astype("datetime64[D]") + i
    else:
        flat = ((np.arange(numel * 2) + i) % 100).astype(dtype)
    if layout == "scalar":
        return flat[0:1].reshape(())
    array = flat[:numel].reshape(shape)
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "readonly":
        array.flags.writeable = False
        return array
    if layout == "stepped":
        return flat[: numel * 2 : 2].reshape(shape)
    if layout == "masked":
        return np.ma.masked_array(array, mask=(np.arange(numel) % 2 == 0).reshape(shape))
    return array


def _python(kind: str, i: int) -> Any:
    return {
        "int": i,
        "float": i / 3,
        "str": f"sample-{i}",
        "bytes": f"b{i}".encode(),
        "none": None,
        "bool": bool(i % 2),
    }[kind]


# ------------------------------------------------------------------------------ datasets


def ids_below_the_count() -> Any:
    """``get_worker_info()``, held to DataLoader's rule as each sample is made: a worker's id
    is below its ``num_workers`` (a dataset that keys a handle or a shard by id relies on
    it). Broken, the sample fails, which its batch shows against the reference."""
    info = get_worker_info()
    if info is not None and not 0 <= info.id < info.num_workers:
        raise AssertionError(f"get_worker_info(): id {info.id}, num_workers {info.num_workers}")
    return info


class Samples:
    """A map-style dataset of ``n`` samples ``(key, payload.make(i))``, ``key`` as the sampler
    gave it (an int, a 0-d tensor, a NumPy integer: its type shows in the batch) and ``i`` its
    value; index ``fail_at`` raises KeyError (as a dataset missing a file does), or is
    ``SKIPPED`` when ``marks``. ``held``: each sample is made once and kept (in :attr:`kept`),
    and the kept object itself is returned every time, as a dataset that holds its data in
    memory returns it."""

    def __init__(
        self,
        n: int,
        payload: Payload,
        fail_at: int | None = None,
        wait_s: float = 0.0,
        marks: bool = False,
        held: bool = False,
    ) -> None:
        self.n, self.payload, self.fail_at, self.wait_s = n, payload, fail_at, wait_s
        self.marks = marks
        self.kept: dict[int, Any] | None = {} if held else None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle takes: the samples kept so far, as they stood (thread
        workers may be adding one meanwhile, which a dict being copied must not see)."""
        state = self.__dict__.copy()
        if self.kept is not None:
            state["kept"] = dict(self.kept)  # one step under the GIL: int keys call no Python
        return state

    def __getitem__(self, key: Any) -> Any:
        i = int(key)
        ids_below_the_count()
        if self.wait_s:
            time.sleep(self.wait_s)  # a read: the GIL released, no CPU
        if i == self.fail_at:
            if self.marks:
                return SKIPPED
            raise KeyError(f"sample {i} is missing")
        if self.kept is None:
            return (key, self.payload.make(i))
        if i not in self.kept:
            self.kept[i] = [key, self.payload.make(i)]  # a list: a container a loop may change
        return self.kept[i]


class BatchedSamples(Samples):
    """``Samples`` that also give a batch's samples from one call, as DataLoader's fetcher
    takes them (``__getitems__``, as torch's ``Subset`` and Hugging Face's datasets have)."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [self[i] for i in indices]


class Stream(IterableDataset):  # type: ignore[type-arg]
    """An iterable dataset of ``n`` samples, sharded by ``get_worker_info()`` when
    ``sharded`` (else every worker yields all of them, as DataLoader's would), shuffled per
    worker with ``shuffle`` ("random", "numpy" or "torch") when given. Item ``fail_at``
    raises KeyError instead; the stream then ends if it is a generator, or goes on with the
    next item if it is an iterator object (``goes_on``)."""

    def __init__(
        self,
        n: int,
        payload: Payload,
        sharded: bool = True,
        shuffle: str | None = None,
        fail_at: int | None = None,
        goes_on: bool = False,
    ) -> None:
        self.n, self.payload, self.sharded, self.shuffle = n, payload, sharded, shuffle
        self.fail_at, self.goes_on = fail_at, goes_on

    def __iter__(self):  # type: ignore[no-untyped-def]
        # Only a sharded stream reads the id: drapps streams one that does not with one worker.
        info = ids_below_the_count() if self.sharded else get_worker_info()
        ids = list(range(self.n))
        if info is not None and self.sharded:
            ids = ids[info.id :: info.num_workers]
        if self.shuffle == "random":
            random.shuffle(ids)
        elif self.shuffle == "numpy":
            ids = [ids[k] for k in np.random.permutation(len(ids))]
        elif self.shuffle == "torch":
            ids = [ids[k] for k in torch.randperm(len(ids)).tolist()]
        items = _Items(iter(ids), self.payload, self.fail_at)
        return items if self.goes_on else (item for item in items)


class _Items:
    """An iterator over ``(i, payload)`` of ``ids``, raising KeyError at ``fail_at``."""

    def __init__(self, ids: Any, payload: Payload, fail_at: int | None) -> None:
        self.ids, self.payload, self.fail_at = ids, payload, fail_at

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> Any:
        i = next(self.ids)
        if i == self.fail_at:
            raise KeyError(f"item {i} is missing")
        return (i, self.payload.make(i))


def shuffled_pipe(stream: Stream) -> Any:
    """``stream`` as an ``IterDataPipe`` that shuffles it, then shards it among the workers
    (DataLoader seeds the shuffle alike in every worker, from torch's generator)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(stream).shuffle().sharding_filter()


def identity(batch: Any) -> Any:
    """A collate_fn that keeps the samples as they are (module level: it pickles)."""
    return batch


def nothing(batch: Any) -> None:
    """A collate_fn whose batches are None (DataLoader delivers them)."""
    return None


COLLATES = {"default": None, "identity": identity, "nothing": nothing}


class WithEmpty:
    """A batch sampler that yields an empty batch first, then ``batches``' (a bucketing
    sampler can: DataLoader collates it, and its default collate raises IndexError)."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield []
        yield from self.batches

    def __len__(self) -> int:
        return len(self.batches) + 1

    @property
    def sampler(self) -> Any:
        return self.batches.sampler


class PermutedInIter(torch.utils.data.Sampler[int]):
    """A sampler that draws its whole order as ``iter()`` is called, not as a generator
    (as a user's sampler often does): which draws come before the base seed is the
    loader's order of calls."""

    def __init__(self, n: int, generator: torch.Generator | None) -> None:
        self.n, self.generator = n, generator

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


class SamplerFailed(RuntimeError):
    """What a sampler that fails partway raises (a user's sampler whose index went stale)."""


class FailsPartway(torch.utils.data.Sampler[Any]):
    """A user's sampler: ``inner``'s keys, raising :class:`SamplerFailed` in place of the
    ``at``-th key of each pass; the pass then ends, as a generator's does. ``iter()`` calls
    ``inner``'s at once, so a sampler that draws its order there still draws it there."""

    def __init__(self, inner: Any, at: int) -> None:
        self.inner, self.at = inner, at

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        return _KeysUntil(iter(self.inner), self.at)

    def set_epoch(self, epoch: int) -> None:
        """As a DDP loop calls it: passed on to a ``DistributedSampler`` inside."""
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)


class _KeysUntil:
    def __init__(self, keys: Iterator[Any], at: int) -> None:
        self.keys, self.at, self.given = keys, at, 0

    def __iter__(self) -> _KeysUntil:
        return self

    def __next__(self) -> Any:
        if self.given == self.at:
            self.given += 1
            raise SamplerFailed(f"the sampler failed at its key {self.at}")
        if self.given > self.at:
            raise StopIteration
        key = next(self.keys)
        self.given += 1
        return key


SKIPPED = "skipped"
"""What the reference's dataset gives for the sample that fails, where drapps skips it."""


def typed_keys(kind: str, n: int, seed: int) -> Any:
    """A permutation of ``range(n)`` to use as a sampler, whose keys are not ints: a tensor
    (0-d int32 keys, as ``sampler=torch.randperm(n)`` gives) for ``"tensor_keys"``, a NumPy
    array (int16 keys) for ``"numpy_keys"``. Drawn from a generator of its own."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    return order if kind == "tensor_keys" else order.numpy().astype(np.int16)


def reseed_in_worker(worker_id: int) -> None:
    """A worker_init_fn: reseeds the worker's global RNGs (after the loader seeded them)."""
    random.seed(1000 + worker_id)
    np.random.seed(1000 + worker_id)
    torch.manual_seed(1000 + worker_id)


class Marked:
    """A ``collate_fn`` set on the loader after its first epoch: ``inner``'s batch (the
    default's where None), marked as this one's."""

    def __init__(self, inner: Any, *, batched: bool) -> None:
        self.inner = inner or (default_collate if batched else default_convert)

    def __call__(self, samples: Any) -> Any:
        return ("marked", self.inner(samples))


class SkippingCollate:
    """The reference's collate_fn where drapps skips a failing sample: ``inner`` on the batch
    without the ``SKIPPED`` samples, or ``SKIPPED`` when none is left (the batch is dropped
    from the reference's outcome, as drapps drops it)."""

    def __init__(self, inner: Any, batched: bool) -> None:
        self.inner, self.batched = inner, batched

    def __call__(self, batch: Any) -> Any:
        if not self.batched:
            return SKIPPED if is_skipped(batch) else self.inner(batch)
        kept = [sample for sample in batch if not is_skipped(sample)]
        return self.inner(kept) if kept or not batch else SKIPPED


def is_skipped(value: Any) -> bool:
    """Whether ``value`` (a sample, or a batch the reference's collate_fn gave) is ``SKIPPED``."""
    return isinstance(value, str) and value == SKIPPED


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Settings:
    """The loader arguments a case varies (DataLoader's, and drapps' own on top)."""

    workers: int | str = 0
    batch_size: int | None = 2
    drop_last: bool = False
    shuffle: bool = False
    # None, "sequential", "random", "random_replacement", "subset", "in_iter", a
    # permutation whose keys are tensors or NumPy integers: "tensor_keys", "numpy_keys", or
    # rank 1 of a DistributedSampler of 2 replicas, shuffled: "distributed"
    sampler: str | None = None
    batch_sampler: bool = False
    empty_batch: bool = False  # the batch_sampler yields an empty batch first
    collate: str = "default"  # "default", "identity" or "nothing" (batches of None)
    in_order: bool = True
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    context: str | None = None  # None (fork), "spawn", "forkserver"
    pin_memory: bool = False
    timeout: float = 0.0
    cache: bool = False  # drapps' sample cache (map-style datasets)
    threads: bool = False  # drapps' workers as threads (map-style datasets)
    cut: bool = False  # drapps cuts every batch into parts, made apart (dispatch="samples")
    tight: bool = False  # drapps' memory budget below one batch, one batch ahead at most
    skip: bool = False  # drapps skips a failing sample (on_error="skip")
    generator: int | None = None  # a torch.Generator of this seed, for order and base seed
    init: bool = False  # a worker_init_fn that reseeds the worker's global RNGs
    # The named sampler (a map-style dataset's), wrapped in a user's that raises in place of
    # this key of each pass (the harness drops it where the pass is shorter)
    sampler_fails: int | None = None

    def drapps_kwargs(self, dataset: Any) -> dict[str, Any]:
        """drapps' arguments: DataLoader's, the default count for ``"auto"``, a cache,
        threads, batches cut into parts, a tight budget, skipping failed samples."""
        kwargs = self.dataloader_kwargs(dataset)
        if self.skip:
            kwargs["on_error"] = "skip"
        if self.cut:
            kwargs["dispatch"] = "samples"
        if self.tight:
            kwargs.update(memory_budget="1KB", lookahead=1)
            if self.prefetch_factor is None:  # drapps refuses both
                kwargs["prefetch"] = 1
        if self.threads and not self.cache and not isinstance(dataset, IterableDataset):
            kwargs["backend"] = "thread"  # the sample cache keeps worker processes
        if self.workers == "auto":
            del kwargs["num_workers"]  # the default: drapps chooses
        if self.cache and not isinstance(dataset, IterableDataset):
            kwargs["cache"] = drapps.Cache(memory="16MB", codec="none")
        return kwargs

    @property
    def draws_past_first_batch(self) -> bool:
        """Whether the batch sampler's pass draws after its first batch (an empty batch, then
        a random sampler, which draws as it starts, or as its ``iter()`` is called): without
        workers DataLoader draws that at its second ``next()``, from torch's generator or
        from the sampler's own, which a second iterator's pass draws from too."""
        random = self.sampler in ("random", "random_replacement", "subset", "in_iter")
        return self.batch_sampler and self.empty_batch and random

    @property
    def ends_behind_a_user_batch_sampler(self) -> bool:
        """Whether a ``RandomSampler`` with a generator of its own sits behind the batch
        sampler of the user's (the empty first batch's): its draw at the pass's end is made
        with the rest of the pass, which drapps draws whole as the epoch starts."""
        random = self.sampler in ("random", "random_replacement")
        return self.batch_sampler and self.empty_batch and random and self.generator is not None

    @property
    def draws_as_it_runs_out(self) -> bool:
        """Whether the sampler draws from a generator of its own as its pass goes on: a
        ``RandomSampler`` with replacement draws its keys 32 at a time, which drapps draws
        as the epoch starts, DataLoader as its prefetch asks for them. A second iterator
        over the sampler draws from that generator too. (Without replacement its one draw
        past its first key, at the ``next()`` that finds its pass over, is made where
        DataLoader's is.)"""
        return self.sampler == "random_replacement" and self.generator is not None

    def dataloader_kwargs(self, dataset: Any, *, skipping: bool = False) -> dict[str, Any]:
        """DataLoader's arguments for this case (samplers and generators made fresh);
        ``skipping``: its collate_fn drops the ``SKIPPED`` samples."""
        collate = COLLATES[self.collate]
        sampler = self._sampler(dataset)
        if skipping:
            batched = self.batch_size is not None or (self.batch_sampler and sampler is not None)
            default = default_collate if batched else default_convert
            collate = SkippingCollate(collate or default, batched)
        kwargs: dict[str, Any] = {
            "num_workers": self.workers,
            "collate_fn": collate,
            "in_order": self.in_order,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "timeout": self.timeout,
        }
        if self.generator is not None:
            kwargs["generator"] = torch.Generator().manual_seed(self.generator)
        if self.init:
            kwargs["worker_init_fn"] = reseed_in_worker
        if self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        if self.context is not None:
            kwargs["multiprocessing_context"] = self.context
        if self.batch_sampler and sampler is not None:
            size = self.batch_size or 1
            batches = torch.utils.data.BatchSampler(sampler, size, self.drop_last)
            kwargs["batch_sampler"] = WithEmpty(batches) if self.empty_batch else batches
            return kwargs
        kwargs.update(batch_size=self.batch_size, drop_last=self.drop_last)
        if sampler is not None:
            kwargs["sampler"] = sampler
        else:
            kwargs["shuffle"] = self.shuffle
        return kwargs

    def _sampler(self, dataset: Any) -> Any:
        sampler = self._named_sampler(dataset)
        if sampler is None or self.sampler_fails is None:
            return sampler
        return FailsPartway(sampler, self.sampler_fails)

    def _named_sampler(self, dataset: Any) -> Any:
        if self.sampler is None or isinstance(dataset, IterableDataset):
            return None
        if self.sampler == "sequential":
            return torch.utils.data.SequentialSampler(dataset)
        if self.sampler == "random":
            return torch.utils.data.RandomSampler(dataset, generator=self._generator())
        if self.sampler == "random_replacement":
            return torch.utils.data.RandomSampler(
                dataset, replacement=True, num_samples=7, generator=self._generator()
            )
        if self.sampler == "in_iter":
            return PermutedInIter(len(dataset), self._generator())
        if self.sampler in TYPED:
            return typed_keys(self.sampler, len(dataset), self.generator or 0)
        if self.sampler == "distributed":  # rank 1 of 2, as DDP gives it; run() sets its epoch
            return torch.utils.data.DistributedSampler(
                dataset, num_replicas=2, rank=1, seed=self.generator or 0
            )
        return torch.utils.data.SubsetRandomSampler(
            list(range(0, len(dataset), 2)), generator=self._generator()
        )

    def _generator(self) -> torch.Generator | None:
        """A sampler's own generator, seeded apart from the loader's (None: torch's RNG)."""
        if self.generator is None:
            return None
        return torch.Generator().manual_seed(self.generator + 1)


@dataclass(frozen=True)
class Case:
    """A dataset and the settings to load it with."""

    n: int
    payload: Payload
    settings: Settings = field(default_factory=Settings)
    iterable: bool = False
    sharded: bool = True
    shuffle_stream: str | None = None
    fail_at: int | None = None
    waits: bool = False
    getitems: bool = False  # the dataset has __getitems__
    pipe: bool = False  # an iterable dataset is a datapipe that shuffles, then shards
    held: bool = False  # a map-style dataset returns samples it keeps (no draws then)
    goes_on: bool = False  # a stream that fails at fail_at goes on (an iterator, no generator)
    peek: int | None = None  # after this many batches, a second iterator gives one batch
    leave: int | None = None  # after this many batches, the loop leaves the first epoch
    # After the first epoch, an argument DataLoader reads at iter() is set on the loader:
    # "collate" (a collate_fn that marks its batches) or "init" (the worker_init_fn toggled)
    set_after: str | None = None

    def between_epochs(self) -> Any:
        """What the loop does to the loader after its first epoch (None: nothing)."""
        if self.set_after is None:
            return None
        collate, init = COLLATES[self.settings.collate], self.set_after == "init"

        def set_it(loader: Any) -> None:
            if init:
                loader.worker_init_fn = None if loader.worker_init_fn else reseed_in_worker
            else:
                loader.collate_fn = Marked(collate, batched=loader.batch_sampler is not None)

        return set_it

    def dataset(self, *, marks: bool = False) -> Any:
        """The case's dataset; ``marks``: its failing sample is ``SKIPPED`` instead."""
        if self.iterable:
            stream = Stream(
                self.n, self.payload, self.sharded, self.shuffle_stream, self.fail_at, self.goes_on
            )
            return shuffled_pipe(stream) if self.pipe else stream
        kind = BatchedSamples if self.getitems else Samples
        if self.waits and self.settings.workers == "auto":
            # Samples that wait, and enough of them (WAITED more, the failure among the
            # later ones) that workers="auto" measures it and makes them several at a time.
            fail_at = None if self.fail_at is None else self.fail_at + WAITED
            return kind(
                self.n + WAITED, self.payload, fail_at, wait_s=WAIT_S, marks=marks, held=self.held
            )
        return kind(self.n, self.payload, self.fail_at, marks=marks, held=self.held)


WAITED = 40
"""Samples a case whose samples wait has beyond its ``n``."""

WAIT_S = 0.002
"""How long each sample of such a case waits."""


def without_draws(payload: Payload) -> Payload:
    """``payload`` drawing from no global RNG."""
    return Payload(
        payload.leaf,
        payload.container,
        tuple(without_draws(p) for p in payload.items),
        None if payload.alternate is None else without_draws(payload.alternate),
        None,
    )


# ------------------------------------------------------------------------------ strategies


def leaves() -> st.SearchStrategy[Leaf]:
    """Tensors and arrays of every dtype and layout, and Python values."""
    shapes = st.sampled_from([(2, 3), (3,), (1, 2, 2), (4, 1)])

    def of(kind: str, dtypes: tuple[str, ...], layouts: tuple[str, ...]) -> Any:
        dtype, layout = st.sampled_from(dtypes), st.sampled_from(layouts)
        return st.builds(Leaf, kind=st.just(kind), dtype=dtype, layout=layout, shape=shapes)

    return st.one_of(
        of("tensor", TENSOR_DTYPES, TENSOR_LAYOUTS),
        of("array", ARRAY_DTYPES, ARRAY_LAYOUTS),
        st.builds(Leaf, kind=st.just("python"), dtype=st.sampled_from(PYTHON_VALUES)),
    )


def payloads(*, draws: tuple[str, ...] = (), alternate: bool = True) -> st.SearchStrategy[Payload]:
    """Payloads up to two containers deep; some draw one of ``draws`` (``DRAWS``)."""
    leaf = st.builds(Payload, leaf=leaves())
    tree = st.recursive(
        leaf,
        lambda inner: st.builds(
            Payload,
            container=st.sampled_from(CONTAINERS),
            items=st.lists(inner, min_size=1, max_size=3).map(tuple),
        ),
        max_leaves=4,
    )
    draw = st.sampled_from((None, *draws)) if draws else st.none()
    payload = st.builds(lambda p, d: Payload(p.leaf, p.container, p.items, None, d), tree, draw)
    if not alternate:
        return payload
    return st.one_of(
        payload,
        st.builds(lambda a, b: Payload(a.leaf, a.container, a.items, b), payload, payload),
    )


SAMPLERS = (
    "sequential",
    "random",
    "random_replacement",
    "subset",
    "in_iter",
    "tensor_keys",
    "numpy_keys",
    "distributed",
)
"""The samplers a case may name (None, the loader's own, is drawn beside them)."""

TYPED = ("tensor_keys", "numpy_keys")
"""The samplers whose keys are not ints: 0-d tensors, NumPy integers."""


def settings(*, contexts: tuple[str | None, ...] = (None,)) -> st.SearchStrategy[Settings]:
    return st.builds(
        Settings,
        workers=st.one_of(st.integers(0, 3), st.just("auto")),
        batch_size=st.one_of(st.none(), st.integers(1, 5)),
        drop_last=st.booleans(),
        shuffle=st.booleans(),
        sampler=st.sampled_from((None, None, *SAMPLERS)),
        batch_sampler=st.booleans(),
        empty_batch=st.sampled_from((False, False, False, True)),
        collate=st.sampled_from(("default", "default", "identity", "identity", "nothing")),
        in_order=st.booleans(),
        prefetch_factor=st.sampled_from((None, None, 1, 3)),
        persistent_workers=st.booleans(),
        context=st.sampled_from(contexts),
        pin_memory=st.booleans(),
        cache=st.booleans(),
        threads=st.booleans(),
        cut=st.sampled_from((False, False, False, True)),
        tight=st.sampled_from((False, False, False, True)),
        skip=st.sampled_from((False, False, False, True)),
        generator=st.sampled_from((None, None, None, 5)),
        init=st.sampled_from((False, False, False, True)),
        sampler_fails=st.sampled_from((None, None, None, 0, 1, 2, 3, 5)),
    )


def cases(
    *, contexts: tuple[str | None, ...] = (None,), draws: tuple[str, ...] = ()
) -> st.SearchStrategy[Case]:
    return st.builds(
        Case,
        n=st.integers(0, 13),
        payload=payloads(draws=draws),
        settings=settings(contexts=contexts),
        iterable=st.booleans(),
        sharded=st.booleans(),
        shuffle_stream=st.sampled_from((None, *RNGS)),
        fail_at=st.one_of(st.none(), st.integers(0, 12)),
        waits=st.booleans(),
        getitems=st.sampled_from((False, False, False, True)),
        pipe=st.sampled_from((False, False, False, True)),
        held=st.booleans(),
        goes_on=st.booleans(),
        peek=st.sampled_from((None, None, None, 0, 1, 3)),
        leave=st.sampled_from((None, None, None, 0, 1, 2)),
        set_after=st.sampled_from((None,) * 6 + ("collate", "init")),
    )
