"""Data-parallel training with real gloo ranks (torchrun), Lightning DDP and Accelerate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port

pytestmark = pytest.mark.integration  # starts real engines or interpreters

SCRIPTS = Path(__file__).parent / "distributed"


def loopback_env(tmp: Path) -> dict[str, str]:
    """The ranks' environment: loopback only, and ``tmp`` as their temporary directory (torch
    elastic's run folders and error files, which it leaves, and the ranks' core claims)."""
    env = dict(os.environ)
    env.update(GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    env["TMPDIR"] = str(tmp)
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), env.get("PYTHONPATH", "")])
    return env


def torchrun(ranks: int, mode: str, out: Path) -> list[dict[str, Any]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(SCRIPTS / "ranks.py"), str(out), mode,
    ]  # fmt: skip
    # A session of its own: on a timeout the ranks go too, not only torchrun (orphaned ranks
    # would hold the host's core claims and stall every later test).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=loopback_env(out), start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"torchrun timed out; ranks' stacks:\n{stderr[-8000:]}") from None
    assert process.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def assert_partition(shards: list[list[int]], n: int) -> None:
    together = [i for shard in shards for i in shard]
    assert len(together) == n and sorted(together) == list(range(n)), "not a partition"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_without_a_sampler_each_rank_reads_its_own_shard(ranks: int, tmp_path: Path) -> None:
    records = torchrun(ranks, "shard", tmp_path)
    for epoch in range(2):
        assert_partition([r["epochs"][epoch] for r in records], 40)
    assert records[0]["epochs"][0] != records[0]["epochs"][1]  # reshuffled every epoch
    for r in records:
        assert r["len"] == -(-(40 // ranks) // 4)
    assert_partition([r["resumed"] for r in records], 40)  # epoch 2, checkpointed and resumed
    assert_partition([r["torch_seeded"] for r in records], 40)  # ranks' RNGs differ


@pytest.mark.timeout(300)
def test_a_distributed_sampler_gives_what_dataloader_gives(tmp_path: Path) -> None:
    records = torchrun(2, "sampler", tmp_path)
    for r in records:
        assert r["epochs"] == r["reference"]
    for epoch in range(2):
        seen = [i for r in records for i in r["epochs"][epoch]]
        assert sorted(set(seen)) == list(range(42)) and len(seen) == 42


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_of_one_host_share_its_cores(ranks: int, tmp_path: Path) -> None:
    records = torchrun(ranks, "cores", tmp_path)
    cores = len(os.sched_getaffinity(0))
    held = sum(r["workers"] for r in records)
    # Each rank keeps at least one worker (min_workers); together they fit the host.
    assert held <= max(cores, ranks), (held, [r["claims"] for r in records])
    claims = records[0]["claims"]
    assert len(claims) == ranks and sum(claims.values()) <= max(cores, ranks)


@pytest.mark.timeout(300)
def test_lightning_ddp_gives_each_rank_its_own_shard(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    env = loopback_env(tmp_path)
    env["MASTER_PORT"] = str(free_port())
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "lightning_ddp.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        assert_partition([r["seen"][epoch] for r in records], 64)
    assert records[0]["seen"]["0"] != records[0]["seen"]["1"]


@pytest.mark.timeout(300)
def test_accelerate_prepare_keeps_each_process_on_its_shard(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(SCRIPTS / "accelerate_ddp.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env=loopback_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-5000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 for r in records)
    assert_partition([r["seen"] for r in records], 48)
