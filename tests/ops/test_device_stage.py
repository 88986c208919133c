"""The device stage: ops after the split run on batches in the training process, and moving the
split (by hand or by the controller) never changes a batch."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

import drapps
from drapps.control import Action, State
from drapps.ops import (
    CenterCrop,
    ColorJitter,
    DecodeJPEG,
    DeviceStage,
    Normalize,
    Op,
    Pipeline,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    Spec,
    ToCHWTensor,
)

HWC = Spec("array", "uint8", "HWC")


class Photos:
    """Images of different sizes (as decoded photos are), labelled by index."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(index)
        size = (40 + 7 * (index % 5), 36 + 5 * (index % 4), 3)
        return rng.integers(0, 256, size, dtype=np.uint8), index


def image_pipeline(split: int | None = None) -> Pipeline:
    """The full augmentation: every op after ToCHWTensor may run in the device stage."""
    ops = [
        ToCHWTensor(),
        RandomResizedCrop(24),
        RandomHorizontalFlip(),
        ColorJitter(0.4, 0.4, 0.4),
        Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ]
    return Pipeline(ops, split=split, key=0, takes=HWC)


def batches(split: Any, workers: int, **options: Any) -> list[Any]:
    with drapps.Loader(
        Photos(),
        batch_size=5,
        shuffle=True,
        seed=11,
        workers=workers,
        transform=image_pipeline(),
        split=split,
        **options,
    ) as loader:
        return [list(batch) for batch in loader]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y)
        for one, two in zip(a, b, strict=True)
        for x, y in zip(one, two, strict=True)
    )


def test_a_split_at_ragged_samples_hands_the_stage_a_list() -> None:
    pipeline = image_pipeline()
    assert pipeline.split_points() == [0, 1, 2, 3, 4, 5]  # 0: arrays reach the stage as a list
    assert pipeline.ragged(1) and not pipeline.ragged(2) and not pipeline.ragged(5)
    collate = torch.utils.data.default_collate
    samples = [(torch.zeros(3, 4 + i, 5), i) for i in range(3)]
    gathered = pipeline.collate(samples, collate, 1)
    assert [tuple(x.shape) for x in gathered[0]] == [(3, 4, 5), (3, 5, 5), (3, 6, 5)]
    assert gathered[1].tolist() == [0, 1, 2]
    # Samples that happen to share a shape are stacked: the batch ops take either kind.
    stacked = pipeline.collate([(torch.zeros(3, 4, 5), i) for i in range(3)], collate, 1)
    assert stacked[0].shape == (3, 3, 4, 5)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_split_of_the_image_pipeline_gives_the_same_batches(workers: int) -> None:
    reference = batches(5, 0)
    assert reference[0][0].shape == (5, 3, 24, 24) and reference[0][0].dtype == torch.float32
    for split in (0, 1, 2, 3, 4):
        assert same(batches(split, workers), reference), f"split {split}, {workers} workers"


def test_the_stage_counts_its_time_and_the_stats_show_the_split() -> None:
    with drapps.Loader(
        Photos(), batch_size=6, seed=0, workers=0, transform=image_pipeline(), split=2
    ) as loader:
        list(loader)
        stats = loader.stats()
    assert stats.split == 2 and stats.device_batches == 4 and stats.device_s > 0


def test_batched_ops_equal_the_per_sample_ops() -> None:
    rng = np.random.default_rng(0)
    images = [
        torch.from_numpy(rng.integers(0, 256, (3, 30 + i, 28), dtype=np.uint8)) for i in range(4)
    ]
    seeds = [101, 102, 103, 104]
    for op in (
        RandomResizedCrop(16),
        RandomCrop(20, padding=2),
        Resize((12, 10)),
        CenterCrop(16),
    ):
        per_sample = [op._crop_tensor(x, np.random.default_rng(s)) if op.random else op(x)  # type: ignore[attr-defined]
                      for x, s in zip(images, seeds, strict=True)]  # fmt: skip
        rngs = [np.random.default_rng(s) for s in seeds]
        assert torch.equal(op.apply_batch(images, rngs), torch.stack(per_sample)), op
    uniform = torch.stack([x[:, :16, :16] for x in images])
    jitter = ColorJitter(0.5, 0.5, 0.5)
    batched = jitter.apply_batch(uniform, [np.random.default_rng(s) for s in seeds])
    one_by_one = [
        jitter._jitter(x[None], torch.tensor([jitter._factors(np.random.default_rng(s))]))[0]
        for x, s in zip(uniform, seeds, strict=True)
    ]
    assert torch.equal(batched, torch.stack(one_by_one))


def test_resize_is_antialiased_and_close_to_the_float_path() -> None:
    stripes = torch.zeros(1, 64, 64, dtype=torch.uint8)
    stripes[:, :, ::2] = 255  # one-pixel stripes: without antialiasing they alias to 0 or 255
    small = Resize(16)(stripes)
    assert small.shape == (1, 16, 16) and 120 <= int(small.float().mean()) <= 135
    inside = small[:, :, 1:-1]  # the edge columns see one stripe less
    assert int(inside.max()) - int(inside.min()) <= 2
    # The float path (what a GPU runs) agrees with the CPU's uint8 kernel to within 2 levels.
    image = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, 97, 83), dtype=np.uint8))
    exact = Resize((32, 30))(image)
    floated = Resize((32, 30))(image.float()).round().clamp(0, 255).to(torch.uint8)
    assert (exact.int() - floated.int()).abs().max() <= 2


def test_color_jitter_changes_what_it_is_asked_to() -> None:
    image = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (3, 8, 8), dtype=np.uint8))
    assert torch.equal(ColorJitter()(image), image)
    bright = ColorJitter(brightness=0.5).apply_batch(image[None], [np.random.default_rng(0)])[0]
    factor = np.random.default_rng(0).uniform(0.5, 1.5)
    expected = (image.float() * np.float32(factor)).clamp(0, 255).trunc().to(torch.uint8)
    assert torch.equal(bright, expected)
    gray = ColorJitter(saturation=1.0)._jitter(image[None], torch.tensor([[1.0, 1.0, 0.0]]))[0]
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    with pytest.raises(ValueError, match="brightness must be a number >= 0, got -1"):
        ColorJitter(brightness=-1)
    with pytest.raises(ValueError, match=r"ColorJitter\(.*\) takes tensor uint8 CHW"):
        Pipeline([ToCHWTensor(), Normalize([0.5], [0.5]), ColorJitter(0.1)], takes=HWC)


def test_bad_split_and_device_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"split=2 needs a drapps.ops.Pipeline as the transform"):
        drapps.Loader(Photos(), transform=abs, split=2, workers=0)
    with pytest.raises(ValueError, match=r"split must be one of \[0, 1, 2, 3, 4, 5\] for this "
                       r"pipeline, got 7"):  # fmt: skip
        drapps.Loader(Photos(), transform=image_pipeline(), split=7, workers=0)
    with pytest.raises(ValueError, match="split must be None, 'auto' or an int >= 0, got 'x'"):
        drapps.Loader(Photos(), transform=image_pipeline(), split="x", workers=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split='auto' needs worker processes"):
        drapps.Loader(Photos(), transform=image_pipeline(), split="auto", workers=0)
    with pytest.raises(ValueError, match="device must be None or a torch device name, got 'gpu0'"):
        drapps.Loader(Photos(), transform=image_pipeline(), device="gpu0", workers=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' needs CUDA"):
            drapps.Loader(Photos(), transform=image_pipeline(), device="cuda", workers=0)


def test_a_device_stage_without_a_pipeline_moves_batches_only() -> None:
    stage = DeviceStage(None, "cpu")
    batch = [torch.ones(2, 3), {"y": torch.zeros(2)}]
    assert stage.run(batch, (), None) is batch and stage.totals() == (0.0, 0)
    with drapps.Loader([torch.ones(3)] * 4, batch_size=2, workers=0, device="cpu") as loader:
        assert [b.device.type for b in loader] == ["cpu", "cpu"]


class Earlier:
    """A policy that moves the cut one op earlier every tick."""

    def decide(self, state: State) -> Action:
        return Action(split=-1, reason="test: one more op to the device stage")


def test_split_auto_lets_the_controller_move_the_cut_without_changing_batches(
    tmp_path: Any,
) -> None:
    reference = batches(5, 0)
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(
        Photos(),
        batch_size=5,
        shuffle=True,
        seed=11,
        workers=2,
        transform=image_pipeline(),
        split="auto",
        policy=Earlier(),
        control_interval=0.05,
        trace=str(trace),
    ) as loader:
        got = []
        for batch in loader:
            got.append(list(batch))
            time.sleep(0.1)  # a few controller ticks per batch
        rows = list(loader._parts.tuner.rows)  # type: ignore[union-attr]
        assert loader.stats().split == 0
    assert same(got, reference)
    splits = [row.applied["split"] for row in rows]
    assert splits[0] == 4 and min(splits) == 0 and splits == sorted(splits, reverse=True)
    assert all(row.state.split == row.applied["split"] + 1 for row in rows[:3])
    assert '"split"' in trace.read_text()


def test_the_split_knob_is_clipped_to_the_valid_points() -> None:
    from drapps.control.knobs import SplitKnob

    moved: list[int] = []
    knob = SplitKnob(moved.append, low=2, high=5)
    base = State.from_dict({**_state_fields(), "split": 2})
    assert knob.propose(base, -1, {}) == 2 and knob.propose(base, +1, {}) == 3
    older = {k: v for k, v in _state_fields().items() if k != "split"}
    assert State.from_dict({**older, "split_point": 4}).split == 4  # a trace written before
    assert Action(split=-1).moves() == {"split": -1}
    with pytest.raises(ValueError, match="split bounds need 0 <= low <= high, got 3, 2"):
        SplitKnob(moved.append, low=3, high=2)


def _state_fields() -> dict[str, Any]:
    from helpers import state

    return state().as_dict()


class Jpegs:
    """JPEG files' bytes of differing sizes, as a dataset that leaves decoding to the ops."""

    def __len__(self) -> int:
        return 14

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        simplejpeg = pytest.importorskip("simplejpeg")
        image = Photos()[index][0]
        return simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=90), index


@pytest.mark.parametrize("crop_first", [False, True], ids=["tensor-crop", "array-crop"])
def test_decoding_may_move_into_the_stage_too(crop_first: bool) -> None:
    middle = [RandomResizedCrop(20), ToCHWTensor()] if crop_first else [
        ToCHWTensor(), RandomResizedCrop(20)]  # fmt: skip
    ops = [DecodeJPEG(), *middle, RandomHorizontalFlip()]

    def run(split: int, workers: int) -> list[Any]:
        pipeline = Pipeline(ops, key=0, takes=Spec("bytes"))
        with drapps.Loader(
            Jpegs(), batch_size=4, seed=2, workers=workers, transform=pipeline, split=split
        ) as loader:
            return [list(batch) for batch in loader]

    assert Pipeline(ops, takes=Spec("bytes")).split_points() == [0, 1, 2, 3, 4]
    reference = run(4, 0)
    assert reference[0][0].shape == (4, 3, 20, 20)
    for split in (0, 1, 2, 3):
        for workers in (0, 2):
            assert same(run(split, workers), reference), f"split {split}, {workers} workers"


def test_the_state_trace_and_report_show_the_device_stage(tmp_path: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    with drapps.Loader(
        Photos(), batch_size=4, shuffle=True, seed=0, workers=1, transform=image_pipeline(),
        split=2, trace=str(trace), control_interval=0.05,
    ) as loader:  # fmt: skip
        for _ in range(3):
            for _ in loader:
                time.sleep(0.02)
        rows = list(loader._parts.tuner.rows)  # type: ignore[union-attr]
        report = loader.report()
    staged = [row.state for row in rows if row.state.device_stage_s > 0]
    assert staged and all(s.split == 2 for s in staged)
    assert all(0 < s.device_stage_share <= 1 for s in staged)
    assert "Split: ops from 2 on ran in the device stage" in report
    assert "ms a batch" in report
    assert '"device_stage_s"' in trace.read_text()


class LabelledPicky:
    """Sample ``i``'s image is all ``i``, so a batch op can tell sample 9 apart."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((1, 2, 2), index, dtype=torch.uint8), index


class FailsOnNine(Op):
    batchable = True

    def declare(self, takes: Spec) -> Spec:
        return takes

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.apply_batch(image[None], None)[0]

    def apply_batch(self, batch: Any, rngs: Any) -> Any:
        if bool((batch == 9).any()):
            raise KeyError("nine is not allowed")
        return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_batch_op_names_the_batch_and_the_op(workers: int) -> None:
    ops = Pipeline([FailsOnNine()], key=0, takes=Spec("tensor", "uint8", "CHW"), split=0)
    with drapps.Loader(LabelledPicky(), batch_size=4, workers=workers, transform=ops) as loader:
        it = iter(loader)
        assert [int(next(it)[1][0]) for _ in range(2)] == [0, 4]
        with pytest.raises(KeyError) as caught:  # the original type, as a failing sample's
            next(it)
    error = caught.value
    assert isinstance(error, drapps.SampleError) and error.stage == "device_stage"
    assert (
        "the device stage failed at op 0 (FailsOnNine()) on batch 2 (indices [8, 9, 10, 11])"
        in str(error)
    )


def _two_batches_and_one_staged_ahead(loader: drapps.Loader) -> tuple[Any, list[Any]]:
    """An epoch's iterator with two batches taken and the third staged ahead, and those two."""
    it = iter(loader)
    got = [list(next(it))]
    time.sleep(0.5)  # batch 2 arrives meanwhile: handing out batch 1 stages it ahead
    got.append(list(next(it)))
    assert it._ahead is not None and it._ahead.batch_id == 2  # type: ignore[attr-defined]
    return it, got


def test_resume_with_a_batch_staged_ahead_gives_the_rest_exactly_once() -> None:
    reference = batches(2, 2)
    with drapps.Loader(Photos(), batch_size=5, shuffle=True, seed=11, workers=2,
                       transform=image_pipeline(), split=2) as loader:  # fmt: skip
        _it, first = _two_batches_and_one_staged_ahead(loader)  # held at the checkpoint
        state = loader.state_dict()
    assert state["next_batch"] == 2
    with drapps.Loader(Photos(), batch_size=5, shuffle=True, seed=11, workers=2,
                       transform=image_pipeline(), split=4) as resumed:  # fmt: skip
        resumed.load_state_dict(state)
        rest = [list(batch) for batch in resumed]
    assert same(first + rest, reference)


def test_a_peek_with_a_batch_staged_ahead_gives_the_epoch_exactly_once() -> None:
    """A second iterator while the loop's holds a batch staged ahead: the loop's takes that
    batch, then the workers make the rest from past it (they made it again, and the loop
    got it twice, once in the next one's place)."""
    reference = batches(2, 2)
    with drapps.Loader(Photos(), batch_size=5, shuffle=True, seed=11, workers=2,
                       transform=image_pipeline(), split=2) as loader:  # fmt: skip
        it, got = _two_batches_and_one_staged_ahead(loader)
        next(iter(loader))
        got.extend(list(batch) for batch in it)
    assert same(got, reference)


def test_garbage_collection_with_a_batch_staged_ahead_stops_the_stage_thread() -> None:
    import gc

    from helpers import drapps_threads, leaks

    loader = drapps.Loader(Photos(), batch_size=5, workers=2, transform=image_pipeline(), split=1)
    it = iter(loader)
    next(it)
    time.sleep(0.3)
    next(it)
    assert any(t.name.startswith("drapps-device-stage") for t in drapps_threads())
    del loader, it
    gc.collect()
    assert not leaks()


@pytest.mark.parametrize("workers", [0, 2])
def test_token_masking_runs_in_either_stage_alike(workers: int) -> None:
    from drapps.ops import RandomTokenMask

    windows = [(torch.arange(i, i + 32), torch.arange(i + 1, i + 33)) for i in range(20)]

    def run(split: int) -> list[Any]:
        ops = Pipeline([RandomTokenMask(0.3, mask_id=0)], key=0, takes=Spec("tensor", "int64"))
        with drapps.Loader(windows, batch_size=4, seed=5, workers=workers, transform=ops,
                           split=split) as loader:  # fmt: skip
            return [list(batch) for batch in loader]

    in_workers, in_stage = run(1), run(0)
    assert same(in_workers, in_stage)
    masked = torch.cat([batch[0] for batch in in_stage]) == 0
    assert 0.2 < float(masked.float().mean()) < 0.4  # about p of the tokens
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\], got 2"):
        RandomTokenMask(p=2)
