"""Errors the runtime raises in the training loop, and how a failing sample is named."""

from __future__ import annotations

import os
import pickle
from typing import Any


class SampleError(RuntimeError):
    """A sample failed in ``__getitem__``, the transform, or collation.

    Attributes:
        index: the dataset index that failed (None when a whole batch failed, e.g. in collate).
        stage: ``"__getitem__"``, ``"transform"``, ``"collate_fn"`` or ``"worker"``.
        path: the file behind the sample, when the dataset exposes one.
        indices: the batch's indices, for batch-level failures.
        detail: the original exception's type and message (and traceback text from a worker).
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        stage: str = "__getitem__",
        path: str | None = None,
        indices: list[int] | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.index = index
        self.stage = stage
        self.path = path
        self.indices = indices
        self.detail = detail

    def __reduce__(self) -> Any:
        kwargs = {
            "index": self.index,
            "stage": self.stage,
            "path": self.path,
            "indices": self.indices,
            "detail": self.detail,
        }
        return (_rebuild_sample_error, (self.args[0], kwargs, _picklable(self.__cause__)))


def _rebuild_sample_error(
    message: str, kwargs: dict[str, Any], cause: BaseException | None
) -> SampleError:
    error = SampleError(message, **kwargs)
    error.__cause__ = cause
    return error


def _picklable(exc: BaseException | None) -> BaseException | None:
    """``exc`` when it survives a pickle round trip (so it can be chained across processes)."""
    if exc is None:
        return None
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    return exc


class WorkerTimeoutError(SampleError):
    """A batch was not made in time, or its worker died, on every allowed attempt."""


def sample_path(dataset: Any, index: int) -> str | None:
    """The file behind ``dataset[index]`` for datasets that list their files, else None.

    Recognises the conventions of torchvision's ImageFolder (``samples``/``imgs`` of
    ``(path, target)``) and plain ``paths``/``files`` lists.
    """
    for name in ("samples", "imgs", "paths", "files"):
        entries = getattr(dataset, name, None)
        if entries is None:
            continue
        try:
            entry = entries[index]
        except Exception:
            continue
        if isinstance(entry, tuple | list) and entry:
            entry = entry[0]
        if isinstance(entry, str | os.PathLike):
            return os.fspath(entry)
    return None


def describe_failure(index: int, stage: str, path: str | None, exc: BaseException) -> str:
    where = f"sample {index}" + (f" ({path})" if path else "")
    return f"{where} failed in {stage}: {type(exc).__name__}: {exc}"
