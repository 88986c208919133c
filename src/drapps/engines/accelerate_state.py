"""Where an epoch ends, as Hugging Face Accelerate reads it.

Accelerate learns that a training loop reached an epoch's last batch from its own DataLoader
wrapper, which a drapps loader is not (``accelerator.prepare`` returns it as it is). Under
``accelerator.accumulate()`` the optimizer then steps at each epoch's last batch, whatever is
left of ``gradient_accumulation_steps``. While an ``Accelerator`` runs in the process, each
epoch of a drapps loader stands in Accelerate's gradient state as that wrapper does, through
Accelerate's own ``DataLoaderStateMixin``, and says when it hands over its last batch.

Its ``remainder`` (the real samples in the last batch gathered across ranks, which
``gather_for_metrics`` keeps) stays unknown (-1): drapps' rank shards are laid out as
``DistributedSampler``'s, whose repeated samples are not the last ones gathered, where
Accelerate's own shards' are. Nothing is imported, and nothing happens, where no
``Accelerator`` was made.
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def epoch_state() -> Any | None:
    """A new epoch's place in Accelerate's gradient state, not yet begun; None where no
    ``Accelerator`` runs in this process (or Accelerate lacks what this needs)."""
    state = sys.modules.get("accelerate.state")
    gradient_state = getattr(state, "GradientState", None)
    if not getattr(gradient_state, "_shared_state", None):  # no Accelerator was made
        return None
    cls = _epoch_state_class()
    return None if cls is None else cls()


@functools.cache
def _epoch_state_class() -> type | None:
    try:
        from accelerate.data_loader import DataLoaderStateMixin
        from accelerate.state import GradientState
    except ImportError:
        return None

    class EpochState(DataLoaderStateMixin):
        """One epoch of a drapps loader in Accelerate's gradient state: ``begin()`` as it
        starts, ``end_of_dataloader`` set as it hands over its last batch, ``end()`` at its
        end. Accelerate holds it by a weak reference: an epoch the loop let go of before its
        end leaves with it."""

        def __init__(self) -> None:
            self.gradient_state = GradientState()

        def begin(self) -> None:
            super().begin()
            self.remainder = -1  # unknown, whatever the mixin made of this object's attributes

    return EpochState
