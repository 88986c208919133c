"""Traces: one JSON line per controller tick, readable back into typed rows.

Format (version 1), one JSON object per line:

* first line, ``{"type": "header", "version": 1, "drapps": <version>, "started": <ISO time>,
  "config": {...}}``: the loader's settings;
* then per tick ``{"type": "tick", "t": <s>, "state": {State fields}, "action": {Action
  fields}, "applied": {"workers": n, "prefetch": d}, "reward": r, "workers": {pid: {"cpu",
  "rss", "pss"}}, "stages": {"fetch_s", "transform_s", "collate_s", "transport_s"}, "notes": {knob:
  why its value differs from what the action asked}}`` (``notes`` only when there is one).

``state`` holds every :class:`~drapps.control.State` field, so the simulator can calibrate from
a trace. Readers ignore fields they do not know; the version changes when a field changes
meaning.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from drapps.control.action import Action
from drapps.control.state import State

TRACE_VERSION = 1


@dataclass(frozen=True)
class TraceRow:
    """One tick of a trace."""

    t: float
    state: State
    action: Action
    applied: dict[str, int | float | str]
    """Every knob's value after the tick's action was clipped and applied, by knob name
    (``{"workers": n, "prefetch": d}``, plus ``split`` / ``offload`` / ``codec`` where they
    exist)."""
    reward: float
    workers: dict[str, dict[str, float]] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """Per knob, why its value differs from what the action asked (a bound, the core share)."""

    @property
    def workers_after(self) -> int:
        return int(self.applied.get("workers", self.state.workers))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "tick",
            "t": self.t,
            "state": self.state.as_dict(),
            "action": self.action.as_dict(),
            "applied": self.applied,
            "reward": self.reward,
            "workers": self.workers,
            "stages": self.stages,
            **({"notes": self.notes} if self.notes else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceRow:
        return cls(
            t=float(data["t"]),
            state=State.from_dict(data["state"]),
            action=Action.from_dict(data["action"]),
            applied={
                k: v if isinstance(v, str | float) else int(v) for k, v in data["applied"].items()
            },
            reward=float(data["reward"]),
            workers=data.get("workers", {}),
            stages=data.get("stages", {}),
            notes={str(k): str(v) for k, v in data.get("notes", {}).items()},
        )


@dataclass(frozen=True)
class Trace:
    header: dict[str, Any]
    rows: list[TraceRow]


class TraceWriter:
    """Appends rows to a JSONL trace; flushes every row so a crash loses at most one."""

    def __init__(self, path: str | os.PathLike[str], config: dict[str, Any]) -> None:
        from drapps._version import __version__

        self.path = Path(path)
        self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._write(
            {
                "type": "header",
                "version": TRACE_VERSION,
                "drapps": __version__,
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "config": config,
            }
        )

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"trace {self.path} is closed")
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def write(self, row: TraceRow) -> None:
        self._write(row.to_json())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by :class:`TraceWriter`.

    Raises:
        ValueError: the file is not a drapps trace, or of a version this drapps cannot read,
            naming the file and line.
    """
    header: dict[str, Any] | None = None
    rows = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if header is None:
                if record.get("type") != "header":
                    raise ValueError(f"{path}:{number}: expected a drapps trace header")
                if record.get("version") != TRACE_VERSION:
                    raise ValueError(
                        f"{path}: trace version {record.get('version')!r}, this drapps reads "
                        f"version {TRACE_VERSION}"
                    )
                header = record
            elif record.get("type") == "tick":
                try:
                    rows.append(TraceRow.from_json(record))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"{path}:{number}: malformed tick: {exc!r}") from exc
    if header is None:
        raise ValueError(f"{path}: empty file, not a drapps trace")
    return Trace(header, rows)


def while_loading(rows: Sequence[TraceRow]) -> Sequence[TraceRow]:
    """The rows up to the last tick in which the loop took a batch or waited for one (none if
    it never did): ticks after the loop stopped (the loader left open) say nothing about
    loading."""
    last = max(
        (i for i, r in enumerate(rows) if r.state.throughput > 0 or r.state.wait_fraction > 0),
        default=-1,
    )
    return rows[: last + 1]
