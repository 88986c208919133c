"""What a reference training run is asked to do (TrainConfig) and what it achieved (TrainReport)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from drapps.reference.recipes import get_recipe
from drapps.train.precision import PRECISIONS
from drapps.train.schedule import SCALING_RULES
from drapps.train.sharding import ZERO_STAGES

LOADERS = ("drapps", "dataloader")


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Every optimisation is off unless asked for."""

    recipe: str
    """``resnet-cifar10`` or ``gpt2-wikitext2``."""
    data: str
    """Folder with the recipe's data in its published format."""
    model: str | None = None
    """Model size (the recipe's first by default: resnet18, gpt2-small)."""
    amp: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16`` (dynamic loss scaling)."""
    accumulate: str = "1"
    """Micro-batches per step: an int, or ``gns`` to follow the gradient noise scale."""
    max_k: int = 16
    """Most micro-batches per step with ``accumulate="gns"``."""
    checkpointing: str = "none"
    """``none``, ``sqrt``, or a segment count."""
    zero: int | None = None
    """None for one process; 0 (DDP), 1 or 2 for that ZeRO stage over ``nproc`` processes."""
    nproc: int = 1
    """Local processes for ``zero`` (gloo on CPU, NCCL on CUDA)."""
    schedule: str = "constant"
    """``constant`` or ``warmup-cosine``."""
    warmup: float = 0.05
    """Warmup share of ``max_steps`` for ``warmup-cosine``."""
    scaling: str = "sqrt"
    """How the learning rate follows a changing batch: ``none``, ``linear``, ``sqrt``."""
    lr: float = 1e-4
    """Peak learning rate at the starting batch size (AdamW, weight decay 0.01)."""
    max_grad_norm: float | None = None
    """Clip the accumulated gradient to this norm (after the noise scale is measured)."""
    micro_batch: int | None = None
    """Samples per micro-batch (the recipe's default: 128 images, 32 sequences)."""
    max_steps: int = 200
    """Optimizer steps to run."""
    target: float | None = None
    """Quality at which to record the time to target (accuracy %, or perplexity)."""
    eval_every: int = 50
    """Steps between evaluations (and at the end)."""
    eval_batches: int | None = None
    """Evaluation micro-batches (all by default)."""
    adaptive: bool = True
    """Let amp and checkpointing time themselves and switch off when they do not pay."""
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``."""
    workers: int | Literal["auto"] = "auto"
    """Loader workers ("auto" under ``dataloader``: one per usable core)."""
    loader: str = "drapps"
    """``drapps`` (``drapps.Loader``) or ``dataloader`` (``torch.utils.data.DataLoader``)."""
    contention: tuple[int, int] | None = None
    """Steps ``[start, stop)`` during which another process keeps one core busy."""
    seed: int = 0
    """Seeds the model init and the data order."""
    log_every: int = 10
    """Steps between progress lines."""

    def __post_init__(self) -> None:
        recipe = get_recipe(self.recipe)
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if self.model is not None:
            recipe.check_model(self.model)
        if self.amp not in PRECISIONS:
            raise ValueError(f"amp must be one of {', '.join(PRECISIONS)}, got {self.amp!r}")
        if self.accumulate != "gns" and not (
            self.accumulate.isdigit() and int(self.accumulate) >= 1
        ):
            raise ValueError(f"accumulate must be an int >= 1 or 'gns', got {self.accumulate!r}")
        if self.checkpointing not in ("none", "sqrt") and not self.checkpointing.isdigit():
            raise ValueError(
                "checkpointing must be 'none', 'sqrt' or a segment count, "
                f"got {self.checkpointing!r}"
            )
        if self.zero is not None and self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be one of {ZERO_STAGES}, got {self.zero!r}")
        if self.nproc < 1 or (self.nproc > 1 and self.zero is None):
            raise ValueError(f"nproc > 1 needs --zero 0, 1 or 2; got nproc={self.nproc!r}")
        if self.schedule not in ("constant", "warmup-cosine"):
            raise ValueError(
                f"schedule must be 'constant' or 'warmup-cosine', got {self.schedule!r}"
            )
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup must be a share in [0, 1), got {self.warmup!r}")
        if self.scaling not in SCALING_RULES:
            raise ValueError(
                f"scaling must be one of {', '.join(SCALING_RULES)}, got {self.scaling!r}"
            )
        for name in ("max_steps", "eval_every", "log_every", "max_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {self.micro_batch!r}")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"eval_batches must be >= 1, got {self.eval_batches!r}")
        if self.workers != "auto" and not (isinstance(self.workers, int) and self.workers >= 0):
            raise ValueError(f"workers must be 'auto' or an int >= 0, got {self.workers!r}")
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {list(LOADERS)}, got {self.loader!r}")
        if self.contention is not None and not (
            len(self.contention) == 2 and 1 <= self.contention[0] < self.contention[1]
        ):
            raise ValueError(
                f"contention must be steps (start, stop) with 1 <= start < stop, got "
                f"{self.contention!r}"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available")
        if not Path(self.data).is_dir():
            raise FileNotFoundError(f"data folder {self.data!r} does not exist")


@dataclass
class TrainReport:
    """What a run achieved; ``drapps train`` prints it and can write it as JSON."""

    recipe: str
    model: str
    settings: dict[str, Any]
    steps: int
    items: int
    train_seconds: float
    throughput: float
    """Items (samples or tokens) trained on per second of training (evaluation excluded)."""
    items_unit: str
    peak_memory_bytes: int
    memory_kind: str
    quality_name: str
    final_quality: float | None
    time_to_target: float | None
    """Training seconds until the target quality was first reached; None if never."""
    final_k: int
    activation_bytes: int
    """Bytes autograd kept for backward on one micro-batch at step 1 (device independent)."""
    noise_scale: float | None
    noise_scale_error: float | None = None
    """Standard error of ``noise_scale`` relative to it."""
    decisions: list[str] = field(default_factory=list)
    evaluations: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, training seconds, quality) at each evaluation."""

    def describe(self) -> str:
        target = self.settings.get("target")
        lines = [
            f"recipe {self.recipe} ({self.model}), {self.steps} steps, "
            f"{self.items:,} {self.items_unit} in {self.train_seconds:.1f} s",
            f"  throughput      {self.throughput:,.0f} {self.items_unit}/s",
            f"  peak memory     {self.peak_memory_bytes / 2**20:,.0f} MiB ({self.memory_kind})",
            f"  activations     {self.activation_bytes / 2**20:,.1f} MiB kept for backward "
            "per micro-batch",
        ]
        if self.final_quality is not None:
            lines.append(f"  final {self.quality_name:9s} {self.final_quality:.3f}")
        if target is not None:
            reached = (
                f"{self.time_to_target:.1f} s" if self.time_to_target is not None else "not reached"
            )
            lines.append(f"  time to {self.quality_name} {target}: {reached}")
        noise = f", B_noise ~ {self.noise_scale:,.0f}" if self.noise_scale else ""
        if noise and self.noise_scale_error is not None and self.noise_scale_error < 10:
            noise += f" (+-{self.noise_scale_error:.0%})"
        lines.append(f"  final k         {self.final_k}{noise}")
        lines += [f"  {decision}" for decision in self.decisions]
        return "\n".join(lines)
