"""The reference trainer and `drapps train`, end to end on tiny files in the real formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from drapps.cli import main
from drapps.datasets import write_cifar10, write_wikitext
from drapps.reference import TrainConfig, train
from drapps.reference.standin import write_cifar10_standin, write_wikitext2_standin

pytestmark = pytest.mark.integration  # starts real engines or interpreters

PROSE = (
    " = Robert Boulter = \n\n Robert Boulter is an English film , television and theatre actor . "
    "He had a guest @-@ starring role on the television series The Bill in 2000 . \n"
)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two easy classes (dark and bright images) in CIFAR-10's python format."""
    root = tmp_path_factory.mktemp("cifar")
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, 2, n)
        images = rng.integers(0, 96, (n, 3, 32, 32)) + 150 * labels[:, None, None, None]
        return images.astype(np.uint8), labels

    write_cifar10(root, split(160), split(32), format="python")
    return root


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wikitext")
    write_wikitext(root, {"train": PROSE * 60, "valid": PROSE * 4, "test": PROSE * 4})
    return root


def test_resnet_recipe_with_every_single_process_piece(cifar: Path) -> None:
    config = TrainConfig(
        recipe="resnet-cifar10",
        data=str(cifar),
        model="resnet18-w4",
        amp="bf16",
        accumulate="gns",
        max_k=4,
        checkpointing="sqrt",
        schedule="warmup-cosine",
        lr=3e-3,
        micro_batch=16,
        max_steps=12,
        eval_every=6,
        target=0.0,
        workers=1,
        log_every=4,
    )
    report = train(config)
    assert report.steps == 12 and report.items >= 12 * 16
    assert [step for step, _, _ in report.evaluations] == [6, 12]
    assert report.final_quality is not None and 0.0 <= report.final_quality <= 100.0
    assert report.time_to_target is not None  # 0% is reached at the first evaluation
    assert report.throughput > 0 and report.peak_memory_bytes > 0
    assert 1 <= report.final_k <= 4
    # The amp and checkpointing trials (2 warm-up + 2 x 4 timed steps each) both ended.
    assert len(report.decisions) == 2
    assert report.decisions[0].startswith("amp bf16: ")
    assert report.decisions[1].startswith("checkpointing: ")


def test_gpt2_recipe_learns_and_an_unreached_target_is_reported(
    wikitext: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = TrainConfig(
        recipe="gpt2-wikitext2",
        data=str(wikitext),
        model="gpt2-tiny",
        accumulate="2",
        lr=3e-3,
        micro_batch=4,
        max_steps=20,
        eval_every=20,
        target=1.0,
        workers=0,
    )
    report = train(config)
    assert report.items_unit == "tokens" and report.items == 20 * 2 * 4 * 64
    assert report.final_quality is not None and report.final_quality < 2000  # from ~50,257
    assert report.time_to_target is None
    out = capsys.readouterr().out
    assert "step    20" in out and "eval step 20: perplexity" in out
    assert "not reached" in report.describe()


@pytest.mark.timeout(240)
def test_zero2_over_two_processes(wikitext: Path) -> None:
    config = TrainConfig(
        recipe="gpt2-wikitext2",
        data=str(wikitext),
        model="gpt2-tiny",
        zero=2,
        nproc=2,
        micro_batch=4,
        max_steps=4,
        eval_every=4,
        eval_batches=2,
        workers=0,
    )
    report = train(config)
    assert report.steps == 4
    assert report.items == 4 * 2 * 4 * 64  # both ranks' tokens
    assert report.final_quality is not None


@pytest.mark.timeout(240)
def test_the_noise_scale_runs_under_zero2(wikitext: Path) -> None:
    config = TrainConfig(
        recipe="gpt2-wikitext2", data=str(wikitext), model="gpt2-tiny", zero=2, nproc=2,
        micro_batch=4, max_steps=6, eval_every=6, eval_batches=2, workers=0,
        accumulate="gns", max_k=2, adaptive=False,
    )  # fmt: skip
    report = train(config)
    assert report.steps == 6 and report.noise_scale is not None and report.noise_scale > 0
    assert report.noise_scale_error is not None and 1 <= report.final_k <= 2


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"recipe": "bert-squad"}, "recipe must be one of"),
        ({"model": "resnet152"}, "has models"),
        ({"amp": "fp8"}, "amp"),
        ({"accumulate": "lots"}, "accumulate"),
        ({"checkpointing": "half"}, "checkpointing"),
        ({"zero": 3}, "zero"),
        ({"nproc": 2}, "nproc"),
        ({"schedule": "step"}, "schedule"),
        ({"max_steps": 0}, "max_steps"),
        ({"workers": -1}, "workers"),
        ({"data": "/no/such/folder"}, "does not exist"),
        ({"loader": "tfdata"}, r"loader must be one of \['drapps', 'dataloader'\]"),
        ({"contention": (5, 5)}, "contention must be steps"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0"),
    ],
)
def test_bad_configs_are_named(cifar: Path, overrides: dict[str, object], match: str) -> None:
    settings: dict[str, object] = {"recipe": "resnet-cifar10", "data": str(cifar)}
    settings.update(overrides)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        TrainConfig(**settings)  # type: ignore[arg-type]


def test_cli_trains_and_writes_the_report(
    cifar: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    args = ["train", "--recipe", "resnet-cifar10", "--data", str(cifar), "--model", "resnet18-w4"]
    args += ["--micro-batch", "16", "--max-steps", "3", "--workers", "0", "--out", str(out)]
    assert main(args) == 0
    assert "final accuracy" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["steps"] == 3 and report["settings"]["amp"] == "fp32"


def test_cli_names_bad_input(cifar: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--recipe", "nope", "--data", str(cifar)]) == 2
    err = capsys.readouterr().err
    assert "recipe must be one of ['resnet-cifar10', 'gpt2-wikitext2'], got 'nope'" in err
    empty = cifar.parent / "empty"
    empty.mkdir(exist_ok=True)
    assert main(["train", "--recipe", "resnet-cifar10", "--data", str(empty)]) == 2
    assert "no CIFAR-10 batches" in capsys.readouterr().err


def test_standins_are_in_the_real_formats(tmp_path: Path) -> None:
    folder = write_cifar10_standin(tmp_path / "cifar", train_per_class=5, test_per_class=2)
    assert (folder / "data_batch_5.bin").stat().st_size == 10 * 3073  # 50 images over 5 files
    assert main(["train-data", "cifar10", str(tmp_path / "cli"), "--small"]) == 0
    sources = tmp_path / "docs"
    sources.mkdir()
    for i in range(40):
        (sources / f"page{i}.rst.txt").write_text(f"Page {i}\n======\n\n{PROSE}")
    wiki = write_wikitext2_standin(tmp_path / "wiki", sources=sources)
    assert {p.name for p in wiki.iterdir()} == {"wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"}
    with pytest.raises(FileNotFoundError, match=r"python3\.11-doc"):
        write_wikitext2_standin(tmp_path / "none", sources=tmp_path / "missing")


def test_a_split_smaller_than_one_micro_batch_is_named(cifar: Path) -> None:
    config = TrainConfig(
        recipe="resnet-cifar10", data=str(cifar), model="resnet18-w4", micro_batch=1000
    )
    with pytest.raises(ValueError, match="fewer than 1000 items"):
        train(config)


@pytest.mark.timeout(240)
def test_ablation_runs_each_arm_in_a_fresh_process_and_tabulates(
    cifar: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ablation"
    args = ["train-ablation", "--arms", "baseline,checkpointing", "--out", str(out), "--"]
    args += ["--recipe", "resnet-cifar10", "--data", str(cifar), "--model", "resnet18-w4"]
    args += ["--micro-batch", "16", "--max-steps", "2", "--workers", "0", "--target", "0"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"baseline", "checkpointing"}
    assert results["runs"]["checkpointing"][0]["settings"]["checkpointing"] == "sqrt"
    assert results["runs"]["checkpointing"][0]["settings"]["adaptive"] is False
    medians = results["medians"]
    assert medians["checkpointing"]["activation_bytes"] < medians["baseline"]["activation_bytes"]
    table = (out / "results.md").read_text()
    assert "| baseline |" in table and "| checkpointing |" in table
    assert table in capsys.readouterr().out


def test_ablation_names_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-ablation", "--arms", "turbo"]) == 2
    assert "give the drapps train options" in capsys.readouterr().err
    assert main(["train-ablation", "--arms", "turbo", "--", "--recipe", "x"]) == 2
    assert "unknown arms ['turbo']" in capsys.readouterr().err


@pytest.mark.parametrize("loader", ["drapps", "dataloader"])
def test_the_loader_is_an_arm_and_contention_runs_and_ends(cifar: Path, loader: str) -> None:
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    config = TrainConfig(
        recipe="resnet-cifar10", data=str(cifar), model="resnet18-w4", micro_batch=16,
        max_steps=6, eval_every=6, workers=1, loader=loader, contention=(2, 4), seed=3,
    )  # fmt: skip
    report = train(config)
    assert report.steps == 6 and report.settings["loader"] == loader
    assert report.settings["contention"] == (2, 4)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [p for p in left if psutil.pid_exists(p) and "while True" in " ".join(
        psutil.Process(p).cmdline())]  # fmt: skip


def test_the_cli_takes_loader_and_contention(cifar: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["train", "--recipe", "resnet-cifar10", "--data", str(cifar), "--model", "resnet18-w4"]
    args += ["--micro-batch", "16", "--max-steps", "3", "--workers", "0", "--loader"]
    args += ["dataloader", "--contention", "1:2", "--max-grad-norm", "1.0", "--out", str(out)]
    assert main(args) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["loader"] == "dataloader" and settings["contention"] == [1, 2]
    assert settings["max_grad_norm"] == 1.0
    with pytest.raises(SystemExit) as exited:  # argparse's own error: one line, exit 2
        main([*args[:-2], "--contention", "2"])
    assert exited.value.code == 2
