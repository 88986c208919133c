"""Per-sample randomness: every sample's augmentation draws come from (seed, epoch, index).

Before drapps fetches sample ``index`` of ``epoch`` it seeds Python's :mod:`random`, NumPy's
global RNG and torch's default CPU generator from ``sample_seed_for(seed, epoch, index)``. A
transform that calls ``random.random()``, ``np.random.rand()`` or ``torch.rand()`` (as
torchvision's do) therefore draws the same numbers for that sample whichever worker makes it, after
any resize or restart, and in the calling process with ``workers=0``. A key the epoch draws
again (a sampler with replacement, a weighted one) is seeded by its repeat too, so each time it
comes it draws anew. :func:`sample_rng` gives an explicit NumPy generator for the same sample,
for code that prefers not to touch global state.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
"""torch's seeds are kept below 2**63, as DataLoader's are: code that puts
``torch.initial_seed()`` in an int64 tensor must not overflow."""
# Stream tags keep the epoch-order generator independent of every sample's generator.
ORDER_STREAM = 0x6F72646572  # "order"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """Hash integers into one well-mixed 64-bit seed (order matters)."""
    h = 0
    for part in parts:
        h = _splitmix64(h ^ (part & _MASK64))
    return h


def sample_seed_for(seed: int, epoch: int, index: int, repeat: int = 0) -> int:
    """The 64-bit seed of sample ``index`` in ``epoch`` for a loader seeded with ``seed``.

    ``repeat``: how many times the epoch drew ``index`` before (a sampler with replacement, a
    weighted one): each time a key comes again in one epoch it draws anew.
    """
    return repeat_seed(mix_seed(seed, epoch, index), repeat)


def repeat_seed(first: int, repeat: int) -> int:
    """The seed of a key's ``repeat``-th repeat in an epoch, from its first time's (itself
    for 0)."""
    return first if repeat == 0 else _splitmix64(first ^ (repeat & _MASK64))


def epoch_seeds(seed: int, epoch: int) -> Callable[[int], int]:
    """``sample_seed_for(seed, epoch, index)`` as a function of ``index``, with the mix of
    ``seed`` and ``epoch`` done once (a sample made in memory notices the two it saves).

    Example:
        >>> epoch_seeds(7, 2)(11) == sample_seed_for(7, 2, 11)
        True
    """
    prefix = mix_seed(seed, epoch)
    return lambda index: _splitmix64(prefix ^ (index & _MASK64))


class _SampleContext(threading.local):
    seed: int | None = None
    later: tuple[int, int, int, int] | None = None  # (seed, epoch, index, repeat): not yet mixed
    rng: np.random.Generator | None = None
    bits: np.random.PCG64 | None = None


_context = _SampleContext()


def seed_sample(sample_seed: int, *, reseed: bool = True, torch_too: bool = False) -> None:
    """Enter a sample: seed the global RNGs (unless ``reseed`` is False: they then draw on,
    but for torch's where ``torch_too``) and reset :func:`sample_rng` for it."""
    _context.seed, _context.later = sample_seed, None
    _context.rng = None
    if not reseed:
        if torch_too:
            torch.default_generator.manual_seed(sample_seed & _MASK63)
        return
    random.seed(sample_seed)
    np.random.seed(sample_seed >> 32)
    # torch.manual_seed also seeds every accelerator backend (~130 us); the CPU generator is
    # what transforms in a data worker use, and seeding it alone costs ~1.5 us.
    torch.default_generator.manual_seed(sample_seed & _MASK63)


def seed_sample_later(seed: int, epoch: int, index: int, repeat: int = 0) -> None:
    """Enter sample ``index`` of ``epoch`` (its ``repeat``-th repeat) without reseeding the
    global RNGs, its seed (``sample_seed_for(seed, epoch, index, repeat)``) mixed only if
    :func:`sample_seed` or :func:`sample_rng` asks for it: most samples never do, and the
    mix costs about a microsecond, which a sample made in memory notices."""
    _context.seed, _context.later = None, (seed, epoch, index, repeat)
    _context.rng = None


def clear_sample() -> None:
    """Leave the current sample (outside a sample :func:`sample_rng` raises)."""
    _context.seed, _context.later = None, None
    _context.rng = None


def sample_seed() -> int:
    """The 64-bit seed of the sample being made right now.

    Raises:
        RuntimeError: when called outside a drapps sample (not from a dataset's ``__getitem__``
            or a transform run by a :class:`drapps.Loader`).
    """
    seed = _current_seed()
    if seed is None:
        raise RuntimeError(
            "sample_seed() is only defined while a drapps.Loader makes a sample "
            "(inside dataset.__getitem__, a transform, or a function they call)"
        )
    return seed


def _current_seed() -> int | None:
    """The seed of the sample being made in this thread (mixed now if it was left for
    later); None outside a sample."""
    if _context.seed is None and _context.later is not None:
        _context.seed = sample_seed_for(*_context.later)
    return _context.seed


def sample_rng() -> np.random.Generator:
    """A NumPy generator for the sample being made right now, seeded from (seed, epoch, index).

    Repeated calls within one sample return the same generator, so draws continue one stream.
    The generator is only valid while its sample is made: the next sample reuses its state.

    Example:
        >>> import drapps
        >>> class Jitter:
        ...     def __call__(self, x):
        ...         return x + drapps.sample_rng().normal()

    Raises:
        RuntimeError: outside a drapps sample.
    """
    rng = _context.rng
    if rng is None:
        seed = sample_seed()
        if _context.bits is None:
            _context.bits = np.random.PCG64(0)
        # Setting PCG64's 128-bit state from splitmix64 outputs costs ~3 us; PCG64(seed) runs
        # SeedSequence and costs ~20 us, which is noticeable per sample in a fast pipeline.
        _context.bits.state = _pcg64_state(seed)
        rng = np.random.Generator(_context.bits)
        _context.rng = rng
    return rng


OP_STREAM = 0x6F70  # "op"


def op_rng(sample_seed: int, op_index: int) -> np.random.Generator:
    """The generator op ``op_index`` of a :class:`drapps.ops.Pipeline` draws from for the
    sample seeded ``sample_seed``: its own stream, so an op draws the same parameters whether
    it runs in a worker on one sample or after the reorder buffer on a batch."""
    seed = mix_seed(sample_seed, OP_STREAM, op_index)
    bits = np.random.PCG64(0)
    bits.state = _pcg64_state(seed)
    return np.random.Generator(bits)


@contextmanager
def op_stream(op_index: int) -> Iterator[None]:
    """Inside a sample, make :func:`sample_rng` (and :func:`active_rng`) draw from
    ``op_rng(sample seed, op_index)`` until the block ends; outside one, change nothing."""
    seed = _current_seed()
    if seed is None:
        yield
        return
    saved = _context.rng
    _context.rng = op_rng(seed, op_index)
    try:
        yield
    finally:
        _context.rng = saved


def active_rng() -> np.random.Generator:
    """:func:`sample_rng` inside a drapps sample; outside one, a per-process generator.

    For ops that must also work outside a Loader (e.g. under torch's DataLoader), where there
    is no per-sample seed; their randomness is then as the host loader seeds it.
    """
    if _current_seed() is not None:
        return sample_rng()
    global _fallback, _fallback_pid
    if _fallback is None or _fallback_pid != os.getpid():
        # Reseeded after fork so that forked workers do not repeat each other's draws.
        _fallback, _fallback_pid = np.random.default_rng(), os.getpid()
    return _fallback


def _pcg64_state(seed: int) -> Any:
    return {
        "bit_generator": "PCG64",
        "state": {
            "state": (_splitmix64(seed ^ 0x1) << 64) | _splitmix64(seed ^ 0x2),
            "inc": (_splitmix64(seed ^ 0x3) << 64) | _splitmix64(seed ^ 0x4) | 1,
        },
        "has_uint32": 0,
        "uinteger": 0,
    }


_fallback: np.random.Generator | None = None
_fallback_pid = -1


def seed_worker(base_seed: int, worker_id: int, *, devices: bool = True) -> None:
    """Seed a new worker's global RNGs as DataLoader seeds its workers.

    ``torch``'s and Python's generators get ``base_seed + worker_id``; NumPy's gets the state
    torch derives from both, so code that draws outside a sample (``worker_init_fn``, an
    iterable dataset's stream) sees the numbers it would see under DataLoader.

    ``devices``: seed every accelerator's generator too, as ``torch.manual_seed`` does (False:
    only the CPU generator, for a worker that runs in the training process).
    """
    from torch.utils.data._utils.worker import _generate_state

    seed = (base_seed + worker_id) & _MASK63
    random.seed(seed)
    if devices:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))


def set_worker_info(
    worker_id: int, num_workers: int, base_seed: int, dataset: object, *, watched: bool = False
) -> None:
    """Make ``torch.utils.data.get_worker_info()`` describe this worker process.

    ``watched``: note when the dataset reads the worker's ``id`` or ``num_workers`` (what a
    dataset shards by), for :func:`worker_info_read`.
    """
    from torch.utils.data._utils import worker as torch_worker

    _read[0] = False
    kind = _watched_info_class() if watched else torch_worker.WorkerInfo
    torch_worker._worker_info = kind(
        id=worker_id,
        num_workers=num_workers,
        seed=(base_seed + worker_id) & _MASK63,
        dataset=dataset,
    )


_read = [False]


def worker_info_read() -> bool:
    """Whether the dataset has read this worker's ``id`` or ``num_workers`` since the worker
    info was last set (watched)."""
    return _read[0]


@functools.cache
def _watched_info_class() -> type:
    from torch.utils.data._utils.worker import WorkerInfo

    class WatchedWorkerInfo(WorkerInfo):
        """torch's WorkerInfo, noting a read of the attributes a dataset shards by."""

        def __getattribute__(self, name: str) -> Any:
            if name in ("id", "num_workers"):
                _read[0] = True
            return super().__getattribute__(name)

    return WatchedWorkerInfo


class _ThreadWorker(threading.local):
    info: Any = None
    """The WorkerInfo of the thread worker running in this thread (None: not one)."""
    hidden: bool = False


_thread_worker = _ThreadWorker()
_per_thread_lock = threading.Lock()


def _worker_info_here() -> Any:
    """What ``get_worker_info()`` says in this thread: the thread worker's info where one
    runs, else torch's own (the worker process's, or None in the training process)."""
    from torch.utils.data._utils import worker as torch_worker

    here = _thread_worker
    if here.hidden:
        return None
    if here.info is not None:
        return here.info
    return torch_worker._worker_info


def _dispatching_get_worker_info() -> Any:
    return _drapps_worker_info_here()  # type: ignore[name-defined]  # noqa: F821


def answer_worker_info_per_thread() -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer per thread (idempotent).

    torch keeps the worker's info in a module global, one per process. Thread workers need one
    per thread, so the function's code is replaced by a lookup of this thread's info that
    falls back to the global: every reference to the function sees it, including a name a
    dataset bound with ``from torch.utils.data import get_worker_info`` before drapps ran.
    Outside a thread worker it answers exactly as before.
    """
    from torch.utils.data._utils import worker as torch_worker

    with _per_thread_lock:
        function = torch_worker.get_worker_info
        if function.__code__ is _dispatching_get_worker_info.__code__:
            return
        # The replaced code looks its helper up in the globals of torch's module.
        torch_worker.__dict__["_drapps_worker_info_here"] = _worker_info_here
        function.__code__ = _dispatching_get_worker_info.__code__


def _answers_per_thread() -> bool:
    """Whether ``get_worker_info()`` answers per thread in this process."""
    from torch.utils.data._utils import worker as torch_worker

    return torch_worker.get_worker_info.__code__ is _dispatching_get_worker_info.__code__


def set_thread_worker_info(worker_id: int, num_workers: int, base_seed: int, dataset: Any) -> None:
    """Make ``get_worker_info()`` describe this thread as worker ``worker_id`` (see
    :func:`answer_worker_info_per_thread`)."""
    from torch.utils.data._utils.worker import WorkerInfo

    _thread_worker.info = WorkerInfo(
        id=worker_id,
        num_workers=num_workers,
        seed=(base_seed + worker_id) & _MASK63,
        dataset=dataset,
    )


@contextmanager
def worker_info_hidden() -> Iterator[None]:
    """Let ``get_worker_info()`` return None for a moment.

    torch's ``default_collate`` collates into a new shared-memory tensor when it sees that it
    runs in a worker, because DataLoader's queues then send the tensor without a copy. drapps
    copies every batch into its own slab anyway, so that allocation is pure cost (measured: 4.8
    against 0.9 ms to collate 32 images of 224x224, and 15% fewer images/s).
    """
    from torch.utils.data._utils import worker as torch_worker

    if _thread_worker.info is not None or _answers_per_thread():
        # Threads make samples beside this one (thread workers, or a worker process's sample
        # threads): hide the info from this thread only.
        _thread_worker.hidden = True
        try:
            yield
        finally:
            _thread_worker.hidden = False
        return
    info = torch_worker._worker_info
    torch_worker._worker_info = None
    try:
        yield
    finally:
        torch_worker._worker_info = info


def rng_state() -> dict[str, Any]:
    """This process's global RNG states (Python's, NumPy's, torch's CPU generator) as plain
    data (JSON-safe): what a persistent stream worker has drawn to, for a checkpoint."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    words_bytes = np.asarray(keys, dtype="<u4").tobytes()
    return {
        "python": [version, list(words), gauss],
        "numpy": [kind, base64.b64encode(words_bytes).decode(), pos, has_gauss, cached],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` gave.

    Raises:
        ValueError: ``state`` is not such a dict.
    """
    try:
        version, words, gauss = state["python"]
        kind, keys, pos, has_gauss, cached = state["numpy"]
        torch_bytes = base64.b64decode(state["torch"], validate=True)
        random.setstate((version, tuple(int(w) for w in words), gauss))
        array = np.frombuffer(base64.b64decode(keys, validate=True), "<u4")
        np.random.set_state((kind, array.astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(torch.frombuffer(bytearray(torch_bytes), dtype=torch.uint8))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"not an RNG state from a drapps checkpoint: {exc}") from None


GENERATORS = ("Python's random", "NumPy's np.random", "torch's default generator")
"""The global generators, in words, in the order of :func:`global_states`."""


def moved_generators(before: tuple[Any, Any, Any], after: tuple[Any, Any, Any]) -> list[str]:
    """The global generators (:data:`GENERATORS`) drawn from between two
    :func:`global_states`."""
    moved = []
    for name, was, now in zip(GENERATORS, before, after, strict=True):
        if isinstance(was, torch.Tensor):
            same = bool(torch.equal(was, now))
        elif isinstance(was, tuple) and len(was) > 2 and isinstance(was[1], np.ndarray):
            same = bool(np.array_equal(was[1], now[1])) and was[2:] == now[2:]
        else:
            same = was == now
        if not same:
            moved.append(name)
    return moved


def global_states() -> tuple[Any, Any, torch.Tensor]:
    """Python's, NumPy's (its legacy tuple) and torch's CPU generator's states: what
    :func:`moved_generators` compares (:func:`saved_states` saves them faster)."""
    return random.getstate(), np.random.get_state(), torch.default_generator.get_state()


def saved_states() -> tuple[Any, Any, torch.Tensor]:
    """The global generators' states, as :func:`restore_states` puts them back: NumPy's
    copied as raw bytes where it can be (:func:`_numpy_state`), which is what makes saving
    and restoring around a batch made in the training process cost ~15 us, not ~80 us."""
    return random.getstate(), _numpy_state(), torch.default_generator.get_state()


def restore_states(states: tuple[Any, Any, torch.Tensor]) -> None:
    """Put back what :func:`saved_states` saved."""
    random.setstate(states[0])
    _set_numpy_state(states[1])
    torch.default_generator.set_state(states[2])


def unmoved(saved: tuple[Any, Any, torch.Tensor]) -> bool:
    """Whether neither Python's nor NumPy's global generator moved since :func:`saved_states`
    gave ``saved`` (~13 us; torch's is not compared). A NumPy state saved the slow way (it
    held a cached Gaussian, or is another bit generator) is not compared: it counts as
    moved."""
    python, numpy_state, _ = saved
    if not (isinstance(numpy_state, tuple) and len(numpy_state) == 2):
        return False
    address, raw = numpy_state
    return (
        _mt_address() == address
        and ctypes.string_at(address, _MT_BYTES) == raw
        and random.getstate() == python
    )


_MT_BYTES = 624 * 4 + 4
"""MT19937's state as NumPy keeps it: 624 32-bit words, then the position (a C int)."""
_mt_checked: tuple[Any, int | None] = (None, None)  # (the bit generator, its state's address)


def _mt_address() -> int | None:
    """The address of the words and position of NumPy's global generator, where copying raw
    bytes saves and restores it; None where it is not an MT19937 laid out as expected (checked
    once per generator against its own ``state``: the slow, documented way is used then)."""
    global _mt_checked
    bits = np.random.mtrand._rand._bit_generator
    if _mt_checked[0] is not bits:
        address = None
        if isinstance(bits, np.random.MT19937):
            state = bits.state["state"]
            pos = bytes(ctypes.c_int(state["pos"]))
            laid_out = np.asarray(state["key"], np.uint32).tobytes() + pos
            candidate = bits.ctypes.state_address
            if ctypes.string_at(candidate, _MT_BYTES) == laid_out:
                address = candidate
        _mt_checked = (bits, address)
    return _mt_checked[1]


def _numpy_state() -> Any:
    """NumPy's global state: ``(address, raw bytes)`` of its MT19937 (~2 us), where
    ``np.random.get_state()`` copies the words one by one (~30 us).

    The legacy generator may also hold a cached Gaussian (normal draws come in pairs), which
    the raw bytes do not: one normal is drawn to see, because a cached one is handed out
    without a word drawn. There was none in most cases: the words are written back, and the
    cache that draw left is cleared (``seed`` clears it). Where there was one, it is put back,
    and the legacy tuple returned. Another bit generator (``np.random.set_bit_generator``)
    gives its state dict.
    """
    address = _mt_address()
    if address is None:
        return np.random.get_state(legacy=False)
    raw = ctypes.string_at(address, _MT_BYTES)
    cached = float(np.random.standard_normal())
    if ctypes.string_at(address, _MT_BYTES) == raw:  # the cached Gaussian, handed out
        state = _legacy_state(raw, 1, cached)
        np.random.set_state(state)
        return state
    _set_numpy_state((address, raw))
    return address, raw


def _set_numpy_state(state: Any) -> None:
    if not (isinstance(state, tuple) and len(state) == 2):
        np.random.set_state(state)
        return
    address, raw = state
    if _mt_address() != address:  # the global bit generator was replaced since: not there
        np.random.set_state(_legacy_state(raw, 0, 0.0))
        return
    np.random.seed(0)  # clears a cached Gaussian; every word is then overwritten
    ctypes.memmove(address, raw, _MT_BYTES)


def _legacy_state(raw: bytes, has_gauss: int, cached: float) -> Any:
    """NumPy's legacy state tuple of an MT19937's raw bytes (:data:`_MT_BYTES`)."""
    keys = np.frombuffer(raw, np.uint32, count=624).copy()
    return ("MT19937", keys, np.frombuffer(raw, np.intc, 1, 624 * 4).item(), has_gauss, cached)


class WorkerRngs:
    """The global RNG states of a worker that lives in the training process: an iterable
    dataset's stream with ``workers=0``, seeded as DataLoader seeds worker 0 (so it streams
    as one worker does), and swapped in only while the stream runs, so neither the stream nor
    the training loop sees the other's draws.

    Example:
        >>> import random
        >>> rngs = WorkerRngs(7)
        >>> with rngs.active():
        ...     first = random.random()
        >>> with WorkerRngs(7).active():
        ...     random.random() == first
        True
    """

    def __init__(self, base_seed: int) -> None:
        with preserved_global_rngs():
            seed_worker(base_seed, 0, devices=False)
            self._states = saved_states()

    @contextmanager
    def active(self) -> Iterator[None]:
        """The block runs with this worker's RNG states; the caller's are back after it."""
        caller = saved_states()
        restore_states(self._states)
        try:
            yield
        finally:
            self._states = saved_states()
            restore_states(caller)


@contextmanager
def preserved_global_rngs() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG states on exit.

    With ``workers=0`` samples are made in the training process; reseeding its global RNGs per
    sample must not change the randomness the training loop itself sees (dropout, shuffling...).
    """
    states = saved_states()
    try:
        yield
    finally:
        restore_states(states)
        clear_sample()
