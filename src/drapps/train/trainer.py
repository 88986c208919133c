"""A compact reference trainer that wires the toolkit's pieces around a recipe.

It is what ``drapps train`` runs, and a worked example of composing the pieces in a plain loop:
every piece is optional and off by default, so the default run is the plain baseline each
optimisation is measured against (fp32, AdamW at a constant 1e-4, no accumulation, no
checkpointing).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import torch
import torch.distributed as dist

from drapps.train.accumulation import AdaptiveAccumulation
from drapps.train.checkpointing import CheckpointedSequential, checkpoint_blocks, saved_activations
from drapps.train.precision import PRECISIONS, MixedPrecision
from drapps.train.recipes import RECIPES, Recipe, get_recipe
from drapps.train.schedule import SCALING_RULES, WarmupCosine
from drapps.train.sharding import ZERO_STAGES, make_optimizer, shard, spawn
from drapps.train.switch import OffSwitch

logger = logging.getLogger(__name__)


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
    """``drapps.Loader`` workers."""
    seed: int = 0
    """Seeds the model init and the data order."""
    log_every: int = 10
    """Steps between progress lines."""

    def __post_init__(self) -> None:
        recipe = get_recipe(self.recipe)
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
        if self.zero is not None and self.accumulate == "gns":
            raise ValueError(
                "accumulate='gns' measures one process's gradients; it is not supported with "
                "zero yet (use a fixed --accumulate N)"
            )
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
        lines.append(f"  final k         {self.final_k}{noise}")
        lines += [f"  {decision}" for decision in self.decisions]
        return "\n".join(lines)


def _device(config: TrainConfig) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        index = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", index % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


class _Shard:
    """Every ``world``-th item of a dataset, from ``rank``: one data-parallel rank's share."""

    def __init__(self, dataset: Any, rank: int, world: int) -> None:
        self.dataset, self.rank, self.world = dataset, rank, world

    def __len__(self) -> int:
        return (len(self.dataset) - self.rank + self.world - 1) // self.world

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.rank + index * self.world]


def _blocks(model: torch.nn.Module) -> torch.nn.Sequential:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.Sequential):
        raise TypeError(f"{type(model).__name__} keeps no nn.Sequential of blocks in .blocks")
    return blocks


def _forever(loader: Any) -> Iterator[Any]:
    for epoch in itertools.count():
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA max allocated"
    # ru_maxrss is KiB on Linux: the training process's peak resident set (workers not included).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "CPU peak RSS"


class Trainer:
    """Runs one :class:`TrainConfig` in this process (one rank when distributed)."""

    def __init__(self, config: TrainConfig, out: TextIO | None = None) -> None:
        self.config = config
        self.recipe: Recipe = get_recipe(config.recipe)
        self.model_name = config.model or self.recipe.models[0]
        self.out = out if out is not None else sys.stdout
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1

    def _print(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=self.out, flush=True)

    def run(self) -> TrainReport:
        from drapps.loader import Loader

        config, recipe = self.config, self.recipe
        torch.manual_seed(config.seed)
        device = _device(config)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        micro = config.micro_batch or recipe.micro_batch
        data = Path(config.data)
        train_set = recipe.dataset(data, True, self.model_name)
        eval_set = recipe.dataset(data, False, self.model_name)
        if self.world > 1:
            train_set = _Shard(train_set, self.rank, self.world)
        loader = Loader(
            train_set,
            batch_size=micro,
            shuffle=True,
            seed=config.seed,
            drop_last=True,
            workers=config.workers,
            persistent_workers=config.workers != 0,
        )
        eval_loader = Loader(eval_set, batch_size=micro, seed=config.seed, workers=0)
        try:
            if len(loader) == 0:
                raise ValueError(
                    f"the training split has fewer than {micro} items (one micro-batch)"
                )
            model = recipe.model(self.model_name).to(device)
            stack: CheckpointedSequential | None = None
            if config.checkpointing != "none":
                text = config.checkpointing
                stack = checkpoint_blocks(_blocks(model), int(text) if text.isdigit() else text)
                model.blocks = stack
            blocks = list(_blocks(model)) if config.zero == 2 else None
            if config.zero is not None:
                model = shard(model, config.zero, blocks=blocks)
            optimizer = make_optimizer(
                model, config.zero or 0, torch.optim.AdamW, lr=config.lr, weight_decay=0.01
            )
            amp = MixedPrecision(config.amp, device.type)  # type: ignore[arg-type]
            gns = config.accumulate == "gns"
            k0 = 1 if gns else int(config.accumulate)
            # The first batch tells how many items (samples or tokens) a micro-batch holds.
            batches = _forever(loader)
            first = next(batches)
            items_per_micro = recipe.items(first)
            batches = itertools.chain([first], batches)
            scheduler: WarmupCosine | None = None
            if config.schedule == "warmup-cosine":
                scheduler = WarmupCosine(
                    optimizer,
                    warmup=int(config.warmup * config.max_steps),
                    total=config.max_steps,
                    base_batch_size=k0 * items_per_micro * self.world,
                    scaling=config.scaling,  # type: ignore[arg-type]
                )
            accumulation = AdaptiveAccumulation(
                model,
                items_per_micro,
                min_k=1 if gns else k0,
                max_k=config.max_k if gns else k0,
                follower=scheduler,
                measure=gns,
            )
            switches = self._switches(config, amp, stack, model, first, device)
            report = self._loop(
                model,
                optimizer,
                scheduler,
                amp,
                accumulation,
                switches,
                stack,
                batches,
                eval_loader,
                device,
                items_per_micro,
            )
        finally:
            loader.close()
            eval_loader.close()
        return report

    def _switches(
        self,
        config: TrainConfig,
        amp: MixedPrecision,
        stack: CheckpointedSequential | None,
        model: torch.nn.Module,
        example: Any,
        device: torch.device,
    ) -> dict[str, OffSwitch]:
        if not config.adaptive:
            return {}
        switches = {}
        if amp.precision != "fp32":
            switches["amp"] = OffSwitch(f"amp {amp.precision}")
        if stack is not None:
            plain = self._plain_activation_bytes(model, stack, example, device)
            free = _free_memory(device)

            def needed() -> bool:
                # Checkpointing buys memory: it is needed when the plain activations would take
                # more than half of what is free.
                return plain > free / 2

            switches["checkpointing"] = OffSwitch("checkpointing", needed=needed)
        return switches

    def _plain_activation_bytes(
        self,
        model: torch.nn.Module,
        stack: CheckpointedSequential,
        batch: Any,
        device: torch.device,
    ) -> int:
        stack.enabled = False
        try:
            with saved_activations() as counter:
                loss = self.recipe.loss_sum(model, batch, device)
            del loss
        finally:
            stack.enabled = True
        model.zero_grad(set_to_none=True)
        return counter.bytes

    def _loop(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: WarmupCosine | None,
        amp: MixedPrecision,
        accumulation: AdaptiveAccumulation,
        switches: dict[str, OffSwitch],
        stack: CheckpointedSequential | None,
        batches: Iterator[Any],
        eval_loader: Any,
        device: torch.device,
        items_per_micro: int,
    ) -> TrainReport:
        config, recipe = self.config, self.recipe
        amp_switch, ckpt_switch = switches.get("amp"), switches.get("checkpointing")

        def setting(switch: OffSwitch | None) -> bool:
            # One trial at a time, so that two trials never share their on/off pattern; a piece
            # waiting for its trial stays on.
            if switch is None:
                return True
            if switch.decided is None and switch is not trial():
                return True
            return switch.enabled

        def trial() -> OffSwitch | None:
            return next((s for s in switches.values() if s.decided is None), None)

        train_seconds, total_items, activation_bytes = 0.0, 0, 0
        time_to_target: float | None = None
        evaluations: list[tuple[int, float, float]] = []
        losses: list[float] = []
        times: list[tuple[float, int]] = []  # (seconds, items) per step
        quality: float | None = None
        model.train()
        groups = accumulation.groups(batches)
        self._print(
            f"training {recipe.name} ({self.model_name}) on {device}, "
            f"micro-batch {config.micro_batch or recipe.micro_batch}, {self.world} process(es)"
        )
        for step in range(1, config.max_steps + 1):
            group = next(groups)
            use_amp = setting(amp_switch)
            if stack is not None:
                stack.enabled = setting(ckpt_switch)
            on_trial = trial()
            start = time.perf_counter()
            sums = []
            counts = [recipe.items(batch) for batch in group]
            total = sum(counts)
            for batch, count in zip(group, counts, strict=True):
                with accumulation.micro_batch(count):
                    # The first micro-batch also counts what autograd keeps for backward.
                    probe = saved_activations() if step == 1 else contextlib.nullcontext()
                    with probe as counter, amp.autocast() if use_amp else contextlib.nullcontext():
                        loss_sum = recipe.loss_sum(model, batch, device)
                    if counter is not None:
                        activation_bytes = max(activation_bytes, counter.bytes)
                    amp.backward(loss_sum / total)
                sums.append(float(loss_sum.detach()))
            accumulation.step(optimizer, amp)
            if scheduler is not None:
                scheduler.step()
            if device.type == "cuda" and switches:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            if on_trial is not None:
                if self.world > 1:
                    # Every rank must reach the same verdict: they share the slowest rank's time.
                    slowest = torch.tensor([seconds], device=device)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    seconds = float(slowest)
                on_trial.record(seconds, total)
            train_seconds += seconds
            total_items += total * self.world
            losses.append(sum(sums) / total)
            times.append((seconds, total * self.world))
            if step % config.log_every == 0 or step == 1:
                self._progress(step, losses, times, accumulation, optimizer, device)
            if step % config.eval_every == 0 or step == config.max_steps:
                quality = self._evaluate(model, eval_loader, device, amp)
                model.train()
                evaluations.append((step, train_seconds, quality))
                self._print(f"  eval step {step}: {recipe.quality} {quality:.3f}")
                if (
                    time_to_target is None
                    and config.target is not None
                    and recipe.reached(quality, config.target)
                ):
                    time_to_target = train_seconds
        peak, kind = _peak_memory(device)
        decisions = [s.verdict for s in switches.values()]
        if amp.fell_back:
            decisions.append("amp: fp16 loss scale collapsed; fell back to bf16")
        if not accumulation.measuring and config.accumulate == "gns":
            decisions.append(
                f"accumulation: noise scale measurement switched off at k={accumulation.k}"
            )
        settings = {
            key: value for key, value in asdict(config).items() if key not in ("data", "recipe")
        }
        return TrainReport(
            recipe=recipe.name,
            model=self.model_name,
            settings=settings,
            steps=config.max_steps,
            items=total_items,
            train_seconds=train_seconds,
            throughput=total_items / train_seconds,
            items_unit=recipe.items_unit,
            peak_memory_bytes=peak,
            memory_kind=kind,
            quality_name=recipe.quality,
            final_quality=quality,
            time_to_target=time_to_target,
            final_k=accumulation.k,
            activation_bytes=activation_bytes,
            noise_scale=accumulation.noise_scale,
            decisions=decisions,
            evaluations=evaluations,
        )

    def _progress(
        self,
        step: int,
        losses: list[float],
        times: list[tuple[float, int]],
        accumulation: AdaptiveAccumulation,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> None:
        recent = losses[-self.config.log_every :]
        window = times[-self.config.log_every :]
        seconds = sum(t for t, _ in window)
        items = sum(n for _, n in window)
        peak, _ = _peak_memory(device)
        noise = accumulation.noise_scale
        noise_text = f" B_noise {noise:,.0f}" if noise is not None and math.isfinite(noise) else ""
        self._print(
            f"step {step:5d}  loss {sum(recent) / len(recent):.4f}  "
            f"{len(window) / seconds:.2f} steps/s  "
            f"{items / seconds:,.0f} {self.recipe.items_unit}/s  "
            f"k {accumulation.k}{noise_text}  lr {optimizer.param_groups[0]['lr']:.2e}  "
            f"mem {peak / 2**20:,.0f} MiB"
        )

    def _evaluate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, amp: MixedPrecision
    ) -> float:
        model.eval()
        loss_sum, correct, items = 0.0, 0, 0
        with torch.no_grad(), amp.autocast():
            for i, batch in enumerate(loader):
                if self.config.eval_batches is not None and i >= self.config.eval_batches:
                    break
                batch_loss, batch_correct, batch_items = self.recipe.evaluate_batch(
                    model, batch, device
                )
                loss_sum += batch_loss
                correct += batch_correct
                items += batch_items
        return self.recipe.score(loss_sum, correct, items)


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def _rank_main(rank: int, world: int, config: TrainConfig, report_path: str | None) -> None:
    report = Trainer(config).run()
    if rank == 0 and report_path:
        Path(report_path).write_text(json.dumps(asdict(report)))


def train(config: TrainConfig, out: TextIO | None = None) -> TrainReport:
    """Run ``config``: in this process, or over ``config.nproc`` local processes for ``zero``."""
    if config.zero is None or dist.is_initialized():
        return Trainer(config, out).run()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        spawn(_rank_main, config.nproc, config, path)
        return TrainReport(**json.loads(Path(path).read_text()))


__all__ = ["RECIPES", "TrainConfig", "TrainReport", "Trainer", "train"]
