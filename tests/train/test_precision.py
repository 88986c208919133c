"""MixedPrecision: autocast dtypes, the real fp16 GradScaler path on CPU, collapse detection."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from helpers import tiny_mlp

from drapps.train import LossScaleCollapseError, MixedPrecision


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_autocast_runs_low_precision_over_fp32_master_weights(
    precision: str, dtype: torch.dtype
) -> None:
    model = tiny_mlp()
    amp = MixedPrecision(precision, "cpu")  # type: ignore[arg-type]
    with amp.autocast():
        out = model(torch.randn(4, 6))
    assert out.dtype == dtype
    assert all(p.dtype == torch.float32 for p in model.parameters())
    amp.backward(out.float().square().mean())
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_fp32_is_a_plain_loop() -> None:
    model = tiny_mlp()
    amp = MixedPrecision("fp32", "cpu")
    with amp.autocast():
        assert model(torch.randn(4, 6)).dtype == torch.float32
    assert not amp.scaler.is_enabled()


def test_fp16_with_dynamic_loss_scaling_trains_on_cpu() -> None:
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16", "cpu")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)
    losses = []
    for _ in range(30):
        with amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        amp.backward(loss)
        amp.step(optimizer)
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert amp.scaler.get_scale() > 1.0
    assert losses[-1] < losses[0]
    assert all(math.isfinite(v) for v in losses)


def overflow_every_step(amp: MixedPrecision, steps: int) -> list[bool]:
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stepped = []
    for _ in range(steps):
        with amp.autocast():
            loss = model(torch.randn(4, 6)).float().sum()
        amp.backward(loss)
        next(model.parameters()).grad[0, 0] = math.inf  # every step overflows
        stepped.append(amp.step(optimizer))
        optimizer.zero_grad()
    return stepped


def test_collapsing_scale_falls_back_to_bf16_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    amp = MixedPrecision("fp16", "cpu", init_scale=2.0**4, max_skipped=100)
    with caplog.at_level(logging.WARNING, logger="drapps.train.precision"):
        stepped = overflow_every_step(amp, 6)
    # 16 -> 8 -> 4 -> 2 -> 1 -> 0.5 < min_scale 1: collapsed on the fifth skipped step.
    assert stepped[:5] == [False] * 5
    assert amp.fell_back and amp.precision == "bf16"
    assert not amp.scaler.is_enabled()
    assert "loss scale collapsed" in caplog.text and "bf16" in caplog.text
    assert stepped[5] is True  # bf16 steps without scaling (the inf goes into the weights)


def test_collapse_without_fallback_raises_instead_of_training_on() -> None:
    amp = MixedPrecision("fp16", "cpu", fallback_to_bf16=False, max_skipped=3)
    with pytest.raises(LossScaleCollapseError, match="3 overflowed steps"):
        overflow_every_step(amp, 5)


def test_a_checkpoint_resumes_the_loss_scale_and_a_fallback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An fp16 run resumed from its state goes on at the scale it had (torch's guidance: save
    the GradScaler's state), not at the initial one; one that fell back to bf16 stays there
    rather than collapsing again."""
    amp = MixedPrecision("fp16", "cpu", init_scale=2.0**10, max_skipped=100)
    overflow_every_step(amp, 3)
    state = amp.state_dict()
    resumed = MixedPrecision("fp16", "cpu", init_scale=2.0**10, max_skipped=100)
    resumed.load_state_dict(state)
    assert resumed.scaler.get_scale() == amp.scaler.get_scale() == 2.0**7
    assert resumed.skipped == 3 and resumed.precision == "fp16"
    with caplog.at_level(logging.WARNING, logger="drapps.train.precision"):
        overflow_every_step(amp, 8)  # 2**7 down past min_scale: falls back
    assert amp.fell_back
    again = MixedPrecision("fp16", "cpu")
    again.load_state_dict(amp.state_dict())
    assert again.precision == "bf16" and again.fell_back and not again.scaler.is_enabled()
    assert again.dtype is torch.bfloat16
    with pytest.raises(ValueError, match="from fp16 training, fallen back to bf16; this Mixed"):
        MixedPrecision("bf16", "cpu").load_state_dict(amp.state_dict())
    with pytest.raises(ValueError, match="not a MixedPrecision state_dict"):
        MixedPrecision("fp16", "cpu").load_state_dict({"scale": 2.0})


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="precision"):
        MixedPrecision("fp8", "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device_type"):
        MixedPrecision("bf16", "tpu")
    with pytest.raises(ValueError, match="max_skipped"):
        MixedPrecision("fp16", "cpu", max_skipped=0)
