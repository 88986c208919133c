"""Where a :class:`~drapps.ops.Pipeline` transform is split: its ops before the split run in the
workers, the rest on each batch in the device stage, for the share of each batch's samples the
offload share says (:mod:`drapps.ops.cut`). The split's owner checks every move and tells the
batch maker (the loader's engine) the new cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drapps.ops.cut import Cut, cut_of
from drapps.ops.pipeline import Pipeline, check_split
from drapps.runtime.config import check_share

START_SHARE = 0.5
"""Where ``offload="auto"`` starts: the middle, so the controller's first try either way
tells which side has room."""


class Split:
    """A Pipeline's split, movable while the loader runs.

    Args:
        pipeline: the transform.
        start: the split to start from: an int, "auto" or None (both: the Pipeline's own).
        indexed: the dataset is map-style (a split before the end seeds the batch stage's
            ops from each sample's index).
        batched: batches are collated (the batch stage runs on batches).
        offload: the share of each batch's samples cut at the split (a number in [0, 1] or
            "auto"; None: all of them).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        start: Any,
        *,
        indexed: bool,
        batched: bool,
        offload: Any = None,
    ) -> None:
        self.pipeline = pipeline
        self.adjustable = isinstance(start, str) and start == "auto"
        self._indexed, self._batched = indexed, batched
        self._listeners: list[Callable[[int | Cut], None]] = []
        self.value = self.check(pipeline.split if start is None or self.adjustable else start)
        self.shared = offload is not None
        """The loader was given an offload share (the ``offload`` knob exists)."""
        self.share_adjustable = isinstance(offload, str) and offload == "auto"
        share = 1.0 if offload is None else START_SHARE if self.share_adjustable else offload
        self.share = check_share(share)
        """The share of each batch's samples cut at the split (the rest are made whole in
        the workers); 1: every sample, as a split alone cuts them."""
        if offload is not None and not self.adjustable and self.value >= len(pipeline.ops):
            raise ValueError(
                f"offload={offload!r} needs ops to offload: a split before the Pipeline's end "
                f"(split=k or split='auto'), got split={start!r}"
            )

    @classmethod
    def of(
        cls, transform: Any, split: Any, *, indexed: bool, batched: bool, offload: Any = None
    ) -> Split | None:
        """The split of ``transform`` if it is a Pipeline; None otherwise.

        Raises:
            ValueError: a split or an offload share was given for a transform that is not a
                Pipeline.
        """
        if isinstance(transform, Pipeline):
            return cls(transform, split, indexed=indexed, batched=batched, offload=offload)
        for name, value in (("split", split), ("offload", offload)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} needs a drapps.ops.Pipeline as the transform, got "
                    f"{transform!r}"
                )
        return None

    @property
    def cut(self) -> int | Cut:
        """What batches are made with now: the split, or a Cut for a share below 1."""
        return cut_of(self.value, self.share, len(self.pipeline.ops))

    @property
    def points(self) -> list[int]:
        """The splits this loader can run (one before the end needs indexed batches)."""
        if not (self._indexed and self._batched):
            return [len(self.pipeline.ops)]
        return self.pipeline.split_points()

    def listen(self, apply: Callable[[int | Cut], None]) -> None:
        """Call ``apply(cut)`` on every move of the split or the share (see :attr:`cut`)."""
        self._listeners.append(apply)

    def set_share(self, share: Any) -> None:
        """Offload ``share`` of each batch's samples from now on (rounded to 1/64).

        Raises:
            ValueError: not a number in [0, 1].
        """
        self.share = round(check_share(share) * 64) / 64
        self._tell()

    def _tell(self) -> None:
        cut = self.cut
        for apply in self._listeners:
            apply(cut)

    def set(self, split: Any) -> None:
        """Move the split: batches made from now on use it.

        Raises:
            ValueError: ``split`` is not one of the Pipeline's ``split_points()`` this loader
                can run.
        """
        self.value = self.check(split)
        self._tell()

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
