"""What decoding only what the crop needs saves: ``python -m drapps.bench.decode_crop [OUT]``.

Times :class:`~drapps.ops.DecodeRandomResizedCrop` three ways on JPEG folders of three photo
sizes, one core, in-process: the full path (``reduce=False, region=False``: whole photo at full
size, then crop and resize), the reduced-DCT path (``region=False``: whole photo at the smallest
DCT scale the crop allows) and the region path (the default: only the box's rows and columns, at
that scale). The three alternate in 5 interleaved repeats and the medians are reported. All draw
the same box per sample, so the PSNR against the full path measures only the resampling
difference; the region path's pixels are checked against the reduced path's (max abs
difference, 0 when they agree bit for bit). Writes ``results.json`` and ``results.md`` to OUT
(default ``bench-results/decode-crop``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from drapps.bench.data import default_data_dir, make_jpeg_folder
from drapps.bench.environment import describe_environment
from drapps.cache import psnr
from drapps.ops.decode_crop import REGION_DECODER, DecodeRandomResizedCrop

SIZES = ((500, 400), (1000, 750), (1600, 1200))
"""Photo sizes (width, height): the image workload's, and two larger ones."""
IMAGES, REPEATS, OUTPUT = 96, 5, 224


PATHS = {"full": (False, False), "reduced": (True, False), "region": (True, True)}
"""The three ways of making the same crop, as DecodeRandomResizedCrop's (reduce, region)."""


def _time(op: DecodeRandomResizedCrop, datas: list[bytes]) -> float:
    """CPU ms per sample of ``op`` over ``datas`` (seeded per index)."""
    start = time.process_time()
    for i, data in enumerate(datas):
        op.apply(data, np.random.default_rng(i))
    return (time.process_time() - start) / len(datas) * 1000


def measure(width: int, height: int, data_dir: Path) -> dict[str, Any]:
    folder = make_jpeg_folder(data_dir, IMAGES, size=(width, height))
    datas = [path.read_bytes() for path in sorted(folder.glob("*/*.jpg"))]
    ops = {
        name: DecodeRandomResizedCrop(OUTPUT, reduce=reduce, region=region)
        for name, (reduce, region) in PATHS.items()
    }
    reductions, scores, max_diff, taken = [], [], 0, set()
    for i, data in enumerate(datas):
        out = {name: op.apply(data, np.random.default_rng(i)) for name, op in ops.items()}
        reductions.append(ops["reduced"].last_reduction)
        taken.add(ops["region"].last_path)
        scores.append(psnr(out["reduced"], out["full"]))
        diff = np.abs(out["region"].astype(np.int16) - out["reduced"].astype(np.int16))
        max_diff = max(max_diff, int(diff.max()))
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(REPEATS):
        for name, op in ops.items():
            times[name].append(_time(op, datas))
    ms = {name: statistics.median(values) for name, values in times.items()}
    reduced = [s for s, d in zip(scores, reductions, strict=True) if d > 1]
    return {
        "photo": f"{width}x{height}",
        "ms": ms,
        "samples_per_s": {name: 1000 / value for name, value in ms.items()},
        "speedup": {name: ms["full"] / value for name, value in ms.items()},
        "region_path": sorted(taken),
        "region_vs_reduced_max_abs_diff": max_diff,
        "reduced_share": len(reduced) / len(datas),
        "reductions": {str(d): reductions.count(d) for d in (1, 2, 4, 8)},
        "psnr_reduced_median_db": statistics.median(reduced) if reduced else None,
        "psnr_reduced_min_db": min(reduced) if reduced else None,
    }


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        f"Random-resized crop to {OUTPUT}, {IMAGES} quality-90 JPEGs per size, one core, "
        f"in-process; CPU ms per sample (samples/s on one core), median of {REPEATS} interleaved "
        f"repeats. Region decoder: {REGION_DECODER or 'not built'}. "
        f"Machine: {env['cpu']}; commit {env['commit']}.",
        "",
        "| photo | full ms (/s) | reduced-DCT ms (/s) | region ms (/s) | region speed-up "
        "| decoded reduced (1/2, 1/4, 1/8) | PSNR reduced vs full, median (min) dB "
        "| region vs reduced, max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        counts, ms, rate = r["reductions"], r["ms"], r["samples_per_s"]
        psnr_cell = (
            "- (none reduced)"
            if r["psnr_reduced_median_db"] is None
            else f"{r['psnr_reduced_median_db']:.1f} ({r['psnr_reduced_min_db']:.1f})"
        )
        cells = [f"{ms[name]:.2f} ({rate[name]:.0f})" for name in PATHS]
        lines.append(
            f"| {r['photo']} | {' | '.join(cells)} | {r['speedup']['region']:.2f}x "
            f"| {r['reduced_share']:.0%} ({counts['2']}, {counts['4']}, {counts['8']}) "
            f"| {psnr_cell} | {r['region_vs_reduced_max_abs_diff']} |"
        )
    lines += [
        "",
        "PSNR is of the reduced path's output against the full path's, over the samples decoded "
        "at a reduced scale (the others are equal). The region path took: "
        + ", ".join(sorted({p for r in rows for p in r["region_path"]}))
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "bench-results/decode-crop")
    out.mkdir(parents=True, exist_ok=True)
    rows = [measure(w, h, default_data_dir()) for w, h in SIZES]
    env = describe_environment()
    (out / "results.json").write_text(json.dumps({"rows": rows, "environment": env}, indent=1))
    (out / "results.md").write_text(markdown(rows, env))
    print(markdown(rows, env))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
