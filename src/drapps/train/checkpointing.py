"""Activation checkpointing of a stack of blocks at ~sqrt(L) segments or under a memory budget.

A checkpointed segment keeps only its input for the backward pass and recomputes its insides
then (Chen et al. 2016). With L blocks in ``s`` segments the forward keeps ``s`` segment inputs
plus, during backward, one segment's activations at a time: about ``s + L/s`` block outputs,
smallest at ``s = sqrt(L)``, for one extra forward pass of compute.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def segment_bounds(blocks: int, segments: int) -> list[tuple[int, int]]:
    """Split ``blocks`` into ``segments`` contiguous ``[start, stop)`` ranges, sizes within one."""
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks!r}")
    if not 1 <= segments <= blocks:
        raise ValueError(f"segments must be in [1, {blocks}], got {segments!r}")
    base, extra = divmod(blocks, segments)
    bounds, start = [], 0
    for i in range(segments):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` of blocks whose forward checkpoints segments of them.

    Its state-dict keys are those of the plain stack (``0.weight``...), so checkpoints load either
    way. The first ``plain`` blocks run normally (a budget may leave room for them); the rest are
    cut into ``segments`` checkpointed segments. Checkpointing applies only while autograd
    records; evaluation runs straight through.

    Args:
        blocks: the blocks, each mapping one tensor to one tensor.
        segments: number of checkpointed segments; ``"sqrt"`` for ``round(sqrt(L))``.
        plain: leading blocks left out of checkpointing.
    """

    def __init__(self, blocks: Iterable[nn.Module], segments: int | str = "sqrt", plain: int = 0):
        super().__init__(*blocks)
        count = len(self) - plain
        if not 0 <= plain < len(self):
            raise ValueError(f"plain must be in [0, {len(self) - 1}], got {plain!r}")
        if segments == "sqrt":
            segments = max(1, round(math.sqrt(count)))
        if not isinstance(segments, int) or not 1 <= segments <= count:
            raise ValueError(
                f"segments must be 'sqrt' or an int in [1, {count}] for {count} checkpointed "
                f"blocks, got {segments!r}"
            )
        self.segments = segments
        self.plain = plain
        self.bounds = [(plain + a, plain + b) for a, b in segment_bounds(count, segments)]
        self.enabled = True

    def _run(self, start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(start, stop):
            x = self[i](x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.enabled and torch.is_grad_enabled()):
            return self._run(0, len(self), x)
        x = self._run(0, self.plain, x)
        for start, stop in self.bounds:
            x = checkpoint(self._run, start, stop, x, use_reentrant=False)
        return x


def checkpoint_blocks(
    blocks: Iterable[nn.Module],
    segments: int | str = "sqrt",
    *,
    budget_bytes: int | None = None,
    example: torch.Tensor | None = None,
) -> CheckpointedSequential:
    """Checkpoint a stack of blocks at ``segments`` segments, or just enough to fit a budget.

    Args:
        blocks: an ``nn.Sequential`` or ``nn.ModuleList`` of one-tensor-in, one-tensor-out blocks.
            The model must call the returned module (``x = self.blocks(x)``) rather than loop
            over it.
        segments: ``"sqrt"`` or a count.
        budget_bytes: if given, the activation memory (bytes kept for backward by this stack) to
            stay under: blocks are measured on ``example`` and as few as possible are
            checkpointed, which saves recompute.
        example: an input for the stack, needed with ``budget_bytes``.

    Example:
        >>> from torch import nn
        >>> stack = checkpoint_blocks(nn.Sequential(*[nn.Linear(8, 8) for _ in range(9)]))
        >>> stack.bounds
        [(0, 3), (3, 6), (6, 9)]
    """
    if budget_bytes is None:
        return CheckpointedSequential(list(blocks), segments)
    if example is None:
        raise ValueError("budget_bytes needs an example input to measure the blocks on")
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes!r}")
    sizes, inputs = _block_activation_bytes(list(blocks), example)
    best: CheckpointedSequential | None = None
    # Leave the most leading blocks plain that still fits; recompute falls with every plain block.
    for plain in range(len(sizes) - 1, -1, -1):
        rest = len(sizes) - plain
        count = max(1, round(math.sqrt(rest))) if segments == "sqrt" else min(int(segments), rest)
        bounds = [(plain + a, plain + b) for a, b in segment_bounds(rest, count)]
        kept = sum(sizes[:plain]) + sum(inputs[a] for a, _ in bounds)
        peak = kept + max(sum(sizes[a:b]) for a, b in bounds)
        if peak <= budget_bytes:
            best = CheckpointedSequential(list(blocks), count, plain=plain)
            break
    if best is None:
        raise ValueError(
            f"no checkpointing plan fits {budget_bytes} bytes: even fully checkpointed the stack "
            f"needs about {peak} bytes for this input"
        )
    return best


def _block_activation_bytes(
    blocks: list[nn.Module], example: torch.Tensor
) -> tuple[list[int], list[int]]:
    """Bytes each block keeps for backward, and the bytes of each block's input."""
    sizes, inputs = [], []
    x = example.detach().requires_grad_(example.is_floating_point())
    for block in blocks:
        inputs.append(x.numel() * x.element_size())
        with saved_activations() as counter:
            y = block(x)
        sizes.append(counter.bytes)
        x = y.detach().requires_grad_(y.is_floating_point())
    return sizes, inputs


class _SavedBytes:
    def __init__(self) -> None:
        self.bytes = 0
        self._seen: set[tuple[int, int]] = set()


@contextlib.contextmanager
def saved_activations() -> Iterator[_SavedBytes]:
    """Count the bytes autograd keeps for backward in this block (each storage once).

    Parameters are not activations and are not counted. Inside a checkpointed segment only the
    segment's input is kept, and it is counted like any saved tensor.
    """
    counter = _SavedBytes()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # Weights are not activations, also when saved as a view (a Linear saves weight.t()).
        if not isinstance(tensor, nn.Parameter) and not isinstance(tensor._base, nn.Parameter):
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in counter._seen:
                counter._seen.add(key)
                counter.bytes += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter


@dataclass(frozen=True)
class ActivationReport:
    """What checkpointing saves and costs on one input."""

    plain_bytes: int
    """Activation bytes kept for backward without checkpointing."""
    checkpointed_bytes: int
    """The same with checkpointing."""
    plain_seconds: float
    """Median forward+backward time without checkpointing."""
    checkpointed_seconds: float
    """Median forward+backward time with it."""

    @property
    def saved_fraction(self) -> float:
        return 1.0 - self.checkpointed_bytes / self.plain_bytes if self.plain_bytes else 0.0

    @property
    def recompute_overhead(self) -> float:
        return self.checkpointed_seconds / self.plain_seconds - 1.0

    def describe(self) -> str:
        return (
            f"checkpointing: activations {self.plain_bytes / 2**20:.1f} -> "
            f"{self.checkpointed_bytes / 2**20:.1f} MiB ({100 * self.saved_fraction:.0f}% saved), "
            f"forward+backward {1000 * self.plain_seconds:.1f} -> "
            f"{1000 * self.checkpointed_seconds:.1f} ms ({100 * self.recompute_overhead:+.0f}%)"
        )


def activation_report(
    model: nn.Module,
    stack: CheckpointedSequential,
    run: Callable[[], torch.Tensor],
    repeats: int = 3,
) -> ActivationReport:
    """Measure ``run()`` (a forward returning a loss) with ``stack`` checkpointed and without.

    Memory is counted from autograd's saved tensors (device independent); time is the median of
    ``repeats`` forward+backward passes of each, interleaved.
    """
    results: dict[bool, tuple[int, list[float]]] = {}
    for enabled in [True, False] * repeats:
        stack.enabled = enabled
        start = time.perf_counter()
        with saved_activations() as counter:
            loss = run()
        loss.backward()
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        results.setdefault(enabled, (counter.bytes, []))[1].append(seconds)
    stack.enabled = True
    return ActivationReport(
        plain_bytes=results[False][0],
        checkpointed_bytes=results[True][0],
        plain_seconds=statistics.median(results[False][1]),
        checkpointed_seconds=statistics.median(results[True][1]),
    )
