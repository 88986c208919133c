"""drapps simulate, evaluate-policy and train-policy from the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import BusyDataset

import drapps
from drapps.cli import main
from drapps.control.rl import MlpPolicy

pytestmark = pytest.mark.integration  # starts real engines or interpreters


def test_simulate_a_family_with_a_what_if(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "sim.json"
    code = main(
        ["simulate", "--scenario", "contention", "--policy", "rl", "--duration", "20",
         "--cores", "8", "--disk-slowdown", "2", "--out", str(out)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    assert "drawn from family 'contention'" in text and "with 8 cores and a 2x slower disk" in text
    summaries = json.loads(out.read_text())
    assert [s["variant"] for s in summaries] == ["as is", "with 8 cores and a 2x slower disk"]
    assert all(s["throughput"] > 0 for s in summaries)


def test_simulate_what_if_from_a_real_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "run.jsonl"
    with drapps.Loader(
        BusyDataset(10_000, 0.002), batch_size=8, workers=1, trace=trace, control_interval=0.2
    ) as loader:
        start = time.monotonic()
        for _ in loader:
            time.sleep(0.01)
            if time.monotonic() - start > 2.5:
                break
    assert main(["simulate", "--scenario", str(trace), "--policy", "static-1", "--cores", "4",
                 "--duration", "10"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert f"calibrated from {trace}" in text and "% off" in text
    assert "with 4 cores:" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "nope"], "must be a trace .jsonl or one of"),
        (["--scenario", "missing.jsonl"], "no such trace file"),
        (["--scenario", "cpu-bound", "--policy", "magic"], "policy must be one of"),
        (["--scenario", "cpu-bound", "--policy", "static-0"], "static-N needs a worker count"),
        (["--scenario", "cpu-bound", "--disk-slowdown", "0"], "--disk-slowdown must be > 0"),
        (["--scenario", "cpu-bound", "--cores", "0"], "--cores must be >= 1"),
    ],
)
def test_simulate_bad_input_is_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drapps simulate: ") and message in err and err.count("\n") == 1


def test_evaluate_policy_writes_its_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["evaluate-policy", "--families", "cpu-bound", "--episodes", "1",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    table = json.loads((tmp_path / "results.json").read_text())
    assert set(table["cpu-bound"]) == {"oracle-static", "dataloader", "heuristic", "rl"}
    assert "| cpu-bound |" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["evaluate-policy", "--families", "nope"]) == 2
    assert "family must be one of" in capsys.readouterr().err
    # a fixed count would have run as "static" under its name; baselines are always there
    for fixed in ("static-3", "dataloader", "oracle-static"):
        assert main(["evaluate-policy", "--policies", f"heuristic,{fixed}"]) == 2
        assert "--policies takes policies that move the workers" in capsys.readouterr().err


def test_reward_weights_are_set_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # bursty moves the workers: charging each one added costs the heuristic reward, and only
    # that term changes, so throughput stays as it was
    argv = ["evaluate-policy", "--families", "bursty", "--episodes", "2", "--policies", "heuristic"]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert main([*argv, "--reward", "start=0.5", "--out", str(tmp_path / "charged")]) == 0
    plain, charged = (
        json.loads((tmp_path / name / "results.json").read_text())["bursty"]["heuristic"]
        for name in ("plain", "charged")
    )
    assert charged["reward"] < plain["reward"] and charged["relative"] == plain["relative"]
    capsys.readouterr()
    for bad, message in (
        ("start=x", "reward weight start must be a number, got 'x'"),
        ("bogus=1", "names: wait, imbalance, memory, footprint, idle, start, energy"),
        ("idle=-1", "RewardWeights.idle must be >= 0"),
    ):
        with pytest.raises(SystemExit):
            main(["evaluate-policy", "--reward", bad])
        assert message in capsys.readouterr().err


def test_train_policy_writes_a_loadable_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gymnasium")
    out = tmp_path / "p.npz"
    assert main(["train-policy", "--learner", "ddqn", "--steps", "200", "--families",
                 "cpu-bound", "--evaluate-on", "bursty", "--episodes", "1", "--duration", "10",
                 "--out", str(out)]) == 0  # fmt: skip
    policy = MlpPolicy.load(out)
    assert policy.meta["learner"] == "ddqn" and "bursty" in policy.meta["evaluation"]
    assert "reward" not in policy.meta  # the default reward
    charged = tmp_path / "charged.npz"
    assert main(["train-policy", "--learner", "ddqn", "--steps", "200", "--families",
                 "cpu-bound", "--episodes", "0", "--duration", "10", "--reward", "start=0.2",
                 "--out", str(charged)]) == 0  # fmt: skip
    assert MlpPolicy.load(charged).meta["reward"]["start"] == 0.2  # kept with the policy
    capsys.readouterr()
    assert main(["train-policy", "--learner", "a3c", "--steps", "10"]) == 2
    assert "learner must be one of" in capsys.readouterr().err
    assert main(["train-policy", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
