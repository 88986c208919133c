"""The op contract: what an op takes and gives, and whether it can run on a batch.

Each op declares, before anything runs, the :class:`Spec` it gives for the spec it takes
(:meth:`Op.declare`, after ffcv's ``declare_state_and_memory``), so a pipeline of ops is checked
when it is built and knows where it may be cut: a *sample op* runs in a worker on one sample; a
*batchable op* can also run after the reorder buffer on a collated batch (with the batch's leading
dimension), on whatever device the batch is on, as DALI's mixed and GPU ops do. Random parameters
are always drawn on the CPU, per sample, from the generator the pipeline gives the op, so an op
draws the same values wherever it runs.

Any callable is accepted as an op: it is wrapped as an opaque sample op (:class:`Opaque`) that
takes and gives anything and never runs on a batch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

KINDS = ("any", "bytes", "array", "tensor")


@dataclass(frozen=True)
class Spec:
    """What flows between two ops, per sample.

    Example:
        >>> Spec("array", "uint8", "HWC")
        Spec(kind='array', dtype='uint8', layout='HWC', device='cpu', uniform=False)
    """

    kind: str = "any"
    """"bytes" (encoded), "array" (NumPy), "tensor" (torch) or "any" (unknown)."""
    dtype: str | None = None
    """Element type ("uint8", "float32"); None: any."""
    layout: str | None = None
    """Axis names, e.g. "HWC" or "CHW"; None: any."""
    device: str = "cpu"
    """Where the data lives ("cpu", "cuda")."""
    uniform: bool = False
    """Every sample has the same shape, so collation can stack them (a decoded photo's size
    varies; a crop to 224 x 224 does not). A split where samples are not uniform hands the
    batch stage a list of per-sample tensors."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Spec.kind must be one of {list(KINDS)}, got {self.kind!r}")

    @property
    def known(self) -> bool:
        return self.kind != "any"

    def __str__(self) -> str:
        parts = [self.kind, self.dtype, self.layout, "uniform" if self.uniform else None]
        return " ".join(p for p in parts if p) + (
            "" if self.device == "cpu" else f" on {self.device}"
        )


ANY = Spec()
"""A value nothing is known about (what an opaque op takes and gives)."""


class Op:
    """A transform step that knows where it may run.

    Subclasses implement ``__call__`` (one sample) and :meth:`declare`; a batchable op sets
    :attr:`batchable` and implements :meth:`apply_batch`. An op that draws random parameters
    sets :attr:`random` and draws them from :func:`drapps.sample_rng` in ``__call__`` and from
    the ``rngs`` it is given in :meth:`apply_batch`.
    """

    batchable: ClassVar[bool] = False
    """Can run on a collated batch (the sample layout with a leading batch axis)."""
    random: ClassVar[bool] = False
    """Draws random parameters (a sample cache may keep only what comes before it)."""

    def declare(self, takes: Spec) -> Spec:
        """The spec this op gives for ``takes``.

        Raises:
            ValueError: this op cannot take ``takes`` (naming both).
        """
        return ANY

    def __call__(self, sample: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def apply_batch(self, batch: Any, rngs: Sequence[np.random.Generator] | None) -> Any:
        """Apply to a collated batch. ``rngs`` holds one generator per sample when the op is
        :attr:`random` (None otherwise)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run on a batch")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Opaque(Op):
    """A user callable: a sample op that takes and gives anything."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        if not callable(fn):
            raise ValueError(f"an op must be callable, got {fn!r}")
        self.fn = fn

    def __call__(self, sample: Any) -> Any:
        return self.fn(sample)

    def __repr__(self) -> str:
        return f"Opaque({self.fn!r})"


class _StageDevice(threading.local):
    device: Any = None


_stage = _StageDevice()


@contextlib.contextmanager
def running_on(device: Any) -> Iterator[None]:
    """Within this block :func:`stage_device` is ``device`` (the device stage sets it)."""
    previous, _stage.device = _stage.device, device
    try:
        yield
    finally:
        _stage.device = previous


def stage_device() -> Any:
    """The ``torch.device`` the batch stage runs on now (None outside it: the CPU). An op whose
    batched form has a faster path on an accelerator (nvJPEG decoding) reads it, since a list
    of bytes carries no device."""
    return _stage.device


def as_op(op: Any) -> Op:
    """``op`` itself when it is an :class:`Op`, else wrapped as :class:`Opaque`."""
    return op if isinstance(op, Op) else Opaque(op)


def expect_image(op: Op, takes: Spec) -> None:
    """Raise the contract error unless ``takes`` is a CHW tensor or an HWC (or HW) array
    (or unknown): what the image ops take on either side of a split."""
    if takes.kind == "tensor":
        expect(op, takes, kind="tensor", layout="CHW")
    else:
        expect(op, takes, kind="array", layouts=("HWC", "HW"))


def expect(op: Op, takes: Spec, *, kind: str, dtype: str | None = None, layout: str | None = None,
           layouts: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Raise the contract error when ``takes`` is known and not what ``op`` needs."""
    if not takes.known:
        return
    allowed = layouts or ((layout,) if layout else ())
    ok = takes.kind == kind and (dtype is None or takes.dtype in (None, dtype))
    ok = ok and (not allowed or takes.layout in (None, *allowed))
    if not ok:
        wanted = Spec(kind, dtype, "|".join(allowed) or None)
        raise ValueError(f"{op!r} takes {wanted}, got {takes}")
