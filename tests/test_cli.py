from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from drapps.cli import main

pytestmark = pytest.mark.integration  # starts real engines or interpreters

DATASET = """
import time
import torch

class Squares:
    def __len__(self):
        return 2000

    def __getitem__(self, i):
        start = time.process_time()
        while time.process_time() - start < 0.001:
            pass
        return torch.tensor(i * i)

def make():
    return Squares()
"""


# Enough batches for the controller's ticks (every 0.05 s) to fill a full report on a fast,
# idle machine as on a loaded one: a run shorter than a few ticks gets the short report,
# which the telemetry tests check on their own.
BATCHES = "200"


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mydata.py").write_text(DATASET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_profile_prints_a_report_and_writes_a_trace(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "profile",
            "--dataset",
            "mydata:make",
            "--batches",
            BATCHES,
            "--batch-size",
            "8",
            "--interval",
            "0.05",
            "--trace",
            str(project / "t.jsonl"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "the training loop waited" in out and "200 batches, 1600 samples; 0 worker" in out
    # The count is the report's to tell (the one the run settled on, and why), not the count
    # of the last instant, which may be a try cut short.
    assert re.search(r"Workers (stayed at|went) [1-9]", out) and "final workers" not in out
    assert (project / "t.jsonl").read_text().startswith('{"type": "header"')


def test_profile_with_a_fixed_count_says_it_was_given(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", "--dataset", "mydata:make", "--batches", BATCHES, "--batch-size", "8"]
    assert main([*argv, "--workers", "2", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "Workers: 2 throughout, the count you gave" in out
    assert "controller" not in out and "settled" not in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mydata", "--dataset must look like module:factory, got 'mydata'"),
        ("nosuch:make", "cannot import 'nosuch' for --dataset"),
        ("mydata:build", r"'mydata' has no 'build' for --dataset; it has \['Squares', 'make'"),
        ("mydata:time", "gave a module, not a map-style dataset"),
    ],
)
def test_profile_names_bad_datasets(
    project: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    assert main(["profile", "--dataset", spec]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--redis", "http://h:1"], "--redis must be a Redis URL"),
        (["--transform", "mydata:nope"], r"'mydata' has no 'nope' for --transform"),
        (["--collate", "mydata:Squares.__len__"], "has no"),
        (["--dataset", "mydata:time"], "gave a module, not a map-style dataset"),
    ],
)
def test_serve_names_bad_options(
    project: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    base = {"--redis": "redis://127.0.0.1:1/0", "--dataset": "mydata:make"}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        base[flag] = value
    assert main(["serve", *(part for pair in base.items() for part in pair)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_bench_list_names_every_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("image", "text", "synthetic", "steady", "cpu-contention", "consumer-shift"):
        assert f"  {name} " in out
    for name in ("slow-io", "dataloader", "tf-autotune", "drapps-static", "drapps-heuristic"):
        assert f"  {name} " in out
    assert "drapps-rl" in out


def test_bench_rejects_unknown_names_listing_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--workload", "imagenet"]) == 2
    assert (
        "workload must be one of ['image', 'image-gil', 'text', 'synthetic', 'stragglers'], "
        "got 'imagenet'" in (capsys.readouterr().err)
    )
    assert main(["bench", "--scenario", "steady,flood"]) == 2
    assert "scenario must be one of ['steady', 'cpu-contention', 'consumer-shift', 'slow-io']" in (
        capsys.readouterr().err
    )
    assert main(["bench", "--consumer", "gpu"]) == 2
    assert "consumer must be one of ['none', 'sleep', 'cpu-model', 'cuda-model'], got 'gpu'" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["bench", "--workers", "two"])
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_bench_plot_rejects_a_file_that_is_not_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench-plot", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"benchmark": "image-loader"}')
    assert main(["bench-plot", str(other)]) == 2
    assert "not a results.json written by this version" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_bench_writes_json_and_markdown_then_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["bench", "--size", "smoke", "--systems", "dataloader,drapps-static", "--workers", "1"]
    args += ["--static-workers", "1"]
    args += ["--batches", "4", "--repeats", "1", "--data-dir", str(tmp_path), "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "image, steady:" in printed and "dataloader-1 *" in printed
    assert "drapps-static-1" in printed and "Verdict (" in printed
    # One repeat names no winner: "not separable", or on a busy machine the bare figure.
    verdict = " ".join(printed.split())
    assert "the best fixed DataLoader (dataloader-1)" in verdict
    assert "no interval from one repeat" in verdict and "drapps was" not in verdict
    assert max(len(line) for line in printed.splitlines()) <= 100  # a terminal's width
    tables = (out / "results.md").read_text()
    assert "#### `image`, `steady`" in tables and "| **dataloader-1** |" in tables
    assert "| drapps-static-1 |" in tables and "Verdict (" in tables
    assert main(["bench-plot", str(out / "results.json")]) == 0
    assert (out / "image-throughput.png").exists()
    assert (out / "image-steady-over-time.png").exists()
    assert (out / "image-end-to-end.png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--workload", "imagenet"],
        ["bench", "--workers", "two"],
        ["profile", "--dataset", "nomodule"],
        ["train", "--recipe", "nope", "--data", "."],
        ["train-ablation"],
        ["simulate", "--scenario", "cpu-bound", "--cores", "0"],
        ["evaluate-policy", "--episodes", "0"],
        ["serve", "--redis", "http://127.0.0.1:6379", "--dataset", "os:cpu_count"],
        ["serve", "--redis", "redis://127.0.0.1:1/0", "--dataset", "nomodule:make"],
        ["serve", "--redis", "redis://127.0.0.1:1/0", "--dataset", "os:cpu_count"],
        [
            "serve",
            "--redis",
            "redis://127.0.0.1:1/0",
            "--dataset",
            "os:cpu_count",
            "--workers",
            "0",
        ],
        [
            "serve",
            "--redis",
            "redis://127.0.0.1:1/0",
            "--dataset",
            "x:y",
            "--password-env",
            "NO_SUCH_VAR_X",
        ],
        ["bench-scale-out", "--repeats", "0"],
        ["nosuchcommand"],
    ],
)
def test_every_usage_error_is_one_line_and_exit_code_2(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "drapps.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("drapps") and done.stderr.count("\n") == 1, done.stderr
