"""Made-up bench runs for the bench's tests: no process, no timing."""

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
