"""Training-efficiency toolkit: small pieces a plain PyTorch loop adds.

Each piece works alone:

- :class:`GradientNoiseScale` estimates the critical batch size B_noise;
  :class:`AdaptiveAccumulation` picks the accumulation factor ``k`` from it.
- :class:`WarmupCosine` is a ``torch.optim.lr_scheduler.LRScheduler`` that also rescales the
  learning rate when the batch size changes.
- :class:`MixedPrecision` runs bf16/fp16 autocast, fp16 loss scaling, and catches a collapsing
  loss scale.
- :func:`checkpoint_blocks` checkpoints a block stack at ~sqrt(L) segments or under a budget.
- :func:`shard` gives ZeRO-2 (FSDP2), ZeRO-1 or DDP; :func:`spawn` starts local ranks.
- :class:`OffSwitch` times an optimisation on and off and keeps it only if it pays.

The reference trainer that combines them (``drapps train``) lives beside this package, in
:mod:`drapps.reference`.
"""

from drapps.train.accumulation import AdaptiveAccumulation
from drapps.train.checkpointing import (
    ActivationReport,
    CheckpointedSequential,
    activation_report,
    checkpoint_blocks,
    saved_activations,
)
from drapps.train.noise_scale import GradientNoiseScale
from drapps.train.overhead import OverheadGuard
from drapps.train.precision import LossScaleCollapseError, MixedPrecision
from drapps.train.schedule import WarmupCosine, scale_lr
from drapps.train.sharding import full_state_dict, make_optimizer, shard, spawn
from drapps.train.switch import OffSwitch

__all__ = [
    "ActivationReport",
    "AdaptiveAccumulation",
    "CheckpointedSequential",
    "GradientNoiseScale",
    "LossScaleCollapseError",
    "MixedPrecision",
    "OffSwitch",
    "OverheadGuard",
    "WarmupCosine",
    "activation_report",
    "checkpoint_blocks",
    "full_state_dict",
    "make_optimizer",
    "saved_activations",
    "scale_lr",
    "shard",
    "spawn",
]
