"""The op placement seam: ops declare what they take and give; a Pipeline cut at a split runs
its tail on batches after the reorder buffer, with the same results wherever the cut is."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

import drapps
from drapps.ops import (
    DecodeJPEG,
    Normalize,
    Op,
    Opaque,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)

CALLS: list[tuple[str, int]] = []


class Jitter(Op):
    """A device-stage op from outside drapps: adds a random per-sample offset to a float CHW
    tensor; per sample in a worker, or on the whole batch after the reorder buffer."""

    batchable = True
    random = True

    def declare(self, takes: Spec) -> Spec:
        if takes.known and (takes.kind, takes.dtype) != ("tensor", "float32"):
            raise ValueError(f"Jitter takes tensor float32, got {takes}")
        return takes

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        CALLS.append(("sample", os.getpid()))
        return image + float(drapps.sample_rng().normal())

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        assert rngs is not None and len(rngs) == batch.shape[0]
        CALLS.append(("batch", os.getpid()))
        offsets = torch.tensor([rng.normal() for rng in rngs], dtype=batch.dtype)
        return batch + offsets.view(-1, 1, 1, 1).to(batch.device)


class Photos:
    """(HWC uint8 image, label) pairs of varying sizes, like a decoded ImageFolder."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(index)
        size = (20 + index % 5, 24 + index % 3, 3)
        return rng.integers(0, 256, size, dtype=np.uint8), index


class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(Photos()[i] for i in range(4))


def _pipeline(split: int | None = None) -> Pipeline:
    ops = [RandomResizedCrop(8), ToCHWTensor(), RandomHorizontalFlip(), Normalize([0.5] * 3,
           [0.25] * 3), Jitter()]  # fmt: skip
    return Pipeline(ops, split=split, key=0)


def _batches(split: int, workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with drapps.Loader(
        Photos(), batch_size=5, shuffle=True, seed=7, workers=workers, transform=_pipeline(split)
    ) as loader:
        return list(loader)


def test_ops_declare_their_specs_and_the_valid_splits() -> None:
    pipeline = _pipeline()
    assert [str(s) for s in pipeline.specs] == [
        "any", "array uint8 HWC uniform", "tensor uint8 CHW uniform", "tensor uint8 CHW uniform",
        "tensor float32 CHW uniform", "tensor float32 CHW uniform",
    ]  # fmt: skip
    assert pipeline.split_points() == [1, 2, 3, 4, 5] and pipeline.split == 5
    with pytest.raises(ValueError, match=r"split must be one of \[1, 2, 3, 4, 5\] for this pipeli"):
        pipeline.set_split(0)


def test_a_mismatch_is_named_when_the_pipeline_is_built() -> None:
    with pytest.raises(ValueError, match=r"op 1 of the pipeline: DecodeJPEG\(\) takes bytes, "
                       r"got tensor uint8 CHW"):  # fmt: skip
        Pipeline([ToCHWTensor(), DecodeJPEG()], takes=Spec("array", "uint8", "HWC"))
    with pytest.raises(ValueError, match="op 0 of the pipeline: Jitter takes tensor float32"):
        Pipeline([Jitter()], takes=Spec("tensor", "uint8", "CHW"))


def test_user_callables_are_opaque_sample_ops() -> None:
    pipeline = Pipeline([np.flipud, ToCHWTensor(), RandomHorizontalFlip()])
    assert isinstance(pipeline.ops[0], Opaque)
    assert pipeline.split_points() == [2, 3]  # an opaque op gives "any": no split before it
    assert Pipeline([abs]).split_points() == [1]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_split_gives_the_same_batches(workers: int) -> None:
    reference = _batches(5, workers)
    assert reference[0][0].dtype == torch.float32 and reference[0][0].shape == (5, 3, 8, 8)
    for split in (2, 3, 4):
        CALLS.clear()
        batches = _batches(split, workers)
        assert len(batches) == len(reference)
        for (x, y), (rx, ry) in zip(batches, reference, strict=True):
            assert torch.equal(y, ry)
            torch.testing.assert_close(x, rx)
        # the ops after the split ran on whole batches, in the training process
        assert CALLS and set(CALLS) == {("batch", os.getpid())}


def test_ops_before_the_split_run_in_the_workers() -> None:
    CALLS.clear()
    _batches(5, workers=0)
    assert {kind for kind, _ in CALLS} == {"sample"}


def test_a_split_needs_a_map_style_dataset_and_batches() -> None:
    split = _pipeline(3)
    with pytest.raises(ValueError, match="needs a map-style dataset"):
        drapps.Loader(Stream(), batch_size=2, transform=split)
    with pytest.raises(ValueError, match="batch_size=None turns batching off"):
        drapps.Loader(Photos(), batch_size=None, transform=split)


@pytest.mark.parametrize("workers", [0, 2])
def test_moving_the_split_mid_epoch_keeps_every_batch(workers: int) -> None:
    reference = _batches(5, workers)
    with drapps.Loader(
        Photos(), batch_size=5, shuffle=True, seed=7, workers=workers, transform=_pipeline(5)
    ) as loader:
        moved = []
        for k, batch in enumerate(loader):
            moved.append(batch)
            loader.set_split((2, 4, 3, 5, 2)[k % 5])  # batches in flight keep their split
    assert len(moved) == len(reference)
    for (x, y), (rx, ry) in zip(moved, reference, strict=True):
        assert torch.equal(y, ry)
        torch.testing.assert_close(x, rx)


def test_set_split_names_bad_input() -> None:
    with drapps.Loader(Photos(), batch_size=5, workers=0, transform=_pipeline()) as loader:
        with pytest.raises(ValueError, match=r"split must be one of \[1, 2, 3, 4, 5\] for this"):
            loader.set_split(0)
    with drapps.Loader(Photos(), batch_size=5, workers=0) as plain:
        with pytest.raises(ValueError, match=r"set_split\(\) needs a drapps\.ops\.Pipeline"):
            plain.set_split(2)
    with drapps.Loader(Stream(), batch_size=2, workers=0, transform=_pipeline()) as stream:
        with pytest.raises(ValueError, match="needs a map-style dataset"):
            stream.set_split(3)
