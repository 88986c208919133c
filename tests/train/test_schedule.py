"""WarmupCosine: values at given steps, batch-size scaling, progress in items, checkpoints."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from drapps.train import WarmupCosine, scale_lr


def optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def lrs(sched: WarmupCosine, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


def test_values_at_given_steps() -> None:
    sched = WarmupCosine(optimizer(0.1), warmup=4, total=14, min_lr_ratio=0.1)
    values = lrs(sched, 16)
    assert values[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    # Step s (s >= 4) trains at the cosine value for progress s + 1.
    for s in (4, 8, 12):
        t = (s + 1 - 4) / 10
        assert values[s] == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * t)))
    assert values[13:] == pytest.approx([0.01, 0.01, 0.01])  # the floor after total
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_no_warmup_starts_on_the_cosine() -> None:
    values = lrs(WarmupCosine(optimizer(), warmup=0, total=4), 4)
    assert values == pytest.approx([0.5 * (1 + math.cos(math.pi * t / 4)) for t in (1, 2, 3, 4)])


@pytest.mark.parametrize(("rule", "factor"), [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_lr_follows_the_batch_size_by_the_rule(rule: str, factor: float) -> None:
    sched = WarmupCosine(optimizer(0.1), warmup=2, total=100, base_batch_size=32, scaling=rule)
    lrs(sched, 3)  # past warmup
    before = sched.get_last_lr()[0]
    sched.set_batch_size(128)  # k: 1 -> 4
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(before * factor)
    assert sched.get_last_lr()[0] == pytest.approx(before * factor)
    sched.optimizer.step()
    sched.step()
    expected = scale_lr(0.1, 128, 32, rule) * sched.factor(5)  # type: ignore[arg-type]
    assert sched.get_last_lr()[0] == pytest.approx(expected)


def test_items_unit_advances_by_the_batch_size() -> None:
    sched = WarmupCosine(optimizer(), warmup=64, total=640, unit="items", base_batch_size=32)
    assert sched.get_last_lr()[0] == pytest.approx(0.5)  # 32 of 64 warmup items
    lrs(sched, 1)
    assert sched.get_last_lr()[0] == pytest.approx(1.0)
    sched.set_batch_size(64)  # with scaling "none" only the progress per step changes
    lrs(sched, 1)
    assert sched.progress == 96
    assert sched.get_last_lr()[0] == pytest.approx(sched.factor(96 + 64))


def test_state_dict_round_trip() -> None:
    sched = WarmupCosine(optimizer(), warmup=3, total=10, scaling="sqrt", base_batch_size=8)
    lrs(sched, 4)
    sched.set_batch_size(32)
    state = sched.state_dict()
    opt = optimizer()
    resumed = WarmupCosine(opt, warmup=3, total=10, scaling="sqrt", base_batch_size=8)
    resumed.load_state_dict(state)
    assert lrs(resumed, 3) == pytest.approx(lrs(sched, 3))


@pytest.mark.parametrize("done", [1, 3, 6])
def test_last_epoch_resumes_as_torchs_own_schedulers_do(done: int) -> None:
    """torch's convention: a scheduler made with ``last_epoch=k`` (the optimizer's groups
    holding ``initial_lr``) is where a fresh one was after ``k + 1`` steps. A LambdaLR over the
    same factors, interrupted and resumed the same way, is the reference."""

    def run(make: Any) -> list[float]:
        opt = optimizer(0.1)
        first = make(opt, -1)
        values = lrs(first, done)
        return values + lrs(make(opt, first.last_epoch - 1), 10 - done)

    def ours(opt: torch.optim.Optimizer, last_epoch: int) -> Any:
        return WarmupCosine(opt, warmup=2, total=8, min_lr_ratio=0.1, last_epoch=last_epoch)

    def theirs(opt: torch.optim.Optimizer, last_epoch: int) -> Any:
        factor = WarmupCosine(optimizer(), warmup=2, total=8, min_lr_ratio=0.1).factor
        return LambdaLR(opt, lambda step: factor(step + 1), last_epoch=last_epoch)

    whole = lrs(ours(optimizer(0.1), -1), 10)
    assert run(theirs) == pytest.approx(whole) and run(ours) == pytest.approx(whole)
    with pytest.raises(ValueError, match="unit='items' counts items"):
        WarmupCosine(optimizer(), warmup=2, total=8, unit="items", last_epoch=3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup": -1, "total": 10}, "warmup"),
        ({"warmup": 10, "total": 10}, "total"),
        ({"warmup": 1, "total": 10, "min_lr_ratio": 2.0}, "min_lr_ratio"),
        ({"warmup": 1, "total": 10, "scaling": "cubic"}, "scaling"),
        ({"warmup": 1, "total": 10, "unit": "epochs"}, "unit"),
        ({"warmup": 1, "total": 10, "base_batch_size": 0}, "base_batch_size"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WarmupCosine(optimizer(), **kwargs)  # type: ignore[arg-type]


def test_step_with_an_epoch_is_refused() -> None:
    sched = WarmupCosine(optimizer(), warmup=1, total=4)
    with pytest.raises(TypeError, match="epoch"):
        sched.step(3)
