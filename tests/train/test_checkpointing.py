"""Activation checkpointing: identical gradients, sqrt(L) segments, budgets, the memory report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from drapps.reference.models import GPT2, GPT2Config, ResNet
from drapps.train import activation_report, checkpoint_blocks, saved_activations
from drapps.train.checkpointing import CheckpointedSequential, segment_bounds


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("segments", ["sqrt", 1, 2])
def test_gpt2_gradients_are_identical_with_checkpointing(segments: int | str) -> None:
    config = GPT2Config(vocab_size=50, block_size=16, n_layer=4, n_head=2, n_embd=16, dropout=0.1)
    torch.manual_seed(0)
    plain = GPT2(config)
    ids = torch.randint(0, 50, (3, 16))
    checkpointed = GPT2(config)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.blocks = checkpoint_blocks(checkpointed.blocks, segments)
    # Same keys, so checkpoints load either way.
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # dropout draws; the recompute replays the same RNG state
        model(ids).square().mean().backward()
    want = grads(plain)
    for name, got in grads(checkpointed).items():
        torch.testing.assert_close(got, want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_resnet_gradients_are_identical_with_checkpointing() -> None:
    torch.manual_seed(0)
    plain = ResNet(18, width=4)
    checkpointed = ResNet(18, width=4)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.blocks = checkpoint_blocks(checkpointed.blocks)
    x = torch.randn(4, 3, 32, 32)
    for model in (plain, checkpointed):
        nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 3])).backward()
    want = grads(plain)
    for name, got in grads(checkpointed).items():
        torch.testing.assert_close(got, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_sqrt_segments_and_bounds() -> None:
    assert segment_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    stack = checkpoint_blocks(nn.Sequential(*[nn.Linear(4, 4) for _ in range(16)]))
    assert stack.segments == 4
    assert stack.bounds == [(0, 4), (4, 8), (8, 12), (12, 16)]
    with pytest.raises(ValueError, match="segments"):
        CheckpointedSequential([nn.Linear(4, 4)] * 3, segments=4)
    with pytest.raises(ValueError, match="segments"):
        segment_bounds(3, 0)


def deep_stack(blocks: int = 16, width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)]
    )


def test_checkpointing_keeps_fewer_activations_and_the_report_says_how_many() -> None:
    blocks = deep_stack()
    stack = checkpoint_blocks(blocks)
    x = torch.randn(128, 64)
    report = activation_report(stack, stack, lambda: stack(x).square().mean(), repeats=1)
    # Plain: each of 16 blocks keeps its Linear input and GELU input (2 x 32 KiB).
    assert report.plain_bytes >= 16 * 2 * 128 * 64 * 4
    # Checkpointed: only the 4 segment inputs (and the loss's input) stay.
    assert report.checkpointed_bytes <= 6 * 128 * 64 * 4
    assert report.saved_fraction > 0.8
    assert "saved" in report.describe()


def test_eval_and_no_grad_run_straight_through() -> None:
    stack = checkpoint_blocks(deep_stack(4))
    with torch.no_grad(), saved_activations() as counter:
        stack(torch.randn(2, 64))
    assert counter.bytes == 0


def test_budget_checkpoints_only_as_much_as_needed() -> None:
    blocks = deep_stack()
    x = torch.randn(128, 64)
    per_block = 2 * 128 * 64 * 4
    roomy = checkpoint_blocks(blocks, budget_bytes=100 * per_block, example=x)
    assert roomy.plain == 15  # everything but the last block fits plainly
    tight = checkpoint_blocks(blocks, budget_bytes=6 * per_block, example=x)
    assert tight.plain < 15
    with saved_activations() as counter:
        tight(x.requires_grad_())
    assert counter.bytes <= 6 * per_block
    with pytest.raises(ValueError, match="no checkpointing plan fits"):
        checkpoint_blocks(blocks, budget_bytes=1024, example=x)
    with pytest.raises(ValueError, match="example"):
        checkpoint_blocks(blocks, budget_bytes=1024)
