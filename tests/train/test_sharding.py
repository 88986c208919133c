"""ZeRO-2 (FSDP2), ZeRO-1 and DDP on 2 gloo processes match single-process training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import tiny_mlp, zero_batch, zero_rank_training

from drapps.train import make_optimizer, shard, spawn

pytestmark = pytest.mark.integration  # starts real engines or interpreters


def single_process(steps: int) -> dict[str, torch.Tensor]:
    model = tiny_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for step in range(steps):
        x, y = zero_batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("zero", [2, 1, 0])
def test_two_gloo_ranks_match_one_process(zero: int, tmp_path: Path) -> None:
    steps = 4
    out = tmp_path / "state.pt"
    spawn(zero_rank_training, 2, zero, steps, str(out))
    sharded = torch.load(out)
    want = single_process(steps)
    assert sharded.keys() == want.keys()
    start = tiny_mlp().state_dict()
    for name, value in want.items():
        assert not torch.equal(value, start[name])  # training moved every tensor
        torch.testing.assert_close(sharded[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_bad_stage_and_missing_process_group_are_named() -> None:
    with pytest.raises(ValueError, match="zero"):
        shard(tiny_mlp(), zero=3)
    with pytest.raises(RuntimeError, match="torchrun"):
        shard(tiny_mlp(), zero=2)
    with pytest.raises(ValueError, match="zero"):
        make_optimizer(tiny_mlp(), 4, torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="nprocs"):
        spawn(zero_rank_training, 0)


def test_spawn_retries_when_its_port_is_taken_before_rank_0_binds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import socket
    import tempfile

    from helpers import barrier_rank

    from drapps.train import sharding

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken, real, calls = holder.getsockname()[1], sharding._free_port, []

    def free_port() -> int:
        calls.append(1)
        return taken if len(calls) == 1 else real()

    monkeypatch.setattr(sharding, "_free_port", free_port)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where torch's error files go
    try:
        spawn(barrier_rank, 2)
    finally:
        holder.close()
    assert len(calls) == 2  # the taken port failed, the next one worked
    assert not list(tmp_path.iterdir())  # the failed ranks' error files are removed


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
@pytest.mark.parametrize("world", [2, 4])
def test_the_noise_scale_across_ranks_is_the_single_process_one(
    world: int, kind: str, tmp_path: Path
) -> None:
    import json

    from helpers import noise_scale_rank, regression_b_noise, regression_noise_scale

    single = regression_noise_scale(1, 0, 300)
    out = tmp_path / "rank0.json"
    spawn(noise_scale_rank, world, 300, str(out), kind)
    ranked = json.loads(out.read_text())
    # The same micro-batches as small batches, the same mean as the big one: the same pair
    # every step (with world=4 each rank holds one micro-batch, so no step pairing is needed).
    assert ranked["updates"] == single["updates"] == 300
    assert ranked["estimate"] == pytest.approx(single["estimate"], rel=1e-4)
    assert single["estimate"] == pytest.approx(regression_b_noise(1.0, 1.0, 10), rel=0.25)
