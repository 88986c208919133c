"""``drapps train``, ``drapps train-data`` and ``drapps train-ablation``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drapps.cli._args import Commands, UsageError, name_list, step_range


def train_command(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from drapps.reference import TrainConfig, train

    try:
        config = TrainConfig(
            recipe=args.recipe,
            data=args.data,
            model=args.model,
            amp=args.amp,
            accumulate=args.accumulate,
            max_k=args.max_k,
            checkpointing=args.checkpointing,
            zero=args.zero,
            nproc=args.nproc,
            schedule=args.schedule,
            warmup=args.warmup,
            scaling=args.scaling,
            lr=args.lr,
            max_grad_norm=args.max_grad_norm,
            micro_batch=args.micro_batch,
            max_steps=args.max_steps,
            target=args.target,
            eval_every=args.eval_every,
            eval_batches=args.eval_batches,
            adaptive=not args.no_adaptive,
            device=args.device,
            workers=int(args.workers) if args.workers.isdigit() else args.workers,
            loader=args.loader,
            contention=args.contention,
            seed=args.seed,
            log_every=args.log_every,
        )
        report = train(config)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    print(report.describe())
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=1))
    return 0


def train_data_command(args: argparse.Namespace) -> int:
    from drapps.reference.standin import write_cifar10_standin, write_wikitext2_standin

    try:
        if args.dataset == "cifar10":
            per_class = (500, 100) if args.small else (5000, 1000)
            folder = write_cifar10_standin(args.out, *per_class)
        else:
            folder = write_wikitext2_standin(args.out, max_bytes=1_000_000 if args.small else None)
    except (FileNotFoundError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {args.dataset} stand-in to {folder}")
    return 0


def train_ablation_command(args: argparse.Namespace) -> int:
    from drapps.reference.ablation import ARMS, markdown, run_ablation

    common = [a for a in args.train_args if a != "--"]
    if not common:
        raise UsageError("give the drapps train options after --")
    try:
        results = run_ablation(
            common, arms=args.arms or tuple(ARMS), repeats=args.repeats, seed=args.seed
        )
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / "results.md").write_text(table)
    print(table)
    return 0


def add_commands(commands: Commands) -> None:
    """Add ``train``, ``train-data`` and ``train-ablation``."""
    train = commands.add_parser(
        "train",
        help="train a recipe with any mix of the training-efficiency toolkit",
        description="Train ResNet on CIFAR-10 or GPT-2 on WikiText-2 from a local copy in the "
        "published format. With no options it is the plain baseline (fp32, AdamW at a constant "
        "1e-4); each option adds one optimisation. Prints progress and a final "
        "report: time to --target, peak memory, throughput, final quality.",
    )
    train.add_argument("--recipe", required=True, help="resnet-cifar10 or gpt2-wikitext2")
    train.add_argument("--data", required=True, help="folder with the recipe's data")
    train.add_argument(
        "--model",
        help="resnet18, resnet50, resnet18-w16, resnet18-w4, gpt2-small, gpt2-mini, gpt2-tiny",
    )
    train.add_argument("--amp", default="fp32", help="fp32 (default), bf16 or fp16")
    train.add_argument("--accumulate", default="1", help="micro-batches per step, or gns")
    train.add_argument("--max-k", type=int, default=16, help="largest k with gns (16)")
    train.add_argument("--checkpointing", default="none", help="none, sqrt or a segment count")
    train.add_argument("--zero", type=int, choices=(0, 1, 2), help="ZeRO stage (0 = DDP)")
    train.add_argument("--nproc", type=int, default=1, help="local processes with --zero (1)")
    train.add_argument("--schedule", default="constant", help="constant or warmup-cosine")
    train.add_argument("--warmup", type=float, default=0.05, help="warmup share (0.05)")
    train.add_argument(
        "--scaling", default="sqrt", help="lr rule when k changes: none, linear, sqrt"
    )
    train.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (1e-4)")
    train.add_argument("--max-grad-norm", type=float, help="clip gradients to this norm")
    train.add_argument("--micro-batch", type=int, help="samples per micro-batch")
    train.add_argument("--max-steps", type=int, default=200, help="optimizer steps (200)")
    train.add_argument("--target", type=float, help="quality for time-to-target")
    train.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    train.add_argument("--eval-batches", type=int, help="evaluation batches (default all)")
    train.add_argument("--no-adaptive", action="store_true", help="never switch pieces off")
    train.add_argument("--device", default="auto", help="auto, cpu or cuda")
    train.add_argument("--workers", default="auto", help="loader workers: auto or a count")
    train.add_argument("--loader", default="drapps", help="drapps (default) or dataloader")
    train.add_argument(
        "--contention", type=step_range, help="steps A:B during which a process hogs a core"
    )
    train.add_argument("--seed", type=int, default=0, help="model init and data order")
    train.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    train.add_argument("--out", help="write the report as JSON here")
    train.set_defaults(run=train_command)
    data = commands.add_parser(
        "train-data",
        help="write stand-in CIFAR-10 / WikiText-2 files made from local sources",
        description="cifar10: 32x32 crops of ten scikit-image photos as CIFAR-10 binary "
        "batches; wikitext2: Debian's python3.11-doc text as wiki.*.raw files. Real data is "
        "never downloaded; use these to try the recipes.",
    )
    data.add_argument("dataset", choices=("cifar10", "wikitext2"))
    data.add_argument("out", help="folder to write")
    data.add_argument("--small", action="store_true", help="a tenth of the size")
    data.set_defaults(run=train_data_command)
    ablation = commands.add_parser(
        "train-ablation",
        help="the toolkit's ablation: baseline, each piece alone, all together",
        description="Run `drapps train` with the options after -- once per arm (baseline, "
        "warmup-cosine, accumulate-gns, amp-bf16, checkpointing, all), each in a fresh "
        "process with the off-switches disabled, repeats interleaved; writes results.json "
        "and results.md (medians, each arm against the baseline).",
    )
    ablation.add_argument("--arms", type=name_list, help="subset of arms (default all)")
    ablation.add_argument("--repeats", type=int, default=1, help="interleaved repeats (1)")
    ablation.add_argument("--seed", type=int, default=0, help="shuffle seed of the run order")
    ablation.add_argument("--out", default="train-ablation", help="output folder")
    ablation.add_argument("train_args", nargs=argparse.REMAINDER, help="-- drapps train options")
    ablation.set_defaults(run=train_ablation_command)
