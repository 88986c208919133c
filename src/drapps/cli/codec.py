"""``drapps codec train`` and ``drapps codec compare``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from drapps.cli._args import Commands, UsageError


def _images(folder: str, count: int, seed: int) -> list[np.ndarray]:
    """Up to ``count`` decoded images of an ImageFolder tree, drawn evenly."""
    from drapps.datasets import ImageFolder

    try:
        dataset = ImageFolder(folder)
    except (OSError, ValueError) as exc:  # a missing folder, or one without images
        raise UsageError(str(exc)) from None
    if count < 1:
        raise UsageError(f"--images must be >= 1, got {count}")
    order = np.random.default_rng(seed).permutation(len(dataset))[:count]
    return [dataset[int(i)][0] for i in order]


def train_command(args: argparse.Namespace) -> int:
    from drapps.cache.learned import train_codec

    images = _images(args.data, args.images, args.seed)
    try:
        codec, losses = train_codec(
            images,
            latent=args.latent,
            lmbda=args.lmbda,
            steps=args.steps,
            seed=args.seed,
            bits=args.bits,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    codec.save(args.out)
    print(
        f"saved the learned codec to {args.out}; loss every 100 steps: "
        + ", ".join(f"{v:.4f}" for v in losses)
    )
    return 0


def compare_command(args: argparse.Namespace) -> int:
    from drapps.cache import CODECS
    from drapps.cache.compare import compare_codecs, markdown, rate_distortion
    from drapps.cache.learned import LearnedCodec

    images = _images(args.data, args.images, args.seed)
    try:
        codecs: list[Any] = [CODECS.get(name) for name in args.codecs.split(",") if name]
        learned = [LearnedCodec.load(path) for path in args.learned]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        rows = compare_codecs(codecs, images)
        learned_rows = []
        for path, codec in zip(args.learned, learned, strict=True):
            row = compare_codecs([codec], images)[0]
            learned_rows.append({**row, "codec": f"learned ({Path(path).name})"})
    except ValueError as exc:  # a codec that declines these images
        raise UsageError(str(exc)) from None
    curve = rate_distortion(images)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "images": len(images),
        "shape": list(images[0].shape),
        "codecs": rows + learned_rows,
        "jpeg_curve": curve,
    }
    (out / "codecs.json").write_text(json.dumps(result, indent=1))
    table = markdown(rows + learned_rows)
    curve_table = markdown([{**r, "codec": f"jpeg q{r['quality']}"} for r in curve])
    (out / "codecs.md").write_text(f"{table}\nJPEG rate-distortion:\n\n{curve_table}")
    print(table)
    print("JPEG rate-distortion:\n")
    print(curve_table)
    if args.plot:
        _plot(curve, learned_rows, out / "rate_distortion.png")
    return 0


def _plot(curve: list[dict[str, Any]], learned: list[dict[str, Any]], path: Path) -> None:
    from drapps._optional import require

    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, metric in zip(axes, ("psnr", "ssim"), strict=True):
        ax.plot([r["bpp"] for r in curve], [r[metric] for r in curve], "o-", label="JPEG")
        for row in learned:
            ax.plot(row["bpp"], row[metric], "s", label=row["codec"])
        ax.set_xlabel("bits per pixel")
        ax.set_ylabel(metric.upper())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_commands(commands: Commands) -> None:
    """Add ``codec`` with its ``train`` and ``compare`` commands."""
    codec = commands.add_parser(
        "codec", help="train the learned cache codec; compare codecs on your images"
    )
    sub = codec.add_subparsers(dest="codec_command", required=True, parser_class=type(codec))
    train = sub.add_parser(
        "train",
        help="train the learned (autoencoder) codec on a sample of an image folder",
        description="Trains a small convolutional autoencoder on random 64x64 crops of "
        "--images decoded images, with loss ||x - g(f(x))||^2 + lmbda * mean|f(x)|, and saves "
        "it; use it with Cache(codecs=(..., LearnedCodec.load(path)), min_psnr=...).",
    )
    train.add_argument("--data", required=True, help="an ImageFolder tree of JPEGs")
    train.add_argument("--out", required=True, help="file to save the codec to")
    train.add_argument("--images", type=int, default=64, help="images to train on (64)")
    train.add_argument("--steps", type=int, default=2000, help="optimizer steps (2000)")
    train.add_argument("--latent", type=int, default=8, help="latent channels (8)")
    train.add_argument("--lmbda", type=float, default=0.01, help="size weight (0.01)")
    train.add_argument("--bits", type=int, default=8, choices=(8, 16), help="latent bits (8)")
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(run=train_command)
    compare = sub.add_parser(
        "compare",
        help="ratio, speed, PSNR and SSIM per codec, and JPEG's rate-distortion curve",
        description="Measures each codec on decoded images of an image folder (medians of "
        "encode and decode time per image, one thread) and JPEG at qualities 10-95; writes "
        "codecs.json and codecs.md (and rate_distortion.png with --plot).",
    )
    compare.add_argument("--data", required=True, help="an ImageFolder tree of JPEGs")
    compare.add_argument("--images", type=int, default=32, help="images to measure on (32)")
    compare.add_argument(
        "--codecs", default="none,lz4,zstd,zstd-9,jpeg,jpeg-75", help="registered codecs"
    )
    compare.add_argument("--learned", nargs="*", default=[], help="learned codec files")
    compare.add_argument("--out", default="codec-results", help="output folder")
    compare.add_argument("--plot", action="store_true", help="also draw rate_distortion.png")
    compare.add_argument("--seed", type=int, default=0)
    compare.set_defaults(run=compare_command)
