"""The offload share: a share of each batch's samples finished in the device stage, the rest
made whole in the workers, with the same batches at every share (the CPU stands in for the
device), and a device stage that shrinks under memory pressure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_batches_equal

import drapps
from drapps.ops import (
    DecodeJPEG,
    DeviceStage,
    Op,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)
from drapps.ops.cut import Cut, Mixed, cut_of
from drapps.runtime.config import check_share
from drapps.runtime.seeding import sample_seed_for
from drapps.runtime.worker import BatchRecipe, make_batch

simplejpeg = pytest.importorskip("simplejpeg")


class Jpegs:
    """JPEG photos of different sizes, labelled by index."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        rng = np.random.default_rng(index)
        image = rng.integers(0, 256, (40 + 6 * (index % 5), 34 + 4 * (index % 3), 3), np.uint8)
        return simplejpeg.encode_jpeg(image, quality=90), index


def jpeg_pipeline() -> Pipeline:
    ops = [DecodeJPEG(), ToCHWTensor(), RandomResizedCrop(24), RandomHorizontalFlip()]
    return Pipeline(ops, key=0, takes=Spec("bytes"))


def epoch(**options: Any) -> list[Any]:
    options = {"workers": 2, "batch_size": 8, **options}
    with drapps.Loader(
        Jpegs(), shuffle=True, seed=3, transform=jpeg_pipeline(), **options
    ) as loader:
        return list(loader)


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    return epoch(workers=0)  # every op in the calling process, one sample at a time


def test_a_share_of_samples_is_drawn_from_each_sample_seed() -> None:
    seeds = [sample_seed_for(7, 0, i) for i in range(20_000)]
    for share in (0.1, 0.5, 0.9):
        drawn = sum(Cut(0, share).offloads(s) for s in seeds) / len(seeds)
        assert drawn == pytest.approx(share, abs=0.015)
    # A sample offloaded at one share stays offloaded at a larger one.
    low, high = Cut(0, 0.3), Cut(0, 0.6)
    assert all(high.offloads(s) for s in seeds if low.offloads(s))


def test_cut_of_is_the_split_itself_at_the_ends_of_the_share() -> None:
    assert cut_of(0, 1.0, 4) == 0
    assert cut_of(0, 0.0, 4) == 4  # nothing offloaded: everything in the workers
    assert cut_of(4, 0.5, 4) == 4  # nothing to offload after the end
    assert cut_of(1, 0.25, 4) == Cut(1, 0.25)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        Cut(0, 1.0)


@pytest.mark.parametrize("share", [True, "half", float("nan"), -0.1, 1.5])
def test_a_bad_share_is_named(share: Any) -> None:
    with pytest.raises(ValueError, match="offload"):
        check_share(share)


def test_a_worker_makes_both_kinds_of_samples_in_one_batch() -> None:
    pipeline = jpeg_pipeline()
    recipe = BatchRecipe(Jpegs(), pipeline, torch.utils.data.default_collate, "raise")
    indices = list(range(16))
    made = make_batch(recipe, 3, 0, indices, Cut(0, 0.5))
    images, labels = made.batch
    assert isinstance(images, Mixed)
    assert labels.tolist() == indices
    assert sorted(images.done_at + images.pending_at) == indices
    assert 0 < len(images.pending) < 16  # both kinds (for this seed: drawn, not guaranteed)
    assert all(isinstance(data, bytes) for data in images.pending)  # cut before the decode
    assert tuple(images.done.shape) == (len(images.done_at), 3, 24, 24)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_same_at_every_share(
    reference: list[Any], share: float, workers: int
) -> None:
    assert_batches_equal(epoch(workers=workers, split=0, offload=share), reference)


@pytest.mark.parametrize("split", [1, 2, 3])
def test_any_split_offloads_the_same_batches(reference: list[Any], split: int) -> None:
    assert_batches_equal(epoch(split=split, offload=0.5), reference)


def test_samples_dispatch_offloads_the_same_batches(reference: list[Any]) -> None:
    assert_batches_equal(epoch(split=0, offload=0.5, dispatch="samples"), reference)


def test_moving_the_share_mid_epoch_changes_no_batch() -> None:
    reference = epoch(workers=0, batch_size=2)
    with drapps.Loader(
        Jpegs(), batch_size=2, shuffle=True, seed=3, transform=jpeg_pipeline(), workers=2,
        prefetch=2, split=0, offload=0.0,
    ) as loader:  # fmt: skip
        got = []
        for n, batch in enumerate(loader):
            got.append(batch)
            loader.set_offload([0.5, 1.0, 0.0, 0.75][n % 4])
        assert loader.stats().device_batches > 0
    assert_batches_equal(got, reference)


def test_offload_needs_a_split_before_the_end() -> None:
    with pytest.raises(ValueError, match=r"offload=0\.5 needs ops to offload"):
        drapps.Loader(Jpegs(), batch_size=8, transform=jpeg_pipeline(), workers=0, offload=0.5)


def test_offload_needs_a_pipeline() -> None:
    with pytest.raises(ValueError, match=r"offload=0\.5 needs a drapps\.ops\.Pipeline"):
        drapps.Loader(Jpegs(), batch_size=8, transform=lambda s: s, workers=0, offload=0.5)


@pytest.mark.parametrize("offload", [2.0, "most", True])
def test_a_bad_offload_argument_is_named(offload: Any) -> None:
    with pytest.raises(ValueError, match="offload"):
        drapps.Loader(Jpegs(), batch_size=8, transform=jpeg_pipeline(), split=0, offload=offload)


def test_offload_auto_needs_workers() -> None:
    with pytest.raises(ValueError, match="offload='auto' needs worker processes"):
        drapps.Loader(
            Jpegs(), batch_size=8, transform=jpeg_pipeline(), split=0, offload="auto", workers=0
        )


# -- the device stage under memory pressure -------------------------------------------------


class Hungry(Op):
    """A batchable op that "runs out of memory" on more than ``most`` samples at once."""

    batchable = True

    def __init__(self, most: int) -> None:
        self.most = most
        self.sizes: list[int] = []

    def declare(self, takes: Spec) -> Spec:
        return takes

    def __call__(self, image: Any) -> Any:
        return image + 1

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        self.sizes.append(len(batch))
        if len(batch) > self.most:
            raise torch.OutOfMemoryError("out of memory (test)")
        return batch + 1


def hungry_pipeline(most: int) -> Pipeline:
    return Pipeline([ToCHWTensor(), Hungry(most)], key=0, split=1,
                    takes=Spec("array", "uint8", "HWC"))  # fmt: skip


def test_a_squeezed_device_stage_runs_pieces_and_gives_the_same_batch() -> None:
    pipeline = hungry_pipeline(most=3)
    stage = DeviceStage(pipeline, "cpu")
    images = torch.arange(8 * 2 * 2 * 3, dtype=torch.uint8).reshape(8, 3, 2, 2)
    out = stage.run((images, torch.arange(8)), list(range(8)), 1)
    assert torch.equal(out[0], images + 1)
    assert stage.piece == 2 and stage.squeezed == 1  # 8 -> 4 -> 2 samples a piece
    assert pipeline.ops[1].sizes == [8, 4, 2, 2, 2, 2]  # each failure halves the piece


def test_a_stage_that_cannot_fit_one_sample_falls_back_to_the_cpu() -> None:
    class FailsThrice(Hungry):
        def apply_batch(self, batch: Any, rngs: Any) -> Any:
            self.sizes.append(len(batch))
            if len(self.sizes) <= 3:  # the whole batch, a piece of 2, a piece of 1
                raise torch.OutOfMemoryError("out of memory (test)")
            return batch + 1

    pipeline = hungry_pipeline(most=0)
    pipeline.ops[1] = op = FailsThrice(0)
    stage = DeviceStage(pipeline, "cpu")
    images = torch.zeros(4, 3, 2, 2, dtype=torch.uint8)
    out = stage.run((images, torch.arange(4)), list(range(4)), 1)
    assert torch.equal(out[0], images + 1) and stage.squeezed == 1
    assert op.sizes == [4, 2, 1, 4]  # then the whole batch on the CPU


def test_the_stage_shrinks_while_free_memory_is_low_and_grows_back() -> None:
    free = {"bytes": 50}
    stage = DeviceStage(hungry_pipeline(most=99), "cpu", memory=lambda: (free["bytes"], 1000))
    images = torch.zeros(16, 3, 2, 2, dtype=torch.uint8)
    pieces = []
    for level in (50, 50, 50, 500, 500, 500):
        free["bytes"] = level
        stage.run((images, torch.arange(16)), list(range(16)), 1)
        pieces.append(stage.piece)
    assert pieces == [8, 4, 2, 4, 8, None]
    assert stage.squeezed == 5


def test_filling_batches_needs_a_fixed_share() -> None:
    with pytest.raises(ValueError, match="defer_after=0 needs a fixed offload share"):
        drapps.Loader(
            Jpegs(), batch_size=8, transform=jpeg_pipeline(), split=0, offload="auto",
            defer_after=0, workers=2,
        )  # fmt: skip


def test_filled_batches_offload_the_same_batches(reference: list[Any]) -> None:
    assert_batches_equal(epoch(split=0, offload=0.5, defer_after=30.0), reference)
