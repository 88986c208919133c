"""Errors (and one-time warnings) the runtime gives the training loop, and how a failing sample is
named."""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import pickle
import re
import sys
import traceback
import warnings
from typing import Any, TypeVar


class ArgumentError(TypeError, ValueError):
    """An argument the loader cannot take: of a wrong type, or a wrong value.

    Both a ``ValueError``, as drapps documents for every invalid argument, and a ``TypeError``,
    which ``torch.utils.data.DataLoader`` (and Python) raise for an argument of a wrong type
    (``collate_fn=5``, ``num_workers="2"``): code written for either catches it.
    """


class SampleError(RuntimeError):
    """A sample failed in ``__getitem__``, the transform, or collation.

    As with ``torch.utils.data.DataLoader``, the error raised in the training loop is also an
    instance of the original exception's type: a ``KeyError`` in ``__getitem__`` arrives as a
    ``SampleError`` that ``except KeyError`` catches too (see :func:`sample_error`).

    Attributes:
        index: the dataset index that failed (None when a whole batch failed, e.g. in collate).
        stage: ``"__getitem__"``, ``"transform"``, ``"collate_fn"``, ``"worker"`` or
            ``"device_stage"`` (the ops after a Pipeline's split, on a whole batch).
        path: the file behind the sample, when the dataset exposes one.
        indices: the batch's indices, for batch-level failures.
        detail: the original exception's type and message (and traceback text from a worker).
        original_type: the type of the exception that failed the sample, when there was one.
    """

    original_type: type[BaseException] | None = None

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

    def __str__(self) -> str:
        # KeyError's own __str__ would print the message as a quoted repr.
        return str(self.args[0]) if self.args else ""

    def __copy__(self) -> SampleError:
        """A new error of this class with this one's message, fields and cause (no traceback):
        what :func:`anew` raises. The keys are this error's own (pickling wraps them)."""
        base = WorkerTimeoutError if isinstance(self, WorkerTimeoutError) else SampleError
        kwargs = {name: getattr(self, name) for name in ("index", "stage", "path", "indices")}
        error = sample_error(
            self.args[0], self.original_type, base=base, detail=self.detail, **kwargs
        )
        error.__cause__ = self.__cause__
        fields = {name: value for name, value in vars(self).items() if name not in _NAMING}
        if isinstance(self, OSError):
            fields.update((name, getattr(self, name)) for name in _OS_FIELDS)
        for name, value in fields.items():
            with contextlib.suppress(Exception):
                setattr(error, name, value)
        return error

    def __reduce__(self) -> Any:
        kwargs = {
            "index": _by_value(self.index),
            "stage": self.stage,
            "path": self.path,
            "indices": _by_value(self.indices),
            "detail": self.detail,
        }
        original = self.original_type if _picklable_type(self.original_type) else None
        cause, kind = _picklable(self.__cause__), type(self).__name__
        return (
            _rebuild_sample_error,
            (self.args[0], kwargs, cause, original, kind, _carried(self)),
        )


class _ByValue:
    """A value pickled by value, whatever pickler carries it: a worker's error names keys that
    may be tensors (a sampler's), which torch's reductions would hand the training process as
    shared memory, a descriptor held open for as long as the loop keeps the error."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL),))


def _by_value(keys: Any) -> Any:
    """``keys`` (a key or a list of them) as they go with an error: ints as they are."""
    plain = keys is None or type(keys) is int
    if isinstance(keys, list):
        plain = all(type(key) is int for key in keys)
    return keys if plain else _ByValue(keys)


_NAMING = frozenset(("index", "stage", "path", "indices", "detail", "original_type"))
"""A SampleError's own fields, which name the sample and are never carried over."""


def _carried(error: SampleError) -> dict[str, Any]:
    """The fields ``error`` carries of its original (see :func:`_carry_fields`) that pickle,
    so they cross to the training process with it."""
    fields = {name: value for name, value in vars(error).items() if name not in _NAMING}
    if isinstance(error, OSError):
        fields.update((name, getattr(error, name)) for name in _OS_FIELDS)
    return {name: value for name, value in fields.items() if _pickles(value)}


def _rebuild_sample_error(
    message: str,
    kwargs: dict[str, Any],
    cause: BaseException | None,
    original: type[BaseException] | None = None,
    kind: str = "SampleError",
    fields: dict[str, Any] | None = None,
) -> SampleError:
    base = WorkerTimeoutError if kind == WorkerTimeoutError.__name__ else SampleError
    error = sample_error(message, original, base=base, **kwargs)
    error.__cause__ = cause
    for name, value in (fields or {}).items():
        with contextlib.suppress(Exception):
            setattr(error, name, value)
    return error


_COMBINED: dict[tuple[type[SampleError], type[BaseException]], type[SampleError]] = {}


def sample_error(
    message: str,
    original: type[BaseException] | None,
    *,
    base: type[SampleError] | None = None,
    **kwargs: Any,
) -> SampleError:
    """A :class:`SampleError` that is also an instance of ``original`` (when it can be).

    ``sample_error("...", KeyError)`` is caught by ``except KeyError`` and by
    ``except drapps.SampleError``, as DataLoader re-raises a worker's exception as its own type.
    Types that cannot be combined (a conflicting C layout, a final class) give a plain
    :class:`SampleError` whose ``original_type`` still names them, and so does
    ``StopIteration``, which would otherwise end the training loop's ``for`` silently.
    """
    base = base or SampleError
    cls = _combined(base, original) if original is not None else base
    try:
        error = cls(message, **kwargs)
    except Exception:  # the original type's __new__ wants other arguments
        error = base(message, **kwargs)
    error.original_type = original
    return error


def _combined(base: type[SampleError], original: type[BaseException]) -> type[SampleError]:
    """The class that is both ``base`` and ``original`` (``base`` where they cannot combine).

    Named ``SampleError[KeyError]`` (``SampleError[package/module:Class]`` for a class outside
    the builtins), and found under that name in this module, so the class pickles as a
    class (``torch._utils.ExceptionWrapper`` sends the exception's type) and a process that
    has not made it yet makes it as it unpickles it (:func:`__getattr__`)."""
    if not issubclass(original, Exception) or issubclass(
        original, (base, StopIteration, StopAsyncIteration)
    ):
        return base
    key = (base, original)
    combined = _COMBINED.get(key)
    if combined is None:
        try:
            combined = type(
                f"{base.__name__}[{original.__name__}]",
                (base, original),
                {"__module__": __name__, "__reduce__": base.__reduce__},
            )
        except TypeError:
            combined = base
        else:
            where = "" if original.__module__ == "builtins" else f"{original.__module__}:"
            combined.__qualname__ = f"{base.__name__}[{where}{original.__qualname__}]".replace(
                ".", "/"
            )
        _COMBINED[key] = combined
    return combined


_NAMED = re.compile(r"(SampleError|WorkerTimeoutError)\[(?:([^:\]]+):)?([^:\]]+)\]")


def __getattr__(name: str) -> Any:
    """A combined class by its name (:func:`_combined`), made here if need be: how pickle finds
    it in a process that has not raised one yet."""
    named = _NAMED.fullmatch(name)
    if named is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base = WorkerTimeoutError if named[1] == "WorkerTimeoutError" else SampleError
    found: Any = importlib.import_module((named[2] or "builtins").replace("/", "."))
    for part in named[3].split("/"):
        found = getattr(found, part)
    combined = _combined(base, found)
    if combined is base:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return combined


def failure(exc: BaseException, what: str, **kwargs: Any) -> SampleError:
    """The :func:`sample_error` for user code that raised ``exc``: "``what``: Type: message",
    an instance of ``exc``'s type, with its traceback as the detail (``kwargs``: ``stage``,
    ``index``, ``indices``)."""
    error = sample_error(
        describe_failure(what, exc),
        type(exc),
        detail="".join(traceback.format_exception(exc)),
        **kwargs,
    )
    _carry_fields(exc, error)
    return error


_OS_FIELDS = ("errno", "strerror", "filename", "filename2")


def _carry_fields(exc: BaseException, error: SampleError) -> None:
    """What ``exc`` carries, on ``error`` too (a custom exception's fields, an OSError's
    ``errno`` and ``filename``), as DataLoader's in-process iterator raises ``exc`` itself;
    never over the fields that name the sample. A worker's error brings those that pickle
    to the training process (DataLoader's rebuilds the exception from its message alone)."""
    for name, value in vars(exc).items():
        if name not in vars(error):
            with contextlib.suppress(Exception):
                setattr(error, name, value)
    if isinstance(exc, OSError) and isinstance(error, OSError):
        for name in _OS_FIELDS:
            with contextlib.suppress(Exception):
                setattr(error, name, getattr(exc, name))


def _picklable_type(cls: type[BaseException] | None) -> bool:
    if cls is None:
        return False
    try:
        return pickle.loads(pickle.dumps(cls)) is cls
    except Exception:
        return False


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


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


def describe_failure(what: str, exc: BaseException) -> str:
    """``what`` failed with ``exc``, in the words of :func:`failure`'s message."""
    return f"{what}: {type(exc).__name__}: {exc}"


def fd_limit_error() -> RuntimeError:
    """The error for reaching the open-file limit, a RuntimeError naming ``ulimit -n`` as
    DataLoader's does, so code that catches DataLoader's catches this one."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return RuntimeError(
        f"Too many open files: this process is at its limit of {soft} open file descriptors "
        "(RLIMIT_NOFILE), so drapps cannot start a worker or receive a batch. Increase the "
        "limit with `ulimit -n` in the shell (or resource.setrlimit), or use fewer workers. "
        "DataLoader's other remedy, torch.multiprocessing.set_sharing_strategy('file_system'), "
        "does not apply: drapps receives each batch's memory as one descriptor and closes it "
        "once mapped."
    )


_warned: set[str] = set()


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message)``, naming the user's line: the first frame outside drapps
    (a loader's constructor, the ``for`` over its batches), not the line in drapps that
    noticed."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and _ours(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _ours(frame: Any) -> bool:
    """A frame of drapps' code, or of a dataclass's generated ``__init__`` that drapps called
    (its code comes from a string)."""
    if frame.f_code.co_filename.startswith(_PACKAGE):
        return True
    caller = frame.f_back
    return frame.f_code.co_filename == "<string>" and caller.f_code.co_filename.startswith(_PACKAGE)


def warn_once(key: str, message: str) -> None:
    """:func:`warn_user` the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        warn_user(message)


_E = TypeVar("_E", bound=BaseException)


def anew(error: _E) -> _E:
    """``error`` as a new exception to raise once, with its message, notes and cause.

    Raising one exception object from two places ties them together: each raise adds its
    frames to the object's traceback. The reorder buffer keeps a loader's failure and raises
    a copy at each ``get`` (raised again, the kept one's traceback would grow with each
    ``next()`` and hold the buffer that holds it); an epoch raises a copy of a batch's error,
    which another thread made or passed on (raised itself, it would hold the loop's frames,
    and the loader through them, for as long as that thread still held it). An error that
    cannot be copied is given with its traceback cleared instead.
    """
    try:
        fresh = copy.copy(error)
    except Exception:
        return error.with_traceback(None)
    if type(fresh) is not type(error) or fresh.args != error.args:
        return error.with_traceback(None)
    fresh.__cause__, fresh.__suppress_context__ = error.__cause__, error.__suppress_context__
    return fresh.with_traceback(None)
