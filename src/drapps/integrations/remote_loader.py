"""The training host's loader over a Redis batch queue: ``drapps.Loader(source="redis://...")``.

The producers (``drapps serve``) hold the dataset and the transform; this loader holds only the
plan: it learns the dataset's length from the producers, orders each epoch exactly as a local
``drapps.Loader`` with the same ``seed`` would, posts the batches as tasks, and delivers what
comes back in batch order, each exactly once. Batches are bit-identical to a local loader's
with the same dataset, transform and seed.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from drapps.integrations.redis_queue import QueueAddress, QueueReader, iterate
from drapps.runtime.config import checked_index, parse_bytes
from drapps.runtime.plan import Plan
from drapps.runtime.sampling import draw_base_seed
from drapps.runtime.stats import LoaderStats
from drapps.runtime.transport import pinner

_STATE_VERSION = 2
_DEFAULTS_ONLY = {
    "sampler": None, "batch_sampler": None, "num_workers": None, "collate_fn": None,
    "worker_init_fn": None, "multiprocessing_context": None, "transform": None, "split": None,
    "device": None, "backend": "process", "workers": None, "max_workers": None,
    "policy": "heuristic", "trace": None, "on_error": "raise", "dataset": None,
}  # fmt: skip


class RemoteLoader:
    """Batches made by ``drapps serve`` producers, read from a Redis queue in order.

    Made by ``drapps.Loader(source=...)``; the arguments are the Loader's that still mean
    something here. Dataset-side ones (``transform``, ``collate_fn``, workers, ...) belong to
    ``drapps serve`` and are refused with a message that says so.

    Args:
        source: ``redis://[user:password@]host:port/db?queue=NAME`` (or ``rediss://``,
            ``unix://``).
        batch_size, shuffle, drop_last, seed, generator: as for ``drapps.Loader``; with the
            same seed the batches are those a local loader gives.
        pin_memory: deliver batches in page-locked memory when an accelerator is present.
        timeout: seconds without any batch before giving up (TimeoutError).
        prefetch: tasks posted ahead of the batch being read ("auto": 8).
        max_batch_bytes: refuse (before fetching it) a batch announced larger than this.
        username, password: an ACL user, when not in the URL.
    """

    def __init__(
        self,
        dataset: Any = None,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        *,
        source: str,
        drop_last: bool = False,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        pin_memory: bool = False,
        timeout: float | None = 60.0,
        prefetch: int | str = "auto",
        max_batch_bytes: int | str = "1GiB",
        username: str | None = None,
        password: str | None = None,
        **others: Any,
    ) -> None:
        others["dataset"] = dataset
        for name, value in others.items():
            if name in _DEFAULTS_ONLY and value != _DEFAULTS_ONLY[name]:
                raise ValueError(
                    f"{name}: with source=... the producers make the batches; give the "
                    f"dataset side to `drapps serve` instead, got {name}={value!r}"
                )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 with source=..., got {batch_size!r}")
        if prefetch != "auto" and (not isinstance(prefetch, int) or prefetch < 1):
            raise ValueError(f"prefetch must be an int >= 1 or 'auto', got {prefetch!r}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        self.address = QueueAddress.parse(source)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = drop_last
        self.seed = seed
        self.generator = generator
        self.pin_memory = pin_memory
        self._prefetch = 8 if prefetch == "auto" else int(prefetch)
        self._finish = pinner(pin_memory)
        self._reader = QueueReader(
            self.address,
            max_batch_bytes=parse_bytes(max_batch_bytes, "max_batch_bytes"),
            timeout=float(timeout) if timeout else 3600.0,
            username=username,
            password=password,
        )
        self._finalizer = weakref.finalize(self, _close_reader, self._reader)
        self.length = self._reader.length()
        self._lock = threading.Lock()
        self._base_seed: int | None = None
        self._next_epoch = 0
        self._next_batch = 0
        self._epoch = -1
        self._position: int | None = None
        self._batches = self._samples = 0
        self._wait_s = 0.0
        self._closed = False

    # --------------------------------------------------------------------------- iterating

    @property
    def num_workers(self) -> int:
        return 0

    def _plan(self, epoch: int) -> Plan:
        if self.seed is not None:
            seed = self.seed
        else:
            if self._base_seed is None:
                self._base_seed = draw_base_seed(self.generator)
            seed = self._base_seed
        return Plan(self.length, self.batch_size, self.shuffle, self.drop_last, seed, epoch)

    def __len__(self) -> int:
        return len(self._plan(0))

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this drapps.Loader is closed")
        with self._lock:
            epoch, start = self._next_epoch, self._next_batch
            self._next_epoch, self._next_batch = epoch + 1, 0
            self._epoch, self._position = epoch, start
        return self._run(self._plan(epoch), start)

    def _run(self, plan: Plan, start: int) -> Iterator[Any]:
        def delivered(batch_id: int) -> None:
            self._position = batch_id + 1
            self._batches += 1
            self._samples += len(plan.batch(batch_id))

        batches = iterate(self._reader, plan, start, self._prefetch, delivered)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                self._position = None
                return
            finally:
                self._wait_s += time.perf_counter() - t0
            yield self._finish(batch) if self._finish is not None else batch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` run ``epoch`` from its first batch."""
        epoch = checked_index("epoch", epoch)
        with self._lock:
            self._next_epoch, self._next_batch, self._position = epoch, 0, None

    # ------------------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Where reading stands; a new loader on the same queue resumes from it."""
        with self._lock:
            if self._position is not None:
                epoch, next_batch = self._epoch, self._position
            else:
                epoch, next_batch = self._next_epoch, self._next_batch
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "next_batch": next_batch,
            "seed": self.seed if self.seed is not None else self._plan(epoch).seed,
            "num_samples": self.length,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter(loader)`` yields the rest.

        Raises:
            ValueError: the state is malformed or belongs to another dataset or plan.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict from Loader.state_dict(), got {state!r}")
        epoch = checked_index("state epoch", state.get("epoch"))
        next_batch = checked_index("state next_batch", state.get("next_batch"))
        for key, mine in (
            ("num_samples", self.length),
            ("batch_size", self.batch_size),
            ("shuffle", self.shuffle),
            ("drop_last", self.drop_last),
        ):
            if state.get(key) != mine:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={mine!r}"
                )
        if self.seed is None:
            self._base_seed = checked_index("state seed", state.get("seed"))
        elif state.get("seed") != self.seed:
            raise ValueError(
                f"state was saved with seed={state.get('seed')!r} but this loader has "
                f"seed={self.seed!r}"
            )
        if next_batch > len(self._plan(epoch)):
            raise ValueError(
                f"state next_batch must be in [0, {len(self._plan(epoch))}], got {next_batch}"
            )
        with self._lock:
            self._next_epoch, self._next_batch, self._position = epoch, next_batch, None

    # ---------------------------------------------------------------------------- counters

    def stats(self) -> LoaderStats:
        """Counters since the loader was made (the workers are the producers', not here)."""
        return LoaderStats(
            epoch=self._epoch, batches=self._batches, samples=self._samples,
            samples_skipped=0, skipped=(), workers=0, target_workers=0, worker_pids=(),
            prefetch_depth=self._prefetch, ready_batches=0, ready_bytes=0,
            peak_ready_bytes=0, memory_budget=0, in_flight=0, wait_s=self._wait_s,
            worker_restarts=0, timeouts=0, retries=0, pickled_bytes=0, shared_bytes=0,
            fetch_s=0.0, transform_s=0.0, collate_s=0.0,
        )  # fmt: skip

    def report(self) -> str:
        """A short account: what was read from where, and how long the loop waited."""
        return (
            f"Read {self._batches} batches ({self._samples} samples) from Redis queue "
            f"{self.address.name!r}; the training loop waited {self._wait_s:.1f} s for them."
        )

    def close(self) -> None:
        """Release what the reader holds on Redis and close its connection. Idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close_reader(reader: QueueReader) -> None:
    reader.close()
