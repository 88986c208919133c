"""Mixed precision: bf16 or fp16 autocast over fp32 master weights, fp16 with dynamic loss scaling.

Autocast runs the forward in low precision while the parameters, their gradients and the
optimizer state stay fp32 (the master weights). fp16's narrow range needs the loss scaled up so
small gradients do not underflow; ``torch.amp.GradScaler`` halves the scale on every overflow
and skips that step. When overflows never stop the scale collapses towards zero and every step is
skipped: training silently stops. :class:`MixedPrecision` watches for that and says so, and can
fall back to bf16, whose fp32-sized exponent needs no scaling.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step_scaler(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """``scaler.step`` then ``scaler.update``; whether the optimizer stepped.

    GradScaler skips a step whose gradients overflowed and lowers its scale for it, so a lower
    scale after the update is exactly a skipped step.
    """
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= before


class LossScaleCollapseError(RuntimeError):
    """fp16 loss scaling collapsed: gradients overflow at every scale, so no step is taken."""


def bf16_supported(device_type: str) -> bool:
    """Whether autocast to bf16 runs on this device type."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device_type == "cpu"


class MixedPrecision:
    """Autocast, loss scaling and collapse detection for one training loop.

    Args:
        precision: ``"fp32"`` (autocast off), ``"bf16"`` or ``"fp16"``.
        device_type: ``"cuda"`` or ``"cpu"``.
        fallback_to_bf16: on a collapsed fp16 loss scale, switch to bf16 (where supported) instead
            of raising :class:`LossScaleCollapseError`.
        min_scale: a loss scale below this counts as collapsed...
        max_skipped: ... as do this many skipped (overflowed) steps in a row.
        init_scale: the GradScaler's starting scale.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> amp = MixedPrecision("bf16", device_type="cpu")
        >>> with amp.autocast():
        ...     loss = model(torch.randn(8, 4)).square().mean()
        >>> amp.backward(loss)
        >>> amp.step(opt)
        True
    """

    def __init__(
        self,
        precision: Precision = "bf16",
        device_type: str = "cuda",
        *,
        fallback_to_bf16: bool = True,
        min_scale: float = 1.0,
        max_skipped: int = 20,
        init_scale: float = 2.0**16,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
        if precision == "bf16" and not bf16_supported(device_type):
            raise ValueError(f"bf16 autocast is not supported on this {device_type} device")
        if max_skipped < 1:
            raise ValueError(f"max_skipped must be >= 1, got {max_skipped!r}")
        self.precision: Precision = precision
        self.device_type = device_type
        self.fallback_to_bf16 = fallback_to_bf16
        self.min_scale = min_scale
        self.max_skipped = max_skipped
        self.scaler = torch.amp.GradScaler(
            device_type, init_scale=init_scale, enabled=precision == "fp16"
        )
        self.skipped = 0  # overflowed steps in a row
        self.skipped_total = 0
        self.fell_back = False

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None in fp32."""
        return _DTYPES.get(self.precision)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward pass (and loss) run under this."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled in fp16."""
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the gradients in place (before clipping or measuring them); once per step."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer unless the gradients overflowed; returns whether it stepped.

        Raises:
            LossScaleCollapseError: the scale collapsed and no fallback was allowed or possible.
        """
        if not self.scaler.is_enabled():
            optimizer.step()
            return True
        stepped = step_scaler(self.scaler, optimizer)
        self.record(stepped)
        return stepped

    def record(self, stepped: bool) -> None:
        """Count a step whose scaler was stepped elsewhere (e.g. by AdaptiveAccumulation.step)."""
        if stepped:
            self.skipped = 0
            return
        self.skipped += 1
        self.skipped_total += 1
        scale = self.scaler.get_scale()
        if scale < self.min_scale or self.skipped >= self.max_skipped:
            self._collapsed(scale)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the precision in use (bf16 after a fallback), the loss
        scaler's state (its scale and growth tracker) and the skipped-step counts."""
        return {
            "precision": self.precision,
            "fell_back": self.fell_back,
            "skipped": self.skipped,
            "skipped_total": self.skipped_total,
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: a run that fell back to bf16 stays on bf16, and an
        fp16 run goes on at its saved loss scale rather than the initial one."""
        try:
            precision, fell_back = state["precision"], bool(state["fell_back"])
            skipped, skipped_total = int(state["skipped"]), int(state["skipped_total"])
            scaler = state["scaler"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a MixedPrecision state_dict: {exc!r}") from None
        if precision not in PRECISIONS:
            raise ValueError(f"not a MixedPrecision state_dict: precision {precision!r}")
        made_as = "fp16" if fell_back else precision
        if made_as != self.precision:
            since = ", fallen back to bf16" if fell_back else ""
            raise ValueError(
                f"this state is from {made_as} training{since}; this MixedPrecision was made "
                f"for {self.precision}"
            )
        if fell_back:
            self.precision = "bf16"
            self.scaler = torch.amp.GradScaler(self.device_type, enabled=False)
        elif scaler:
            self.scaler.load_state_dict(scaler)
        self.fell_back, self.skipped, self.skipped_total = fell_back, skipped, skipped_total

    def _collapsed(self, scale: float) -> None:
        message = (
            f"fp16 loss scale collapsed: {self.skipped} overflowed steps in a row, scale now "
            f"{scale:.3g}; the gradients overflow fp16 even unscaled, so no step is being taken"
        )
        if self.fallback_to_bf16 and bf16_supported(self.device_type):
            logger.warning("%s; falling back to bf16 autocast", message)
            self.precision = "bf16"
            self.scaler = torch.amp.GradScaler(self.device_type, enabled=False)
            self.skipped = 0
            self.fell_back = True
            return
        raise LossScaleCollapseError(
            f"{message}. Use bf16, lower the learning rate, or clip gradients."
        )
