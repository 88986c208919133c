"""Pinning: the function that pins each batch the training process receives (``pin_memory``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from drapps.runtime.errors import warn_user


def pinner(pin_memory: bool, device: str = "") -> Callable[[Any], Any] | None:
    """The function that pins each received batch, or None (with torch's own warning when
    ``pin_memory`` is asked for and no accelerator can use it)."""
    if not pin_memory:
        return None
    accelerator = getattr(torch, "accelerator", None)
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if not available:
        warn_user(
            "'pin_memory' argument is set as true but no accelerator is found, then device "
            "pinned memory won't be used."
        )
        return None
    if device:
        warn_user(
            "pin_memory_device is deprecated, the current accelerator will be used as the "
            f"device, ignore pin_memory_device='{device}'."
        )
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin
