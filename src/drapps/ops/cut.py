"""The offload share: a share of each batch's samples cut at the split, the rest made whole.

A Pipeline's split says which ops may run in the device stage; the offload share says for
how many samples they do. With share ``r`` each sample of a batch is *offloaded* (its ops
from the split on run batched in the device stage, e.g. nvJPEG decodes it) or made whole in
its worker (libjpeg-turbo decodes it there), as DALI's hybrid decode splits a batch between
its hardware decoder and its CUDA path. Which samples go is drawn from each sample's seed, so
a sample's fate depends on nothing but (seed, epoch, index) and the share; and every op draws
from the sample's own stream wherever it runs, so a batch holds the same samples, with the
same crops and flips, at every share (the pixels of a GPU-decoded image may differ from a
CPU-decoded one within the tolerance ``docs/device.md`` states).

Example:
    >>> cut = Cut(0, 0.5)
    >>> sum(cut.offloads(seed) for seed in range(10_000)) / 10_000
    0.5
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Cut:
    """A split with an offload share below 1: the task's and the batch's record of where
    its samples were cut."""

    split: int
    """The first op run in the device stage for an offloaded sample."""
    share: float
    """The share of samples offloaded, strictly between 0 and 1."""

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"Cut.share must be strictly between 0 and 1, got {self.share!r}")

    def offloads(self, sample_seed: int) -> bool:
        """Whether the sample seeded ``sample_seed`` is cut at the split (its draw, uniform in
        [0, 1) and independent of the seed's other uses, falls under the share)."""
        draw = ((int(sample_seed) * _GOLDEN) & _MASK64) >> 11
        return draw / float(1 << 53) < self.share


def cut_of(split: int, share: float, length: int) -> int | Cut:
    """What a batch is made with for ``split`` and ``share`` in a Pipeline of ``length`` ops:
    the split itself for share 1, the end (nothing offloaded) for share 0, else a Cut."""
    if share >= 1.0 or split >= length:
        return split
    if share <= 0.0:
        return length
    return Cut(split, share)


@dataclass
class Pending:
    """A sample's part cut at the split (one offloaded sample, on its way to the batch)."""

    value: Any


@dataclass
class Mixed:
    """A batch's transformed part with both kinds of samples: ``done`` (the samples made whole
    in the workers, stacked, at positions ``done_at``) and ``pending`` (the offloaded ones as
    cut at the split, a list, at positions ``pending_at``)."""

    done: Any
    done_at: list[int]
    pending: list[Any]
    pending_at: list[int]

    def __len__(self) -> int:
        return len(self.done_at) + len(self.pending_at)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Mixed:
        """A copy with ``fn`` applied to every tensor it holds (moving, pinning)."""

        def each(x: Any) -> Any:
            return fn(x) if isinstance(x, torch.Tensor) else x

        return Mixed(
            each(self.done), self.done_at, [each(x) for x in self.pending], self.pending_at
        )

    def pin_memory(self) -> Mixed:
        """Pinned for a non-blocking copy (torch's pin_memory calls this)."""
        return self.map_tensors(lambda t: t.pin_memory())


def merge(done: Any, done_at: list[int], made: torch.Tensor, made_at: list[int]) -> torch.Tensor:
    """The batch with ``done`` at positions ``done_at`` and ``made`` at ``made_at``, on
    ``made``'s device (the positions cover ``0..n-1`` once each)."""
    if not done_at:
        return made
    if not isinstance(done, torch.Tensor) or (done.shape[1:], done.dtype) != (
        made.shape[1:],
        made.dtype,
    ):
        raise ValueError(
            "offload: the samples made whole in the workers and those finished in the device "
            f"stage differ ({_describe(done)} against {_describe(made)}); the ops after the "
            "split must give every sample one shape and dtype"
        )
    out = torch.empty((len(done_at) + len(made_at), *made.shape[1:]), dtype=made.dtype,
                      device=made.device)  # fmt: skip
    device = made.device
    out.index_copy_(0, torch.tensor(made_at, device=device), made)
    out.index_copy_(0, torch.tensor(done_at, device=device), done.to(device))
    return out


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape[1:])}"
    return type(value).__name__
