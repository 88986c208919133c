"""What decoding only what the crop needs saves: ``python -m drapps.bench.decode_crop [OUT]``.

Times :class:`~drapps.ops.DecodeRandomResizedCrop` against its full path (``reduce=False``: full
decode, then crop and resize) on JPEG folders of three photo sizes, one core, in-process; the
two paths alternate in 5 interleaved repeats and the medians are reported. Both draw the same
box per sample, so the PSNR of the fused output against the full path's measures only the
resampling difference. Writes ``results.json`` and ``results.md`` to OUT
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
from drapps.ops.decode_crop import DecodeRandomResizedCrop, psnr

SIZES = ((500, 400), (1000, 750), (1600, 1200))
"""Photo sizes (width, height): the image workload's, and two larger ones."""
IMAGES, REPEATS, OUTPUT = 96, 5, 224


def _time(op: DecodeRandomResizedCrop, datas: list[bytes]) -> float:
    """CPU ms per sample of ``op`` over ``datas`` (seeded per index)."""
    start = time.process_time()
    for i, data in enumerate(datas):
        op.apply(data, np.random.default_rng(i))
    return (time.process_time() - start) / len(datas) * 1000


def measure(width: int, height: int, data_dir: Path) -> dict[str, Any]:
    folder = make_jpeg_folder(data_dir, IMAGES, size=(width, height))
    datas = [path.read_bytes() for path in sorted(folder.glob("*/*.jpg"))]
    fused, full = DecodeRandomResizedCrop(OUTPUT), DecodeRandomResizedCrop(OUTPUT, reduce=False)
    reductions, scores = [], []
    for i, data in enumerate(datas):
        a = fused.apply(data, np.random.default_rng(i))
        reductions.append(fused.last_reduction)
        scores.append(psnr(a, full.apply(data, np.random.default_rng(i))))
    times: dict[str, list[float]] = {"fused": [], "full": []}
    for _ in range(REPEATS):
        times["fused"].append(_time(fused, datas))
        times["full"].append(_time(full, datas))
    reduced = [s for s, d in zip(scores, reductions, strict=True) if d > 1]
    fused_ms, full_ms = statistics.median(times["fused"]), statistics.median(times["full"])
    return {
        "photo": f"{width}x{height}",
        "full_ms": full_ms,
        "fused_ms": fused_ms,
        "speedup": full_ms / fused_ms,
        "reduced_share": len(reduced) / len(datas),
        "reductions": {str(d): reductions.count(d) for d in (1, 2, 4, 8)},
        "psnr_reduced_median_db": statistics.median(reduced) if reduced else None,
        "psnr_reduced_min_db": min(reduced) if reduced else None,
    }


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        f"Random-resized crop to {OUTPUT}, {IMAGES} quality-90 JPEGs per size, one core, "
        f"in-process; CPU ms per sample, median of {REPEATS} interleaved repeats. "
        f"Machine: {env['cpu']}; commit {env['commit']}.",
        "",
        "| photo | full path ms | fused ms | speed-up | samples decoded reduced (1/2, 1/4, 1/8) "
        "| PSNR of reduced vs full, median (min) dB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        counts = r["reductions"]
        psnr_cell = (
            "-"
            if r["psnr_reduced_median_db"] is None
            else f"{r['psnr_reduced_median_db']:.1f} ({r['psnr_reduced_min_db']:.1f})"
        )
        lines.append(
            f"| {r['photo']} | {r['full_ms']:.2f} | {r['fused_ms']:.2f} | {r['speedup']:.2f}x "
            f"| {r['reduced_share']:.0%} ({counts['2']}, {counts['4']}, {counts['8']}) "
            f"| {psnr_cell} |"
        )
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
