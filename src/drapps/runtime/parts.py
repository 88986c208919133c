"""A batch made in parts: its samples come back from several workers, uncollated, and are put
back in plan order and collated once in the training process (the dispatcher thread)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from drapps.runtime.reorder import Entry


@dataclass
class PartialBatch:
    """The parts of one batch received so far.

    Args:
        indices: the batch's indices, in plan order.
        positions: each part's positions in the batch.
        opened_at: when its first part was sent (the batch's latency starts there).
    """

    indices: list[Any]
    positions: dict[int, tuple[int, ...]]
    opened_at: float
    split: Any = None
    samples: dict[int, Any] = field(default_factory=dict)
    skipped: dict[int, tuple[Any, str]] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    received: set[int] = field(default_factory=set)
    nbytes: int = 0
    slow: bool = False
    """One of its samples was slow (see :data:`drapps.runtime.cost.SLOW`)."""

    def has(self, part: int) -> bool:
        return part in self.received

    @property
    def complete(self) -> bool:
        return len(self.received) == len(self.positions)

    def add(
        self,
        part: int,
        samples: Sequence[Any],
        kept: Sequence[int],
        skipped: Sequence[tuple[Any, str]],
        nbytes: int,
    ) -> None:
        """Part ``part`` arrived: ``samples`` at the part's positions ``kept`` (local to the
        part), the rest skipped under ``on_error="skip"``."""
        places = self.positions[part]
        for local, sample in zip(kept, samples, strict=True):
            self.samples[places[local]] = sample
        kept_set = set(kept)
        lost = [p for local, p in enumerate(places) if local not in kept_set]
        for place, entry in zip(lost, skipped, strict=True):
            self.skipped[place] = entry
        self.nbytes += nbytes
        self.received.add(part)

    def fail(self, part: int, error: BaseException) -> None:
        """Part ``part`` could not be made: the batch raises ``error`` (or the error of an
        earlier sample, whichever part holds it)."""
        self.errors[part] = error
        self.received.add(part)

    def skip(self, part: int, message: str) -> None:
        """Part ``part`` could not be made and ``on_error="skip"``: its samples are skipped."""
        for place in self.positions[part]:
            self.skipped[place] = (self.indices[place], message)
        self.received.add(part)

    def outcome(self, collate: Callable[[list[Any], list[Any]], Any]) -> Entry:
        """The batch's entry: the parts' samples collated in plan order by
        ``collate(samples, indices)``, or the error of its first failing sample."""
        skipped = [self.skipped[p] for p in sorted(self.skipped)]
        if self.errors:
            return Entry(error=self.errors[min(self.errors, key=self._first_place)])
        places = sorted(self.samples)
        if not places:
            return Entry(skipped=skipped, split=self.split)
        samples = [self.samples.pop(p) for p in places]
        try:
            batch = collate(samples, [self.indices[p] for p in places])
        except Exception as exc:  # collate_samples names the batch in a SampleError
            return Entry(error=exc)
        return Entry(batch=batch, nbytes=self.nbytes, skipped=skipped, split=self.split)

    def _first_place(self, part: int) -> int:
        """Where a failed part's failing sample sits in the batch (the part's start if the
        error does not say)."""
        index = getattr(self.errors[part], "index", None)
        places = self.positions[part]
        return next((p for p in places if self.indices[p] == index), places[0])


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors in a collated batch (dicts, lists and tuples of tensors)."""
    stack = [batch]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def largest_tensor(batch: Any) -> torch.Tensor | None:
    """The largest tensor in a collated batch (dicts, lists and tuples of tensors)."""
    return max(_tensors(batch), key=held_bytes, default=None)


def tensor_bytes(batch: Any) -> int:
    """Bytes of the tensors in a collated batch (dicts, lists and tuples of tensors)."""
    return sum(held_bytes(tensor) for tensor in _tensors(batch))


def held_bytes(tensor: torch.Tensor) -> int:
    """Bytes ``tensor`` holds: its elements' for a strided tensor; its indices' and values'
    for a sparse one (which has no ``nbytes``); its elements' at their size otherwise.

    >>> held_bytes(torch.eye(3).to_sparse())  # 3 nonzeros: 2 x 3 int64 indices, 3 floats
    60
    """
    layout = tensor.layout
    parts: tuple[torch.Tensor, ...]
    if layout is torch.strided:
        return tensor.nbytes
    if layout is torch.sparse_coo:
        parts = (tensor._indices(), tensor._values())
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = (tensor.ccol_indices(), tensor.row_indices(), tensor.values())
    else:
        return tensor.numel() * tensor.element_size()
    return sum(part.nbytes for part in parts)


def on_free(batch: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` once the batch's largest tensor is garbage-collected, in this process
    only (:func:`in_owner`); False (and no call) when the batch holds no tensor."""
    tensor = largest_tensor(batch)
    if tensor is None:
        return False
    weakref.finalize(tensor, in_owner, os.getpid(), callback)
    return True


def in_owner(owner: int, function: Callable[..., None], *args: Any) -> None:
    """``function(*args)``, in the process ``owner`` only: finalizers are inherited by forked
    children, which run them when they drop their copies or exit. There they would count,
    release or lock what is their parent's (a lock another thread held at the fork stays
    held in the child, and a finalizer waiting on it would never let the child exit)."""
    if os.getpid() == owner:
        function(*args)
