"""The GPU consumer's model and step, the GPU reading of a run, and the GPU peer's guard, on a
machine without CUDA (the GPU itself: ``tests/gpu``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from drapps.bench.case import GpuUse, make_step
from drapps.bench.models import DeviceStep, resnet50
from drapps.bench.report import scenario_table
from drapps.bench.systems import SYSTEMS
from drapps.bench.workloads import workload_class


def test_resnet50_has_its_shape_and_size() -> None:
    model = resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's count
    assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)


def test_the_device_step_trains_on_the_cpu() -> None:
    step = DeviceStep(lambda: resnet50(classes=4), "cpu")
    before = [p.detach().clone() for p in step.model.parameters()]
    step(torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8), torch.tensor([0, 3]))
    after = list(step.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-in of the GPU consumer")
def test_the_cuda_model_consumer_is_the_cpu_model_without_cuda() -> None:
    workload = workload_class("image")({"folder": "unused", "samples": 1})
    step = make_step("cuda-model", workload, 40.0)
    step(torch.zeros(2, 3, 224, 224, dtype=torch.uint8), torch.tensor([0, 1]), 1.0)
    with pytest.raises(ValueError, match="consumer must be one of"):
        make_step("gpu-model", workload, 40.0)
    with pytest.raises(ValueError, match="'synthetic' has no GPU model"):
        workload_class("synthetic")({"samples": 1}).cuda_model("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_without_a_gpu_a_run_reads_no_gpu_and_the_gpu_peer_says_why() -> None:
    gpu = GpuUse(interval=0.01)
    assert gpu.stop() is None
    why = SYSTEMS["dali-gpu"].unavailable() or ""
    assert "needs a CUDA GPU" in why or "nvidia.dali is not installed" in why


def _row(case: str, gpu_idle: float | None) -> dict[str, Any]:
    return {
        "workload": "image", "scenario": "steady", "case": case,
        "system": case.rsplit("-", 1)[0],
        "workers": 1, "repeats": 1, "final_workers": [1], "samples_per_s": 100.0,
        "samples_per_s_min": 100.0, "samples_per_s_max": 100.0, "wait_fraction": 0.1,
        "wait_p50_ms": 1.0, "wait_p99_ms": 2.0, "cpu_util": 0.5, "peak_rss_mib": 10.0,
        "first_batch_s": 0.1, "end_to_end_s": 1.0, "gpu_idle": gpu_idle,
    }  # fmt: skip


def test_the_table_shows_the_gpu_idle_share_when_a_gpu_was_read() -> None:
    read = {"summary": [_row("dataloader-1", 0.25), _row("dali-gpu-4", None)]}
    lines = scenario_table(read, "image", "steady")
    assert "| GPU idle |" in lines[2] and lines[3].count("|") == lines[2].count("|")
    assert "| 10% | 25% |" in lines[4] and "| 10% | - |" in lines[5]
    unread = {"summary": [_row("dataloader-1", None)]}
    assert "GPU idle" not in scenario_table(unread, "image", "steady")[2]


def test_the_gpu_check_plans_long_windows_and_says_when_there_is_no_gpu(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from drapps.bench import gpu_check

    none = gpu_check.bench_command("none", tmp_path / "none")
    model = gpu_check.bench_command("cuda-model", tmp_path / "model")
    assert none[none.index("--seconds") + 1] == "20.0" and "--batch-size" not in none
    assert model[model.index("--batch-size") + 1] == "256"
    assert "drapps-offload" in none[none.index("--systems") + 1]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert gpu_check.gpu_name() == "h100"
    assert gpu_check.main(["bench", str(tmp_path)]) == 2
    assert "part must be one of" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gpu_check.main(["env", str(tmp_path)]) == 2
        assert "needs CUDA" in capsys.readouterr().err
