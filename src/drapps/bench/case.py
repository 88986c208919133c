"""One timed run of one case, in a process of its own.

``python -m drapps.bench.case SPEC.json RESULT.json``. A fresh process per run keeps cases
apart: TensorFlow's threads and memory never sit beside a DataLoader's forked workers, peak
memory is each case's own, and nothing one run warms or leaks carries into the next.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from drapps.bench.scenarios import LoadScenario, scenario_class
from drapps.bench.systems import system_class
from drapps.bench.usage import TreeUsage
from drapps.bench.workloads import Workload, workload_class
from drapps.telemetry.energy import EnergyMeter
from drapps.telemetry.monitor import GpuMeter

Step = Callable[[torch.Tensor, torch.Tensor, float], None]


class GpuUse:
    """Samples the GPU's utilisation through NVML every ``interval`` s while running; its
    mean is the GPU's busy share (None without NVML or a GPU)."""

    def __init__(self, interval: float = 0.1) -> None:
        from drapps.telemetry.monitor import GpuMeter

        self._meter, self._interval = GpuMeter(), interval
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-gpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            util = self._meter.read()[0]
            if util is None:
                return
            self.readings.append(util)

    def stop(self) -> float | None:
        """Stop sampling; the mean utilisation, None when nothing was read."""
        self._stop.set()
        self._thread.join(timeout=5)
        return sum(self.readings) / len(self.readings) if self.readings else None


def make_step(name: str, workload: Workload, step_ms: float) -> Step:
    """The training step on each batch: ``factor`` scales its time (consumer-shift).

    ``cpu-model`` runs the workload's batched step (``model_input``) and a small model on the
    host's own cores, competing with the loader for them. ``cuda-model`` trains ResNet-50 with
    mixed precision on the GPU, each step waited for (:mod:`drapps.bench.models`); on a
    machine without CUDA it is the ``cpu-model`` step.
    """
    if name == "none":
        return lambda x, y, factor: None
    if name == "sleep":
        # An accelerator's step: the batched work after the loader (normalisation, the model)
        # runs on the device, so the host only waits.
        return lambda x, y, factor: time.sleep(step_ms * factor / 1000)
    if name == "cpu-model" or (name == "cuda-model" and not torch.cuda.is_available()):
        model = workload.cpu_model()
        return lambda x, y, factor: model(workload.model_input(x), y)
    if name == "cuda-model":
        gpu_step = workload.cuda_model("cuda")
        return lambda x, y, factor: gpu_step(x, y)
    raise ValueError(
        f"consumer must be one of ['none', 'sleep', 'cpu-model', 'cuda-model'], got {name!r}"
    )


def _mismatch(batch: Any, expected: list[tuple[tuple[int, ...], torch.dtype]]) -> str | None:
    got = [(tuple(t.shape), t.dtype) for t in batch] if isinstance(batch, list | tuple) else []
    if got != expected:
        return f"expected {expected}, got {got or type(batch).__name__}"
    return None


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the system on the workload, draw warm-up then timed batches, measure."""
    workload = workload_class(spec["workload"])(spec["params"])
    scenario: LoadScenario = scenario_class(spec["scenario"])()
    system = system_class(spec["system"])()
    system.device = spec.get("device")
    if hasattr(system, "memory"):
        system.memory = spec.get("cache_memory")
    system.load()
    batch_size, warmup, n = spec["batch_size"], spec["warmup_batches"], spec["measure_batches"]
    step = make_step(spec["consumer"], workload, spec["step_ms"])
    expected = workload.expected(batch_size)
    usage = TreeUsage(scenario.helper_pids)
    energy = EnergyMeter(gpu=GpuMeter())
    source = None
    try:
        opened = time.perf_counter()
        source = system.open(
            workload, spec["workers"], batch_size, spec["seed"], scenario.throttle()
        )
        it = iter(source)
        mismatch = None
        samples, waits, ends = 0, [], []
        first_batch_s = 0.0
        for b in range(warmup):
            batch = next(it)
            if b == 0:
                first_batch_s = time.perf_counter() - opened
            mismatch = mismatch or _mismatch(batch, expected)
            samples += len(batch[0])
            step(batch[0], batch[1], 1.0)
        warmup_s = time.perf_counter() - opened - first_batch_s
        usage.open_window()
        energy_before = energy.read(cpu_s=0.0)
        gpu = GpuUse()
        start = time.perf_counter()
        measure_s = spec.get("measure_s") or 0.0
        b = 0
        while b < n or time.perf_counter() - start < measure_s:
            factor = scenario.before_batch(min(b, n - 1), n)
            asked = time.perf_counter()
            batch = next(it)
            waits.append(time.perf_counter() - asked)
            mismatch = mismatch or _mismatch(batch, expected)
            samples += len(batch[0])
            step(batch[0], batch[1], factor)
            ends.append(time.perf_counter() - start)
            b += 1
        n = b  # the batches timed (past measure_batches when measure_s asked for more)
        elapsed = time.perf_counter() - start
        gpu_util = gpu.stop()
        end_to_end = time.perf_counter() - opened
        # Every process of the system's (workers started or retired mid-run included), and
        # the training process alone: its loop, and whatever the system runs in it.
        cpu_s, loop_cpu_s = usage.close_window()
        energy_after = energy.read(cpu_s)
        final_workers = source.workers()
    finally:
        if source is not None:
            source.close()
        scenario.stop()
        usage.stop()
    joules = energy.between(energy_before, energy_after)
    ordered = sorted(waits)
    # When the scenario's change ran (the hog's start and stop), in the timed window's seconds.
    spans = [[s - start, (elapsed + start if e is None else e) - start] for s, e in scenario.spans]
    return {
        "batch_size": batch_size,
        "samples": samples,
        "expected_samples": (warmup + n) * batch_size,
        "shape_mismatch": mismatch,
        "samples_per_s": n * batch_size / elapsed,
        "wait_fraction": sum(waits) / elapsed,
        "wait_p50_ms": 1000 * ordered[len(ordered) // 2],
        "wait_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "cpu_util": cpu_s / (elapsed * spec["cores"]),
        # CPU per timed batch: every process of the system, and the training process alone
        # (its loop and step, plus all of tf.data's or DALI's threads, which run in it).
        "cpu_ms_per_batch": 1000 * cpu_s / n,
        "loop_cpu_ms_per_batch": 1000 * loop_cpu_s / n,
        "peak_rss_mib": usage.peak / 2**20,
        # joules over the timed batches: RAPL / NVML counters where readable (machine-wide),
        # else CPU time x watts per core, the source saying which
        "energy_j": joules.total_j,
        "mj_per_sample": 1000 * joules.total_j / (n * batch_size),
        "energy_source": energy.source,
        # NVML's busy share of the GPU over the timed batches (None without a GPU or NVML)
        "gpu_util": gpu_util,
        "gpu_idle": None if gpu_util is None else 1.0 - gpu_util,
        "first_batch_s": first_batch_s,
        # the warm-up after the first batch (with --cache: the rest of the first epoch)
        "warmup_samples_per_s": (warmup - 1) * batch_size / warmup_s if warmup > 1 else 0.0,
        "end_to_end_s": end_to_end,
        "final_workers": final_workers,
        "timeline": [[round(t, 4), round(w, 5)] for t, w in zip(ends, waits, strict=True)],
        "load_spans": [[round(s, 4), round(e, 4)] for s, e in spans],
    }


def measure_limit(spec: dict[str, Any]) -> dict[str, Any]:
    """The workload's per-sample pipeline timed in this process, on one core, no loader:
    ``dataset[i]`` (read, decode, augment) over ``spec["samples"]`` indices after a short
    warm-up. Times ``spec["cores"]``, it is the most samples/s any loader could make here."""
    import importlib.util
    import random

    torch.set_num_threads(1)
    if importlib.util.find_spec("cv2") is not None:  # one core: no OpenCV threads either
        import cv2

        cv2.setNumThreads(1)
    workload = workload_class(spec["workload"])(spec["params"])
    dataset = workload.dataset(None)
    order = list(range(len(dataset)))
    random.Random(spec["seed"]).shuffle(order)
    order = (order * (1 + spec["samples"] // len(order)))[: spec["samples"]]
    for index in order[:20]:
        dataset[index]
    start = time.perf_counter()  # wall time: file reads wait as they do in a loader
    for index in order:
        dataset[index]
    per_core = len(order) / (time.perf_counter() - start)
    return {"per_core_samples_per_s": per_core, "samples_per_s": per_core * spec["cores"]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m drapps.bench.case SPEC.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as file:
        spec = json.load(file)
    result = measure_limit(spec) if spec.get("mode") == "limit" else run_case(spec)
    with open(argv[1], "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
