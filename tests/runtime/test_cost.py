"""Per-sample cost prediction: the history baseline, the learned model, and how they are scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from drapps.runtime.cost import SampleCosts, percentiles


def test_history_predicts_each_index_by_its_last_cost_and_unseen_by_the_median() -> None:
    costs = SampleCosts(10)
    costs.observe([0, 1, 2], [0.001, 0.002, 0.050])
    predicted = costs.predict([2, 0, 9])
    assert np.allclose(predicted, [0.050, 0.001, 0.002])
    assert costs.report()["chosen"] == "history"


def test_keys_that_are_not_indices_are_predicted_at_the_median() -> None:
    costs = SampleCosts(None)
    costs.observe(["a", "b", "c"], [0.001, 0.003, 0.002])
    assert np.allclose(costs.predict(["a", "z"]), [0.002, 0.002])


def test_the_learned_model_uses_file_size_where_history_has_nothing(tmp_path: Path) -> None:
    # Decode cost follows file size; each epoch visits new files, so history never knows them.
    rng = np.random.default_rng(0)
    sizes = rng.choice([1_000, 40_000], size=4000, p=[0.9, 0.1])
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(b"x" * int(size))
        paths.append(str(path))
    costs = SampleCosts(len(paths), path_of=lambda i: paths[i])
    for start in range(0, 3200, 32):  # the last 800 files are never seen
        batch = list(range(start, start + 32))
        costs.observe(batch, [s / 1e7 for s in sizes[start : start + 32]])
    report = costs.report()
    assert report["chosen"] == "learned", report
    assert float(report["learned_error"]) < 0.5 * float(report["history_error"])
    unseen = np.arange(3200, 4000)
    predicted = costs.predict(unseen.tolist())
    big, small = predicted[sizes[unseen] == 40_000], predicted[sizes[unseen] == 1_000]
    assert big.min() > 5 * small.max()


def test_the_tail_ratio_reads_the_slowest_percent_against_the_median() -> None:
    costs = SampleCosts(1000)
    costs.observe(list(range(500)), [0.001] * 500)
    assert costs.tail_ratio() == 1.0
    costs.observe(list(range(500, 520)), [0.05] * 20)
    assert costs.tail_ratio() > 8
    assert costs.report()["observed"] == 520


def test_learning_costs_the_same_however_the_batches_are_cut(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The dispatcher observes whole batches, or the parts of batches cut among workers (a
    # dozen a batch): the learned model takes the same steps per sample either way.
    steps = {"whole": 0, "parts": 0}
    for how, size in (("whole", 32), ("parts", 3)):
        costs = SampleCosts(20_000)
        learn = costs._mlp.learn

        def counted(x, y, how=how, learn=learn):  # type: ignore[no-untyped-def]
            steps[how] += 1
            return learn(x, y)

        monkeypatch.setattr(costs._mlp, "learn", counted)
        for start in range(0, 9600, size):
            indices = list(range(start, min(9600, start + size)))
            costs.observe(indices, [0.001 + 0.01 * (i % 7 == 0) for i in indices])
    assert steps["parts"] <= 1.2 * steps["whole"], steps


def test_the_tails_percentiles_are_numpys_to_the_last_bit() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 255, 256, 512):
        for rounded in (False, True):  # ties, where the ranks around a percentile are equal
            values = rng.lognormal(size=n) * 1e-3
            values = np.round(values, 4) if rounded else values
            for qs in ((50, 99), (0, 100), (25, 75, 90)):
                assert percentiles(values, qs) == np.percentile(values, qs).tolist()
