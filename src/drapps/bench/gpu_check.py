"""The GPU check: on a machine with CUDA, the GPU tests and the GPU bench in parts that each fit
a 10-minute command, written to ``OUT/gpu-<name>/`` (``make gpu-check``, ``docs/device.md``).

``python -m drapps.bench.gpu_check PART OUT`` with PART one of:

- ``env``: the GPU, the driver's view, torch, torchvision (nvJPEG), DALI, NVML: what the rest
  will use, in ``environment.txt``;
- ``tests``: ``pytest tests/gpu`` and the offload share's tests, the log in ``tests.log``;
- ``none``: the image workload loader-bound (no training step), each run timed for at least
  20 s: DataLoader at one and two workers per core, drapps with ``workers="auto"``, drapps's
  offload cases (every sample in the workers, every sample decoded on the GPU, the share
  ``"auto"``, and split, share and workers all ``"auto"``) and DALI's GPU pipeline where it
  is installed; ``bench-none/``;
- ``model``: the same beside the ``cuda-model`` consumer (ResNet-50, mixed precision, batch
  256); ``bench-model/``.

Each part prints its command lines as it goes, so a part cut short still says how far it got.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from drapps._optional import installed

PARTS = ("env", "tests", "none", "model")
SECONDS = 20.0
"""Each bench run's timed window, at least: long enough for cases to separate."""


def gpu_name() -> str:
    """A short name for the GPU ("h100", "h200", "a100"), for the results' folder."""
    name = torch.cuda.get_device_name(0).lower()
    found = re.search(r"\b([a-z]\d{2,4}[a-z]?)\b", name)
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def environment() -> str:
    """What the GPU parts run on, as text."""
    lines = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    props = torch.cuda.get_device_properties(0)
    lines.append(
        f"gpu {props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
    )
    lines.append(f"cpu cores usable {len(os.sched_getaffinity(0))}")
    for module in ("torchvision", "nvidia.dali", "pynvml", "simplejpeg", "cv2"):
        found = installed(module)
        version = ""
        if found:
            try:
                version = getattr(__import__(module, fromlist=["_"]), "__version__", "")
            except Exception as exc:  # a broken install is worth a line, not a stop
                version = f"(import failed: {exc})"
        lines.append(f"{module} {version if found else 'missing'}")
    from drapps.ops.decode_crop import REGION_DECODER

    lines.append(f"region decoder {REGION_DECODER}")
    return "\n".join(lines) + "\n"


def bench_command(consumer: str, out: Path) -> list[str]:
    """The bench run of one part: loader-bound (``none``) or beside ResNet-50."""
    cores = len(os.sched_getaffinity(0))
    systems = ["dataloader", "drapps-heuristic", "drapps-offload"]
    if installed("nvidia.dali"):
        systems.append("dali-gpu")
    command = [
        sys.executable, "-m", "drapps.cli", "bench", "--workload", "image", "--scenario", "steady",
        "--systems", ",".join(systems), "--workers", f"{cores},{2 * cores}",
        "--consumer", consumer, "--device", "cuda", "--repeats", "2", "--batches", "40",
        "--seconds", str(SECONDS), "--size", "default", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    if consumer == "cuda-model":
        command += ["--batch-size", "256"]
    return command


def run(part: str, out_root: Path) -> int:
    """Run one part; its files go to ``out_root/gpu-<name>/``. Returns the exit status."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {list(PARTS)}, got {part!r}")
    if not torch.cuda.is_available():
        print("the GPU check needs CUDA, and this machine has none", file=sys.stderr)
        return 2
    out = out_root / f"gpu-{gpu_name()}"
    out.mkdir(parents=True, exist_ok=True)
    if part == "env":
        text = environment()
        (out / "environment.txt").write_text(text)
        print(text, end="")
        return 0
    if part == "tests":
        tests = ["tests/gpu", "tests/ops/test_cut.py", "tests/ops/test_device_stage.py"]
        command = [sys.executable, "-m", "pytest", "-q", "-rP", "-p", "no:cacheprovider", *tests]
        log = out / "tests.log"
    else:
        consumer = "none" if part == "none" else "cuda-model"
        command = bench_command(consumer, out / f"bench-{part}")
        log = out / f"bench-{part}.log"
    print("$", " ".join(command), flush=True)
    started = time.monotonic()
    with open(log, "w") as file:
        status = subprocess.call(command, stdout=file, stderr=subprocess.STDOUT)
    print(f"{part}: exit {status} after {time.monotonic() - started:.0f} s; log {log}")
    print(log.read_text()[-4000:])
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m drapps.bench.gpu_check {{{','.join(PARTS)}}} OUT", file=sys.stderr)
        return 2
    try:
        return run(args[0], Path(args[1]))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
