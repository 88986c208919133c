"""Made-up bench runs and a fake machine for the bench's tests: no process, no timing."""

from __future__ import annotations

from typing import Any


def runs(
    rates: dict[str, list[float]], scenario: str = "steady", workload: str = "image"
) -> list[dict[str, Any]]:
    """Runs of one workload and scenario: ``{case: [samples/s per repeat]}``."""
    found = []
    for case, per_repeat in rates.items():
        system = case.rsplit("-", 1)[0] if case.startswith("dataloader") else case
        for repeat, rate in enumerate(per_repeat):
            found.append(
                {
                    "workload": workload,
                    "scenario": scenario,
                    "system": system,
                    "case": case,
                    "repeat": repeat,
                    "samples_per_s": rate,
                }
            )
    return found


def results(found: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A results record around ``found`` with what the verdict reads."""
    return {
        "runs": found,
        "environment": {"usable_cores": 2},
        "scenarios": {"steady": "nothing changes"},
        **extra,
    }


class FakeMachine:
    """A clock and a ``run`` for ``run_benchmark`` in which each run takes ``fixed_s`` plus
    ``per_batch_s`` a timed batch of fake seconds, times ``slowness`` (which a test may change
    as the bench goes), and delivers a made-up rate per case.

    Args:
        fixed_s: seconds of a run outside its timed window, by system (``"limit"`` for the
            preprocessing limit); ``"*"`` for the others.
        per_batch_s: seconds per timed batch.
        slowness: factor on every run's time; ``slow_after`` runs later it becomes
            ``slowness_later``.
    """

    def __init__(
        self,
        fixed_s: dict[str, float],
        per_batch_s: float,
        slowness: float = 1.0,
        slow_after: int | None = None,
        slowness_later: float = 1.0,
    ) -> None:
        self.now = 0.0
        self.fixed_s, self.per_batch_s = fixed_s, per_batch_s
        self.slowness, self.slow_after, self.slowness_later = slowness, slow_after, slowness_later
        self.specs: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.now

    def run(self, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.slow_after is not None and len(self.specs) >= self.slow_after:
            self.slowness = self.slowness_later
        self.specs.append(spec)
        if spec.get("mode") == "limit":
            self.now += self.fixed_s.get("limit", self.fixed_s["*"]) * self.slowness
            return {"per_core_samples_per_s": 500.0, "samples_per_s": 1000.0}
        batches = spec["measure_batches"]
        fixed = self.fixed_s.get(spec["system"], self.fixed_s["*"]) * self.slowness
        timed = self.per_batch_s * batches * self.slowness
        self.now += fixed + timed
        rate = 1000.0 + 100.0 * (spec["system"] == "drapps-heuristic") + len(self.specs) % 7
        return {
            "batch_size": spec["batch_size"],
            "samples": (spec["warmup_batches"] + batches) * spec["batch_size"],
            "expected_samples": (spec["warmup_batches"] + batches) * spec["batch_size"],
            "shape_mismatch": None,
            "samples_per_s": rate,
            "wait_fraction": 1.0,
            "final_workers": spec["workers"],
            "end_to_end_s": fixed + timed,
            "first_batch_s": 0.1,
            "timeline": [[timed * (b + 1) / batches, 0.0] for b in range(batches)],
            "load_spans": [],
        }
