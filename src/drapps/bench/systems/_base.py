"""What every benchmarked loading system provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator
from typing import Any, ClassVar

from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload, workload_class

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


class EpochSource(Source):
    """A torch-style loader read epoch after epoch, so a run may be longer than the dataset.

    Args:
        loader: a re-iterable loader; each ``iter()`` is one epoch.
        workers: reports the loader's worker count at the end of the run.
    """

    def __init__(self, loader: Any, workers: Callable[[], Workers]) -> None:
        self.loader: Any = loader
        self._workers = workers
        self._it = self._epochs()

    def _epochs(self) -> Generator[Any, None, None]:
        while True:
            yield from self.loader

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def workers(self) -> Workers:
        return self._workers()

    def close(self) -> None:
        self._it.close()
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()
        # DataLoader has no close(): its persistent workers stop with the last reference.
        self.loader = None


class System(ABC):
    """A way to load a workload's batches; one *case* per entry of ``variants``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for ``drapps bench --list`` and the report."""
    device: str | None = None
    """Where a system with a device stage runs it (``drapps bench --device``); the others
    ignore it."""
    opt_in: ClassVar[bool] = False
    """Runs only when named with ``--systems`` (variants that measure one path's cost)."""
    runs_python_step: ClassVar[bool] = True
    """Whether it runs a workload's pure-Python step per sample (``image-gil``); False refuses
    such a workload (:meth:`refuses`)."""

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this system cannot run here (a missing extra), or None."""
        return None

    @classmethod
    def refuses(cls, workload: str) -> str | None:
        """Why this system cannot run ``workload`` (a peer made for images only, a workload
        whose pure-Python step it has no place for), or None."""
        if not cls.runs_python_step and workload_class(workload).python_step:
            return f"{cls.name} has no place for {workload}'s pure-Python step"
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
