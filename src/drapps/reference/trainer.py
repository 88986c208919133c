"""The reference trainer: wires the toolkit's pieces (``drapps.train``) around a recipe.

It is what ``drapps train`` runs, and a worked example of composing the pieces in a plain loop:
every piece is optional and off by default, so the default run is the plain baseline each
optimisation is measured against (fp32, AdamW at a constant 1e-4, no accumulation, no
checkpointing).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

from drapps.reference.config import TrainConfig, TrainReport
from drapps.reference.recipes import RECIPES, Recipe, get_recipe
from drapps.reference.steps import (
    Contention,
    Evaluator,
    History,
    Setup,
    StepRunner,
    build_report,
    peak_memory,
)
from drapps.train.accumulation import AdaptiveAccumulation
from drapps.train.checkpointing import CheckpointedSequential, checkpoint_blocks, saved_activations
from drapps.train.precision import MixedPrecision
from drapps.train.schedule import WarmupCosine
from drapps.train.sharding import make_optimizer, shard, spawn
from drapps.train.switch import OffSwitch

logger = logging.getLogger(__name__)


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
        loader = _train_loader(config, train_set, micro)
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
                max_grad_norm=config.max_grad_norm,
            )
            setup = Setup(
                recipe=recipe,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                amp=amp,
                accumulation=accumulation,
                switches=self._switches(config, amp, stack, model, first, device),
                stack=stack,
                device=device,
                world=self.world,
            )
            report = self._loop(setup, batches, Evaluator(recipe, eval_loader, config.eval_batches))
        finally:
            if isinstance(loader, Loader):
                loader.close()
            eval_loader.close()
        return report

    def _loop(self, setup: Setup, batches: Iterator[Any], evaluate: Evaluator) -> TrainReport:
        config, recipe = self.config, self.recipe
        runner, history = StepRunner(setup), History()
        setup.model.train()
        groups = setup.accumulation.groups(batches)
        self._print(
            f"training {recipe.name} ({self.model_name}) on {setup.device}, "
            f"micro-batch {config.micro_batch or recipe.micro_batch}, {self.world} process(es)"
        )

        def reached(quality: float) -> bool:
            return config.target is not None and recipe.reached(quality, config.target)

        contention = Contention(config.contention)
        try:
            self._steps(setup, runner, history, groups, evaluate, contention, reached)
        finally:
            contention.close()
        return build_report(config, self.model_name, setup, history)

    def _steps(
        self,
        setup: Setup,
        runner: StepRunner,
        history: History,
        groups: Iterator[list[Any]],
        evaluate: Evaluator,
        contention: Contention,
        reached: Callable[[float], bool],
    ) -> None:
        config, recipe = self.config, self.recipe
        for step in range(1, config.max_steps + 1):
            contention.at(step)
            # The first step also counts what autograd keeps for backward.
            history.add(runner.run(next(groups), count_activations=step == 1), self.world)
            if step % config.log_every == 0 or step == 1:
                peak, _ = peak_memory(setup.device)
                line = history.progress_line(step, config.log_every, setup, peak, recipe.items_unit)
                self._print(line)
            if step % config.eval_every == 0 or step == config.max_steps:
                quality = evaluate(setup.model, setup.device, setup.amp)
                history.evaluated(step, quality, reached)
                self._print(f"  eval step {step}: {recipe.quality} {quality:.3f}")

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


def _train_loader(config: TrainConfig, dataset: Any, micro: int) -> Any:
    """The training loader the config asks for: drapps.Loader, or DataLoader with the same
    order seed and ``workers`` ("auto": one per usable core, the usual hand setting)."""
    from drapps.loader import Loader

    if config.loader == "drapps":
        return Loader(
            dataset,
            batch_size=micro,
            shuffle=True,
            seed=config.seed,
            drop_last=True,
            workers=config.workers,
            persistent_workers=config.workers != 0,
        )
    workers = len(os.sched_getaffinity(0)) if config.workers == "auto" else int(config.workers)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=micro,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(config.seed),
    )


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
