from __future__ import annotations

import re
from pathlib import Path

import pytest

from drapps.cli import main

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
            "60",
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
    assert "the training loop waited" in out and "60 batches, 480 samples" in out
    assert (project / "t.jsonl").read_text().startswith('{"type": "header"')


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
