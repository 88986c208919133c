"""What every benchmarked loading system provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload

Workers = int | str


class Source(ABC):
    """An open loader: an endless iterator of torch ``(x, y)`` batches, then ``close()``."""

    @abstractmethod
    def __iter__(self) -> Iterator[Any]: ...

    def workers(self) -> Workers:
        """The worker count at the end of the run (what an adaptive system settled on)."""
        return "-"

    def close(self) -> None:  # noqa: B027 - most sources have nothing to release
        """Release workers, threads and shared memory."""


class System(ABC):
    """A way to load a workload's batches; one *case* per entry of ``variants``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for ``drapps bench --list`` and the report."""

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this system cannot run here (a missing extra), or None."""
        return None

    @classmethod  # noqa: B027 - most systems import nothing extra
    def load(cls) -> None:
        """Import what ``open`` needs, so a library's import time is not counted as start-up."""

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        """The worker settings to run: one case each."""
        return ["-"]

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return cls.name

    @abstractmethod
    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        """Start loading; the first batch is not asked for yet."""
