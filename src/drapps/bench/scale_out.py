"""The scale-out paths against the local loader: their overhead on one machine, and a what-if.

Three ways to run the image workload's pipeline on the same files and seed, feeding a loop
that does nothing but take batches (loader-bound):

``local``  ``drapps.Loader(workers=W)``: worker processes, batches through shared memory.
``ray``    ``drapps.Loader(backend="ray", workers=W)``: Ray actors on a local Ray, batches
           through Ray's object store.
``redis``  ``drapps serve --workers W`` producers and ``drapps.Loader(source="redis://...")``:
           batches through a loopback Redis.

Each loader is made once and warmed for an epoch; then the repeats are interleaved (local,
ray, redis, local, ...), each timing ``epochs`` epochs, and the medians reported with the
training process's CPU seconds per batch (what a path costs the accelerator's feeder). The
simulator then answers "what if the preprocessing ran on N machines": a
:class:`~drapps.sim.PipelineModel` calibrated on these runs (per-batch worker CPU from the
local run, per-batch cost in the training process from each path, the batch's bytes over one
network link into the training host), run with one worker per remote core.

Ray binds to the machine's non-loopback address, so run this inside a network namespace that
has only loopback (``make bench-scale-out`` makes one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

from drapps.bench.data import default_data_dir, make_jpeg_folder
from drapps.bench.environment import describe_environment

PATHS = ("local", "ray", "redis")
_FOLDER_VARIABLE = "DRAPPS_SCALE_OUT_FOLDER"
_IMAGES = {"smoke": 96, "quick": 1024}


def image_dataset() -> Any:
    """The image workload's dataset over ``$DRAPPS_SCALE_OUT_FOLDER`` (what the ``drapps
    serve`` producers load: ``--dataset drapps.bench.scale_out:image_dataset``)."""
    from drapps.bench.workloads.image import ImageWorkload

    return ImageWorkload({"folder": os.environ[_FOLDER_VARIABLE]}).dataset(None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _redis_producers(workers: int) -> Iterator[str]:
    """A loopback redis-server and ``workers`` producers; yields the loader's source URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    command = [
        sys.executable, "-m", "drapps.cli", "serve", "--redis", url, "--queue", "bench",
        "--dataset", "drapps.bench.scale_out:image_dataset", "--workers", str(workers),
    ]  # fmt: skip
    producers = subprocess.Popen(command, start_new_session=True)
    try:
        yield f"{url}?queue=bench"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(producers.pid, 15)
        producers.wait(timeout=30)
        server.kill()
        server.wait()


def _time_epochs(loader: Any, epochs: int) -> tuple[float, int, float, int]:
    """(seconds, samples, training-process CPU seconds, batches) over ``epochs`` epochs."""
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    samples = batches = 0
    for _ in range(epochs):
        for images, _labels in loader:
            samples += len(images)
            batches += 1
    seconds = time.perf_counter() - t0
    return seconds, samples, sum(me.cpu_times()[:2]) - cpu0, batches


def measure(
    *, workers: int = 2, repeats: int = 5, epochs: int = 2, size: str = "quick", seed: int = 0
) -> dict[str, Any]:
    """Run the three paths (interleaved repeats); returns the figures and the environment."""
    import ray

    import drapps

    folder = make_jpeg_folder(default_data_dir(), _IMAGES[size], seed=seed)
    os.environ[_FOLDER_VARIABLE] = str(folder)
    dataset = image_dataset()
    kwargs: dict[str, Any] = {"batch_size": 32, "shuffle": True, "seed": seed}
    results: dict[str, list[tuple[float, int, float, int]]] = {p: [] for p in PATHS}
    ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR)
    try:
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(_redis_producers(workers))
            loaders = {
                "local": drapps.Loader(
                    dataset, workers=workers, persistent_workers=True, cache=None, **kwargs
                ),
                "ray": drapps.Loader(
                    dataset, workers=workers, persistent_workers=True, backend="ray", **kwargs
                ),
                "redis": drapps.Loader(source=source, timeout=120, **kwargs),
            }
            for loader in loaders.values():
                stack.callback(loader.close)
            firsts = {}
            for name, loader in loaders.items():  # warm: workers started, pages touched
                batches = [b for b in loader]
                firsts[name] = batches[0][0]
            identical = all(torch.equal(firsts["local"], firsts[p]) for p in PATHS)
            for r in range(repeats):
                order = PATHS[r % 3 :] + PATHS[: r % 3]
                for name in order:
                    results[name].append(_time_epochs(loaders[name], epochs))
            batch_bytes = firsts["local"].numel() * firsts["local"].element_size()
            local_stats = loaders["local"].stats()
    finally:
        ray.shutdown()
    worker_s = local_stats.fetch_s + local_stats.transform_s + local_stats.collate_s
    figures: dict[str, Any] = {}
    for name, runs in results.items():
        rates = [samples / seconds for seconds, samples, _, _ in runs]
        cpu = [cpu_s / batches for _, _, cpu_s, batches in runs]
        figures[name] = {
            "samples_per_s": statistics.median(rates),
            "samples_per_s_runs": rates,
            "trainer_cpu_ms_per_batch": 1000 * statistics.median(cpu),
        }
    for name in ("ray", "redis"):
        figures[name]["vs_local"] = (
            figures[name]["samples_per_s"] / figures["local"]["samples_per_s"]
        )
    return {
        "workers": workers,
        "repeats": repeats,
        "epochs_per_repeat": epochs,
        "images": _IMAGES[size],
        "batch_size": 32,
        "batch_bytes": batch_bytes,
        "identical_first_batch": identical,
        "worker_cpu_ms_per_batch": 1000 * worker_s / max(1, local_stats.batches),
        "paths": figures,
        "environment": describe_environment(),
    }


def what_if(
    measured: dict[str, Any],
    *,
    nodes: tuple[int, ...] = (1, 2, 4, 8),
    cores_per_node: int = 4,
    links_gbps: tuple[float, ...] = (10.0, 25.0),
    duration: float = 30.0,
) -> list[dict[str, Any]]:
    """Simulated samples/s of each remote path with the preprocessing on ``nodes`` machines
    of ``cores_per_node`` cores, one worker per core, the batches crossing one link of each
    of ``links_gbps`` into the training host (whose own cores only receive batches)."""
    from drapps.sim import PipelineModel, Scenario
    from drapps.sim.run import simulate

    rows = []
    for path, link_gbps in ((p, g) for p in ("ray", "redis") for g in links_gbps):
        transport_s = measured["paths"][path]["trainer_cpu_ms_per_batch"] / 1000
        for n in nodes:
            remote = n * cores_per_node
            model = PipelineModel(
                cores=remote + 2,  # + the training host's own, for its receiving thread
                batch_size=measured["batch_size"],
                cpu_s=measured["worker_cpu_ms_per_batch"] / 1000,
                read_bytes=int(measured["batch_bytes"]),
                disk_bps=link_gbps * 1e9 / 8,
                step_s=1e-4,  # loader-bound, as measured
                transport_s=transport_s,
                batch_bytes=int(measured["batch_bytes"]),
                max_workers=remote,
                worker_start_s=0.0,
            )
            run = simulate(Scenario(model, name=f"{path}-{n}"), "static", duration=duration,
                           workers=remote)  # fmt: skip
            rows.append(
                {
                    "path": path,
                    "nodes": n,
                    "cores": remote,
                    "samples_per_s": run.throughput,
                    "link_gbps": link_gbps,
                    "cores_per_node": cores_per_node,
                }
            )
    return rows


def markdown(measured: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The two tables the README shows."""
    env = measured["environment"]
    lines = [
        f"Machine: {env['cpu']}, {env['usable_cores']} usable cores; {measured['workers']} "
        f"workers per path; {measured['images']} images, batch {measured['batch_size']}; "
        f"medians of {measured['repeats']} interleaved repeats of {measured['epochs_per_repeat']}"
        " epochs; first batches identical across paths: "
        f"{'yes' if measured['identical_first_batch'] else 'NO'}.",
        "",
        "| path | samples/s | vs local | training-process CPU per batch |",
        "|---|---:|---:|---:|",
    ]
    for name in PATHS:
        p = measured["paths"][name]
        ratio = f"{p['vs_local']:.2f}x" if "vs_local" in p else "1.00x"
        lines.append(
            f"| {name} | {p['samples_per_s']:,.0f} | {ratio} | "
            f"{p['trainer_cpu_ms_per_batch']:.1f} ms |"
        )
    links = sorted({r["link_gbps"] for r in rows})
    lines += [
        "",
        "What-if (the simulator, calibrated on the runs above: worker CPU "
        f"{measured['worker_cpu_ms_per_batch']:.0f} ms per batch, each path's training-process "
        f"CPU per batch, {measured['batch_bytes'] / 2**20:.1f} MiB batches over one link; "
        f"{rows[0]['cores_per_node']}-core preprocessing nodes, one worker per core), "
        "samples/s:",
        "",
        "| nodes | cores | "
        + " | ".join(f"ray, {g:g} Gb/s | redis, {g:g} Gb/s" for g in links)
        + " |",
        "|---:|---:|" + "---:|---:|" * len(links),
    ]
    by = {(r["path"], r["link_gbps"], r["nodes"]): r for r in rows}
    for n in sorted({r["nodes"] for r in rows}):
        cells = [
            f"{by[path, g, n]['samples_per_s']:,.0f}" for g in links for path in ("ray", "redis")
        ]
        lines.append(f"| {n} | {by['ray', links[0], n]['cores']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(out: Path, **kwargs: Any) -> dict[str, Any]:
    """:func:`measure`, :func:`what_if`; writes ``results.json`` and ``results.md`` to ``out``."""
    measured = measure(**kwargs)
    rows = what_if(measured)
    out.mkdir(parents=True, exist_ok=True)
    result = {**measured, "what_if": rows}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    (out / "results.md").write_text(markdown(measured, rows))
    return result
