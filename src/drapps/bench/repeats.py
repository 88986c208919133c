"""The interleaved repeats of a bench run, each run a fresh process, within its budget.

Each repeat runs every case once, and each workload's preprocessing limit, in an order shuffled
per repeat (seeded), so drift of the machine spreads over all cases instead of landing on one.
With a budget, the first repeat starts with one run of each system and the limits, from which
:class:`drapps.bench.budget.RepeatPlanner` chooses the window; before every further repeat,
and every run of one, the planner says whether it still fits. A repeat stopped partway is left
out whole, so every case has the same repeats and every ratio stays paired.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from drapps.bench.budget import Levels, RepeatPlanner
from drapps.bench.systems import Workers, system_class
from drapps.bench.verdict import OutsideLoad, settled

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    """One (workload, scenario, system, worker setting): what each repeat runs once."""

    workload: str
    scenario: str
    system: str
    workers: Workers

    @property
    def name(self) -> str:
        return system_class(self.system).case_name(self.workers)


Item = Case | str
"""One run of a repeat: a case, or a workload's name for its preprocessing limit."""
RunFunction = Callable[[dict[str, Any], float], dict[str, Any]]
"""Runs one spec (:func:`run_one`, or a test's fake) within a timeout; returns its result."""


def cost_levels(item: Item) -> Levels:
    """What the budget predicts a run's cost from: its own last run, else its system's in the
    same scenario, else its system's anywhere."""
    if isinstance(item, str):
        return (("limit", item), "limit")
    return (
        (item.workload, item.scenario, item.name),
        (item.workload, item.scenario, item.system),
        item.system,
    )


def first_repeat_order(
    cases: list[Case], workloads: tuple[str, ...], order: random.Random
) -> tuple[list[Item], int]:
    """The first repeat's runs, and how many of them come first to measure what runs cost: each
    workload's preprocessing limit and one case of each system, in random order, then the rest
    shuffled."""
    shuffled = [*cases]
    order.shuffle(shuffled)
    first: list[Item] = [*workloads]
    rest: list[Item] = []
    seen: set[tuple[str, str]] = set()
    for case in shuffled:
        if (case.workload, case.system) in seen:
            rest.append(case)
        else:
            seen.add((case.workload, case.system))
            first.append(case)
    order.shuffle(first)
    return [*first, *rest], len(first)


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per run otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.started = time.monotonic()

    def update(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        filled = round(20 * self.done / self.total)
        line = (
            f"bench [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} "
            f"{int(elapsed) // 60}m{int(elapsed) % 60:02d}s elapsed, ~{int(eta) // 60}m"
            f"{int(eta) % 60:02d}s left | {text}"
        )
        if self.tty:
            end = "\n" if self.done == self.total else ""
            self.stream.write(f"\r\x1b[2K{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End the bar's line on a terminal where the last update did not."""
        if self.enabled and self.tty and 0 < self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()


def run_one(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one case in a fresh Python process and return its measurements."""
    with tempfile.TemporaryDirectory(prefix="drapps-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
        command = [sys.executable, "-m", "drapps.bench.case", str(spec_path), str(result_path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"case {spec['case']} ({spec['workload']}, {spec['scenario']}) ran past "
                f"{timeout:g} s"
            ) from None
        if done.returncode != 0 or not result_path.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(
                f"case {spec['case']} ({spec['workload']}, {spec['scenario']}) failed with "
                f"exit code {done.returncode}:\n{tail}"
            )
        result: dict[str, Any] = json.loads(result_path.read_text())
        return result


@dataclass
class Measured:
    """What the complete repeats measured."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    """Every timed run, with its case and repeat."""
    limits: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each workload's preprocessing limit, once per repeat."""
    outside: list[float] = field(default_factory=list)
    """The share of the usable cores other processes took, per repeat."""


SpecFunction = Callable[[Item, int, int], dict[str, Any]]
"""The spec of one run: of ``item`` in repeat ``repeat`` (from 0), timing ``window`` batches."""


def run_repeats(
    cases: list[Case],
    workloads: tuple[str, ...],
    planner: RepeatPlanner,
    spec: SpecFunction,
    *,
    seed: int,
    timeout_s: float,
    run: RunFunction = run_one,
    clock: Callable[[], float] = time.monotonic,
    progress: bool = True,
) -> Measured:
    """Run ``cases`` and each of ``workloads``' preprocessing limit in repeats interleaved
    with a ``seed``ed order while ``planner`` says they fit; each run's spec comes from
    ``spec`` with ``planner.window`` timed batches, and may take ``timeout_s``."""
    items: list[Item] = [*cases, *workloads]
    every = [cost_levels(item) for item in items]
    bar = Progress(len(every) * planner.repeats, enabled=progress)
    order = random.Random(seed)
    measured = Measured(limits={w: [] for w in workloads})
    runs, limits, outside = measured.runs, measured.limits, measured.outside
    repeat = 0
    while planner.start_repeat(repeat, every, settled(runs)):
        bar.total = max(bar.total, bar.done + len(every))
        load = OutsideLoad()
        load.start()
        queue = [*items]
        pilot = 0
        if repeat == 0 and planner.budget_s is not None:
            queue, pilot = first_repeat_order(cases, workloads, order)
        else:
            order.shuffle(queue)
        these: list[dict[str, Any]] = []
        timed: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
        done = 0
        while done < len(queue):
            if not planner.keep_going(repeat, [cost_levels(item) for item in queue[done:]]):
                break
            item = queue[done]
            before = clock()
            result = run(spec(item, repeat, planner.window), timeout_s)
            timeline = result.get("timeline") or []
            timed_s = timeline[-1][0] if timeline else 0.0
            planner.record(cost_levels(item), clock() - before, timed_s, len(timeline))
            done += 1
            if isinstance(item, str):
                timed[item].append(result)
                rate = result["samples_per_s"]
                bar.update(f"{item} preprocessing limit: {rate:.0f} samples/s")
            else:
                these.append({**asdict(item), "case": item.name, "repeat": repeat, **result})
                bar.update(
                    f"{item.workload}/{item.scenario} {item.name}: "
                    f"{result['samples_per_s']:.0f} samples/s"
                )
            if done == pilot:
                redo = [item for item in queue[:pilot] if isinstance(item, Case)]
                if planner.choose_window(
                    rest=[cost_levels(item) for item in queue[pilot:]],
                    redo=[cost_levels(item) for item in redo],
                    every=every,
                ):
                    # Every run of a bench has one window: time the first runs again at it.
                    logger.info("timing %d batches a run to fit the budget", planner.window)
                    these = []
                    rest = [*queue[pilot:], *redo]
                    order.shuffle(rest)
                    queue = [*queue[:pilot], *rest]
                bar.total = bar.done + (len(queue) - done) + (planner.planned - 1) * len(every)
        if done < len(queue):  # stopped partway: the rest no longer fitted the budget
            logger.info("repeat %d stopped partway to end within the budget", repeat + 1)
            planner.drop_repeat()
            break
        runs.extend(these)
        for name, measures in timed.items():
            limits[name] += measures
        outside.append(load.share())
        planner.end_repeat()
        repeat += 1
    bar.finish()
    return measured
