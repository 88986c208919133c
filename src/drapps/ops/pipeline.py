"""Pipeline: ops in order, checked when built, cut at a split point into two stages.

``ops[:split]`` run in the workers on each sample (the *sample stage*); ``ops[split:]``, which
must all be batchable, run in the training process on each collated batch after the reorder
buffer (the *batch stage*, on the loader's ``device``, see :class:`~drapps.ops.DeviceStage`).
A split is valid where every op after it is batchable and what reaches it is a tensor. Where
the samples have one shape collation stacks them; where they differ (decoded photos) the batch
stage gets a list of them (:meth:`Pipeline.gather`); a batch op takes either. With
``split=len(ops)`` (the default) everything runs in the workers, as a plain transform would.

Every op draws its random parameters from its own per-sample stream (seed, epoch, index, op
position), so batch ``b`` is the same whatever the split.

Example:
    >>> import numpy as np, torch, drapps
    >>> from drapps.ops import Normalize, Pipeline, RandomHorizontalFlip, ToCHWTensor
    >>> ops = Pipeline([ToCHWTensor(), RandomHorizontalFlip(), Normalize([0.5], [0.5])], split=1)
    >>> ops.split_points()
    [1, 2, 3]
    >>> images = [np.full((2, 2, 1), i, dtype=np.uint8) for i in range(4)]
    >>> with drapps.Loader(images, batch_size=2, transform=ops, workers=0, seed=0) as loader:
    ...     [tuple(batch.shape) for batch in loader]
    [(2, 1, 2, 2), (2, 1, 2, 2)]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from drapps.ops.cut import Cut, Mixed, Pending, merge
from drapps.ops.op import ANY, Op, Opaque, Spec, as_op
from drapps.runtime.seeding import op_rng, op_stream


class Pipeline:
    """Ops applied in order to each sample, or to the part ``key`` of it.

    Args:
        ops: :class:`~drapps.ops.op.Op` instances or any callables (opaque sample ops).
        split: index of the first op run on batches after the reorder buffer; None: none.
        key: apply the ops to ``sample[key]`` only (e.g. 0 for ``(image, label)`` pairs), and
            to ``batch[key]`` in the batch stage; None: the whole sample.
        takes: the spec of what the first op receives, when known (checks the first op).

    Raises:
        ValueError: an op cannot take what the op before it gives (naming both and the
            position), or ``split`` is not a valid split point (listing the valid ones).
    """

    def __init__(
        self,
        ops: Sequence[Any],
        *,
        split: int | None = None,
        key: Hashable | None = None,
        takes: Spec = ANY,
    ) -> None:
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise ValueError(f"ops must be a sequence of ops or callables, got {ops!r}")
        self.ops: list[Op] = [as_op(op) for op in ops]
        self.key = key
        self.specs = [takes]
        """What flows into op ``i`` (``specs[i]``) and out of the last (``specs[-1]``)."""
        for position, op in enumerate(self.ops):
            try:
                self.specs.append(op.declare(self.specs[-1]))
            except ValueError as exc:
                raise ValueError(f"op {position} of the pipeline: {exc}") from None
        self.split = len(self.ops)
        if split is not None:
            self.set_split(split)

    def split_points(self) -> list[int]:
        """Every valid split, in increasing order (``len(ops)`` always is)."""
        points = [len(self.ops)]
        for k in range(len(self.ops) - 1, -1, -1):
            # What crosses must be known: tensors are stacked (or listed), bytes and arrays
            # listed; and what leaves the stage must be a tensor collation would have made.
            if not self.ops[k].batchable or not self.specs[k].known:
                break
            if self.specs[-1].kind != "tensor":
                break
            points.append(k)
        return sorted(points)

    def deterministic_prefix(self) -> int:
        """How many ops, from the first, give the same output for the same input every time:
        those before the first :attr:`~drapps.ops.op.Op.random` op or opaque callable (which
        may draw randomness drapps cannot see). A sample cache may keep their output."""
        for position, op in enumerate(self.ops):
            if op.random or isinstance(op, Opaque):
                return position
        return len(self.ops)

    def set_split(self, split: int) -> None:
        """Move the split point.

        Raises:
            ValueError: ``split`` is not one of :meth:`split_points`.
        """
        self.split = check_split(split, self.split_points())

    def ragged(self, split: int) -> bool:
        """Whether samples cut at ``split`` may differ in shape (no op before it declares
        them uniform)."""
        return split < len(self.ops) and not self.specs[split].uniform

    def stop_of(self, cut: int | Cut | None) -> int:
        """The first op a batch made with ``cut`` may leave to the batch stage (the end for
        None: the whole pipeline runs in the workers)."""
        if cut is None:
            return len(self.ops)
        return cut.split if isinstance(cut, Cut) else cut

    def run_cut(self, sample: Any, start: int, cut: int | Cut | None, sample_seed: int) -> Any:
        """Ops ``start..`` on one sample up to where ``cut`` cuts it: the split, or, for a
        :class:`~drapps.ops.cut.Cut`, the split if the sample is offloaded (its part then
        marked :class:`~drapps.ops.cut.Pending`) and the end if not."""
        if not isinstance(cut, Cut):
            return self.run_sample(sample, start, self.stop_of(cut))
        if not cut.offloads(sample_seed):
            return self.run_sample(sample, start, len(self.ops))
        made = self.run_sample(sample, start, cut.split)
        return (
            Pending(made) if self.key is None else _replace(made, self.key, Pending(made[self.key]))
        )

    def collate(
        self, samples: list[Any], collate: Callable[[list[Any]], Any], split: int | Cut
    ) -> Any:
        """Collate samples cut at ``split``: by ``collate`` when the parts the ops transform
        have one shape, else :meth:`gather`. Either kind of batch gives the same result in
        the batch stage. Under a :class:`~drapps.ops.cut.Cut` the part is
        :class:`~drapps.ops.cut.Mixed`: the whole samples stacked, the offloaded ones listed."""
        if isinstance(split, Cut):
            return self._collate_mixed(samples, collate)
        if split < len(self.ops) and self.specs[split].kind != "tensor":
            return self.gather(samples, collate)  # bytes or arrays: the stage takes a list
        if self.ragged(split):
            shapes = {tuple(getattr(self._part(s), "shape", ())) for s in samples}
            if len(shapes) > 1:
                return self.gather(samples, collate)
        return collate(samples)

    def _collate_mixed(self, samples: list[Any], collate: Callable[[list[Any]], Any]) -> Any:
        parts = [self._part(sample) for sample in samples]
        done_at = [i for i, part in enumerate(parts) if not isinstance(part, Pending)]
        pending_at = [i for i, part in enumerate(parts) if isinstance(part, Pending)]
        done = collate([parts[i] for i in done_at]) if done_at else None
        mixed = Mixed(done, done_at, [parts[i].value for i in pending_at], pending_at)
        if self.key is None:
            return mixed
        rest = collate([_replace(sample, self.key, 0) for sample in samples])
        return _replace(rest, self.key, mixed)

    def _part(self, sample: Any) -> Any:
        """What the ops transform: ``sample[key]``, or the whole sample (or batch)."""
        return sample if self.key is None else sample[self.key]

    def gather(self, samples: list[Any], collate: Callable[[list[Any]], Any]) -> Any:
        """Collate samples whose transformed parts differ in shape: those parts become a list
        (in batch order), the rest goes through ``collate``."""
        if self.key is None:
            return list(samples)
        parts = [self._part(sample) for sample in samples]
        rest = collate([_replace(sample, self.key, 0) for sample in samples])
        return _replace(rest, self.key, parts)

    def __call__(self, sample: Any) -> Any:
        """Every op on one sample (the pipeline used as a plain transform)."""
        return self.run_sample(sample, 0, len(self.ops))

    def run_sample(self, sample: Any, start: int, stop: int) -> Any:
        """Ops ``start..stop-1`` on one sample, each from its own random stream."""
        value = self._part(sample)
        for position in range(start, stop):
            with op_stream(position):
                value = self.ops[position](value)
        return value if self.key is None else _replace(sample, self.key, value)

    def run_batch(
        self, batch: Any, sample_seeds: Sequence[int], start: int | Cut, *, piece: int | None = None
    ) -> Any:
        """Ops ``start..`` on a collated batch whose samples were seeded ``sample_seeds`` (in
        batch order); a random op draws sample ``i``'s parameters from the same stream
        :meth:`run_sample` gives it. Under a :class:`~drapps.ops.cut.Cut` only the offloaded
        samples run them, and the batch is merged back in order. ``piece``: run the ops on at
        most this many samples at a time (less device memory at once; the same result)."""
        value = self._part(batch)
        if isinstance(start, Cut):
            value = self._finish_mixed(value, sample_seeds, start, piece)
        else:
            value = self._run_pieces(value, sample_seeds, start, piece)
        return value if self.key is None else _replace(batch, self.key, value)

    def _run_pieces(
        self, value: Any, sample_seeds: Sequence[int], start: int, piece: int | None
    ) -> Any:
        """:meth:`_run_ops` over pieces of at most ``piece`` samples, joined in order."""
        n = len(sample_seeds)
        if piece is None or piece >= n or not isinstance(value, list | torch.Tensor):
            return self._run_ops(value, sample_seeds, start)
        made = [
            self._run_ops(value[i : i + piece], sample_seeds[i : i + piece], start)
            for i in range(0, n, piece)
        ]
        if all(isinstance(m, torch.Tensor) for m in made):
            return torch.cat(made)
        return _stacked([row for m in made for row in m])

    def _run_ops(self, value: Any, sample_seeds: Sequence[int], start: int) -> Any:
        for position in range(start, len(self.ops)):
            op = self.ops[position]
            rngs = [op_rng(seed, position) for seed in sample_seeds] if op.random else None
            try:
                value = op.apply_batch(value, rngs)
            except Exception as exc:
                exc.drapps_op = f"op {position} ({op!r})"  # type: ignore[attr-defined]
                raise
        return _stacked(value)

    def _finish_mixed(
        self, value: Any, sample_seeds: Sequence[int], cut: Cut, piece: int | None
    ) -> Any:
        """The offloaded samples through the ops from the split, merged with the whole ones."""
        if not isinstance(value, Mixed):
            raise ValueError(f"a batch made with {cut} must hold a Mixed part, got {value!r}")
        if not value.pending:
            return value.done
        seeds = [sample_seeds[i] for i in value.pending_at]
        made = self._run_pieces(value.pending, seeds, cut.split, piece)
        if not isinstance(made, torch.Tensor):
            raise ValueError(
                f"offload: the ops from {cut.split} on gave {type(made).__name__}, not one "
                "tensor for the offloaded samples of a batch"
            )
        return merge(value.done, value.done_at, made, value.pending_at)

    def __repr__(self) -> str:
        return f"Pipeline({self.ops!r}, split={self.split}, key={self.key!r})"


def _stacked(value: Any) -> Any:
    """A list of same-shaped tensors stacked, as collation stacks them in the workers; anything
    else as it is."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(x, torch.Tensor) for x in value)
        and len({(x.shape, x.dtype, x.device) for x in value}) == 1
    ):
        return torch.stack(value)
    return value


def _replace(container: Any, key: Hashable, value: Any) -> Any:
    """``container`` with ``container[key]`` set to ``value`` (tuples and lists are copied)."""
    if isinstance(container, tuple):
        items = list(container)
        items[key] = value  # type: ignore[call-overload]
        return type(container)(*items) if hasattr(container, "_fields") else tuple(items)
    if isinstance(container, list):
        items = list(container)
        items[key] = value  # type: ignore[call-overload]
        return items
    if isinstance(container, dict):
        return {**container, key: value}
    raise ValueError(
        f"Pipeline(key={key!r}) needs samples that are tuples, lists or dicts, got "
        f"{type(container).__name__}"
    )


def check_split(split: Any, valid: list[int]) -> int:
    """``split`` as an int, if it is one of ``valid``: integers (NumPy's included) are taken;
    floats, booleans and anything else are refused, even when equal to a valid point.

    Raises:
        ValueError: naming the valid points and what was given.
    """
    if isinstance(split, (bool, np.bool_)) or not isinstance(split, (int, np.integer)):
        raise ValueError(f"split must be an int, one of {valid} for this pipeline, got {split!r}")
    if int(split) not in valid:
        raise ValueError(f"split must be one of {valid} for this pipeline, got {split!r}")
    return int(split)
