"""Where an epoch's order comes from: DataLoader's sampler rules, seeds, and rank sharding.

``drapps.Loader`` accepts DataLoader's ``sampler``, ``batch_sampler``, ``shuffle``,
``batch_size=None`` and ``generator`` with DataLoader's meaning and DataLoader's checks. Without an
explicit ``seed`` the epoch's base seed and the default samplers draw from torch's global
generator (or ``generator``) in the order DataLoader draws them, so the same
``torch.manual_seed`` gives the same batches. The epoch's batches are drawn from the sampler once,
when the epoch starts (:class:`~drapps.runtime.plan.SampledPlan`), which is what keeps them the same
whatever the worker pool does; torch's own samplers, whose draws all come with their first batch,
are drawn as they are needed (:class:`~drapps.runtime.plan.DrawnPlan`).
"""

from __future__ import annotations

import base64
import logging
import math
import operator
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)

from drapps.runtime.errors import ArgumentError, warn_user

logger = logging.getLogger(__name__)


def is_iterable_dataset(dataset: Any) -> bool:
    """An ``IterableDataset``, or any object that can be iterated but not indexed.

    A class with ``__iter__`` and ``__len__`` but no ``__getitem__`` is a stream, never a
    map-style dataset.
    """
    if isinstance(dataset, IterableDataset):
        return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def check_dataset(dataset: Any) -> None:
    """Raise ArgumentError when ``dataset`` is neither map-style nor iterable."""
    if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
        raise ArgumentError(
            "dataset must be a map-style dataset (__getitem__, and __len__ for the default "
            f"samplers) or an iterable dataset (__iter__), got {type(dataset).__name__}"
        )


def check_sampling(
    dataset: Any,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
) -> None:
    """DataLoader's rules for combining these arguments, in its words (scripts match them).
    ``shuffle`` is taken for its truth, as DataLoader takes it."""
    if is_iterable_dataset(dataset):
        if shuffle not in (False, None) and not is_datapipe(dataset):
            raise ArgumentError(
                "DataLoader with IterableDataset: expected unspecified shuffle option, "
                f"but got shuffle={shuffle}"
            )
        if sampler is not None:
            raise ArgumentError(
                "DataLoader with IterableDataset: expected unspecified sampler option, "
                f"but got sampler={sampler}"
            )
        if batch_sampler is not None:
            raise ArgumentError(
                "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                f"but got batch_sampler={batch_sampler}"
            )
    if sampler is not None and shuffle:
        raise ArgumentError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ArgumentError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                "and drop_last"
            )
    elif batch_size is None:
        if drop_last:
            raise ArgumentError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
    elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
    for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value is not None and not hasattr(value, "__iter__"):
            raise ArgumentError(f"{name} must be an iterable (a Sampler), got {value!r}")
    no_sampler = sampler is None and batch_sampler is None
    if no_sampler and not is_iterable_dataset(dataset) and not hasattr(dataset, "__len__"):
        raise ArgumentError(
            f"dataset {type(dataset).__name__} has no __len__: give a sampler or "
            "batch_sampler that yields its keys"
        )


def default_sampler(dataset: Any, shuffle: bool, generator: torch.Generator | None) -> Sampler:
    """The sampler DataLoader builds when none is given."""
    if is_iterable_dataset(dataset):
        from torch.utils.data.dataloader import _InfiniteConstantSampler

        return _InfiniteConstantSampler()
    if shuffle:
        return RandomSampler(dataset, generator=generator)
    return SequentialSampler(dataset)


def draw_base_seed(generator: torch.Generator | None) -> int:
    """An epoch's base seed, drawn exactly as DataLoader's iterator draws it."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def generator_state(generator: torch.Generator) -> str:
    """``generator``'s state as plain data for a checkpoint (base64 of its bytes)."""
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def checked_generator_state(text: Any, generator: torch.Generator, name: str) -> torch.Tensor:
    """A state :func:`generator_state` gave, for ``generator`` (tried on a generator of its
    device first, so a refused one leaves ``generator`` as it was).

    Raises:
        ValueError: ``text`` is not such a state (``name`` names it).
    """
    try:
        state = torch.frombuffer(
            bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8
        )
        torch.Generator(device=generator.device).set_state(state)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a generator state from state_dict(): {exc}") from None
    return state


def readable_keys(index_sampler: Any, batches: bool) -> list[Any] | None:
    """A few keys ``index_sampler`` gives (its first two and its last), read without drawing
    from it, where it holds them in a sequence: a tensor, an array or a list used as the
    sampler, a ``SubsetRandomSampler``'s indices, a ``BatchSampler``'s sampler's, or, for a
    batch sampler (``batches``), a list of batches. None where they cannot be read so
    (torch's other samplers give ints of ``range(len(dataset))``)."""
    if isinstance(index_sampler, BatchSampler):
        return readable_keys(index_sampler.sampler, batches=False)
    if isinstance(index_sampler, SubsetRandomSampler):
        index_sampler = index_sampler.indices
    if isinstance(index_sampler, torch.Tensor | np.ndarray) and index_sampler.ndim != 1:
        return None
    if not isinstance(index_sampler, torch.Tensor | np.ndarray | list | tuple | range):
        return None
    size = len(index_sampler)
    keys: list[Any] = [index_sampler[p] for p in sorted({0, 1, size - 1}) if 0 <= p < size]
    if not batches:
        return keys
    if not all(isinstance(batch, list | tuple) for batch in keys):
        return None
    ends = [batch for batch in (keys[:1] + keys[-1:]) if len(batch)]
    return [batch[p] for batch in ends for p in sorted({0, len(batch) - 1})]


def key_of(index: Any) -> int:
    """An integer for seeding from whatever the sampler yields (ints, NumPy or 0-d tensors)."""
    try:
        return operator.index(index)
    except TypeError:
        import zlib

        return zlib.crc32(repr(index).encode())


def plain_key(index: Any) -> Any:
    """A sampler's key as plain data for a checkpoint (ints stay ints)."""
    try:
        return operator.index(index)
    except TypeError:
        return index


def key_type(batches: Iterable[list[Any]]) -> str | None:
    """The type a checkpoint restores its keys to, where every key of ``batches`` is a 0-d
    integer tensor or a NumPy integer, all of one dtype (``"torch.int32"``, ``"numpy.int64"``;
    None: any other keys, which stay as :func:`plain_key` stores them). A sampler over a
    tensor of indices (``SubsetRandomSampler(torch.where(mask)[0])``) gives tensors, and the
    resumed epoch's ``__getitem__`` gets them as the uninterrupted run's did."""
    found = None
    for batch in batches:
        for key in batch:
            if isinstance(key, torch.Tensor) and key.dim() == 0 and _integer(key.dtype):
                name = str(key.dtype)
            elif isinstance(key, np.integer):
                name = f"numpy.{key.dtype.name}"
            else:
                return None
            if found not in (None, name):
                return None
            found = name
    return found


def restore_keys(batches: list[list[Any]], name: Any) -> list[list[Any]]:
    """A checkpoint's integer keys as the type :func:`key_type` named.

    Raises:
        ValueError: ``name`` is not a torch or NumPy integer dtype, or a key is not an
            integer of its range.
    """
    kind = _key_kind(name)
    try:
        return [[kind(operator.index(key)) for key in batch] for batch in batches]
    except (TypeError, OverflowError, RuntimeError) as exc:
        raise ValueError(f"state batches must hold integer keys of {name}: {exc}") from exc


def _key_kind(name: Any) -> Any:
    if isinstance(name, str) and name.startswith("torch."):
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if isinstance(dtype, torch.dtype) and _integer(dtype):
            return lambda key: torch.tensor(key, dtype=dtype)
    if isinstance(name, str) and name.startswith("numpy."):
        try:
            dtype = np.dtype(name.removeprefix("numpy."))
        except TypeError:
            dtype = None
        if dtype is not None and dtype.kind in "iu":
            return dtype.type
    raise ValueError(
        f"state key_type must name a torch or NumPy integer dtype (such as 'torch.int64' or "
        f"'numpy.int64'), got {name!r}"
    )


_INTEGER_DTYPES = frozenset(
    {torch.uint8, torch.uint16, torch.uint32, torch.uint64}
    | {torch.int8, torch.int16, torch.int32, torch.int64}
)


def _integer(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is a plain integer one (not bool, floating, complex or quantized)."""
    return dtype in _INTEGER_DTYPES


def drawn_as_needed(index_sampler: Any, auto_collation: bool) -> bool:
    """Whether ``index_sampler``'s batches may be drawn as they are needed (a
    :class:`~drapps.runtime.plan.DrawnPlan`): torch's own ``BatchSampler`` over its own
    ``SequentialSampler``, or ``RandomSampler`` without a generator (it seeds a private one
    with its first draw), whose lengths are exact and whose later draws touch nothing shared."""
    if not auto_collation or type(index_sampler) is not BatchSampler:
        return False
    sampler = index_sampler.sampler
    if type(sampler) is SequentialSampler:
        return True
    return type(sampler) is RandomSampler and sampler.generator is None


def runs_out_late(
    index_sampler: Any, auto_collation: bool
) -> tuple[RandomSampler, tuple[int, bool] | None] | None:
    """torch's ``RandomSampler`` over its whole dataset with a generator of its own, under
    torch's own ``BatchSampler`` or alone, with that batch sampler's batch size and
    ``drop_last`` (None: alone); else None. Its one draw past its first key is at the
    ``next()`` that finds its pass over (:class:`~drapps.runtime.plan.RunsOut`)."""
    batching: tuple[int, bool] | None = None
    sampler = index_sampler
    if auto_collation:
        if type(index_sampler) is not BatchSampler:
            return None
        sampler = index_sampler.sampler
        batching = (index_sampler.batch_size, index_sampler.drop_last)
    if type(sampler) is not RandomSampler or sampler.generator is None or sampler.replacement:
        return None
    try:
        whole = sampler.num_samples == len(sampler.data_source)
    except TypeError:  # a data source without len()
        return None
    return (sampler, batching) if whole else None


def draw_batches(index_sampler: Iterable[Any], auto_collation: bool) -> tuple[list[Any], ...]:
    """Every batch of one pass over ``index_sampler`` (a batch sampler, or a sampler of keys)."""
    return tuple(batch_lists(index_sampler, auto_collation))


def batch_lists(index_sampler: Iterable[Any], auto_collation: bool) -> Iterator[list[Any]]:
    """The batches of one pass over ``index_sampler``, as lists of keys, drawn as asked."""
    if auto_collation:
        return (list(batch) for batch in index_sampler)
    return ([key] for key in index_sampler)


def planned_length(index_sampler: Any) -> int | None:
    """``len(index_sampler)``, or None where it has none (an endless sampler's may raise)."""
    try:
        return operator.index(len(index_sampler))
    except Exception:  # no __len__, or one that refuses (an endless sampler's may)
        return None


def world() -> tuple[int, int] | None:
    """(rank, world size) under an initialised ``torch.distributed`` of several ranks, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size()
    return (dist.get_rank(), size) if size > 1 else None


def is_distributed(sampler: Any) -> bool:
    """Whether ``sampler`` (or a batch sampler's sampler) already picks this rank's share."""
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        if isinstance(candidate, DistributedSampler):
            return True
        if hasattr(candidate, "num_replicas") and hasattr(candidate, "rank"):
            return True
    return False


def rank_shard(
    dataset: Any,
    rank: int,
    size: int,
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    batch_size: int | None,
    drop_last: bool,
) -> BatchSampler | DistributedSampler:
    """This rank's share: what ``DistributedSampler(shuffle, seed, drop_last)`` at ``epoch``
    gives, batched as the loader batches."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    if batch_size is None:
        return sampler
    return BatchSampler(sampler, batch_size, drop_last)


def stream_length(dataset: Any, batch_size: int | None, drop_last: bool) -> int:
    """``len()`` of a loader over an iterable dataset, as DataLoader computes it."""
    length = len(dataset)
    if batch_size is None:
        return length
    return length // batch_size if drop_last else math.ceil(length / batch_size)


def is_datapipe(dataset: Any) -> bool:
    """Whether ``dataset`` is one of torch's (deprecated) IterDataPipes."""
    try:
        from torch.utils.data import IterDataPipe
    except ImportError:  # a torch that no longer has them
        return False
    return isinstance(dataset, IterDataPipe)


def pipe_shufflers(pipe: Any) -> list[Any]:
    """The shuffling steps (``.shuffle()``) of the datapipe ``pipe``'s graph."""
    from torch.utils.data import graph_settings

    steps = graph_settings.get_all_graph_pipes(graph_settings.traverse_dps(pipe))
    return [step for step in steps if graph_settings._is_shuffle_datapipe(step)]


def set_pipe_shuffles(dataset: Any, shuffle: bool | None) -> None:
    """As DataLoader does with a datapipe: a ``shuffle`` given turns the pipe's shuffling
    steps on or off, in place (``shuffle=False`` turns off a pipe's ``.shuffle()``); None
    leaves them as they are. ``shuffle=True`` with a pipe that has no ``.shuffle()`` leaves
    it unshuffled, as DataLoader does (it warns that it adds one, then iterates the pipe
    without it), and says so. Any other dataset is left alone."""
    if shuffle is None or not is_datapipe(dataset):
        return
    steps = pipe_shufflers(dataset)
    if shuffle and not steps:
        warn_user(
            f"drapps: shuffle=True, but the IterDataPipe {type(dataset).__name__} has no "
            ".shuffle(): it is not shuffled (nor under DataLoader, which says it adds one, "
            "then iterates the pipe without it); add .shuffle() to the pipe where it should "
            "shuffle, before its .sharding_filter()"
        )
    for step in steps:
        step.set_shuffle(bool(shuffle))
