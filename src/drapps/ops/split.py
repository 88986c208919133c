"""Where a :class:`~drapps.ops.Pipeline` transform is split: its ops before the split run in the
workers, the rest on each batch in the device stage. The split's owner checks every move and
tells the batch maker (the loader's engine) the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drapps.ops.pipeline import Pipeline, check_split


class Split:
    """A Pipeline's split, movable while the loader runs.

    Args:
        pipeline: the transform.
        start: the split to start from: an int, "auto" or None (both: the Pipeline's own).
        indexed: the dataset is map-style (a split before the end seeds the batch stage's
            ops from each sample's index).
        batched: batches are collated (the batch stage runs on batches).
    """

    def __init__(self, pipeline: Pipeline, start: Any, *, indexed: bool, batched: bool) -> None:
        self.pipeline = pipeline
        self.adjustable = isinstance(start, str) and start == "auto"
        self._indexed, self._batched = indexed, batched
        self._listeners: list[Callable[[int], None]] = []
        self.value = self.check(pipeline.split if start is None or self.adjustable else start)

    @classmethod
    def of(cls, transform: Any, split: Any, *, indexed: bool, batched: bool) -> Split | None:
        """The split of ``transform`` if it is a Pipeline; None otherwise.

        Raises:
            ValueError: a split was given for a transform that is not a Pipeline.
        """
        if isinstance(transform, Pipeline):
            return cls(transform, split, indexed=indexed, batched=batched)
        if split is not None:
            raise ValueError(
                f"split={split!r} needs a drapps.ops.Pipeline as the transform, got {transform!r}"
            )
        return None

    @property
    def points(self) -> list[int]:
        """The splits this loader can run (one before the end needs indexed batches)."""
        if not (self._indexed and self._batched):
            return [len(self.pipeline.ops)]
        return self.pipeline.split_points()

    def listen(self, apply: Callable[[int], None]) -> None:
        """Call ``apply(split)`` on every move."""
        self._listeners.append(apply)

    def set(self, split: Any) -> None:
        """Move the split: batches made from now on use it.

        Raises:
            ValueError: ``split`` is not one of the Pipeline's ``split_points()`` this loader
                can run.
        """
        self.value = self.check(split)
        for apply in self._listeners:
            apply(self.value)

    def check(self, split: Any) -> int:
        """``split`` as an int, if this loader can run its Pipeline cut there; else raise."""
        split = check_split(split, self.pipeline.split_points())
        if split >= len(self.pipeline.ops):
            return split
        if not self._indexed:
            raise ValueError(
                "transform: a Pipeline split before its end needs a map-style dataset (an "
                "iterable dataset's samples have no index to seed the batch stage's ops from)"
            )
        if not self._batched:
            raise ValueError(
                "transform: a Pipeline split before its end needs batches; batch_size=None "
                "turns batching off"
            )
        return split
