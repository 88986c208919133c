"""drapps against drapps without workers, through the events only drapps has.

Where the answer is drapps' own (per-sample seeding, resizes mid-epoch, killed workers, batches
cut into parts, the sample cache, checkpoints resumed in a new loader), the reference is the
same loader made with ``workers=0``: it makes every batch in the training process, with no
pool to resize, kill or restart (for an iterable dataset, and for persistent workers, whose
base seed is drawn once, the same loader with its workers and no events). A Hypothesis state
machine drives a loader with workers through random events (take a batch, resize, SIGKILL a
worker, make the batches in the training process and bring the workers back, checkpoint
through JSON and resume in a new loader after another ``torch.manual_seed`` (the old one
closed or dropped unclosed), or go on in a deep copy or a pickled copy of the loader, start
the next epoch early, also while another thread is inside the old iterator's ``next()``,
take batches from a second iterator beside the loop's, fork a child that drops its copies
and exits)
and checks after every step that what the loop received is the reference's epoch so far,
and at every epoch's end
that it held each planned sample exactly once. Batches filled from made samples
(``defer_after``) are not the planned ones: each epoch holds every planned sample once, in as
many batches, and replays bit for bit, without workers, from the keys it delivered.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import faulthandler
import functools
import gc
import json
import os
import pickle
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from cases import (
    RNGS,
    WAIT_S,
    WAITED,
    Leaf,
    Payload,
    Samples,
    Stream,
    identity,
    payloads,
    without_draws,
)
from compare import (
    Outcome,
    assert_aligned,
    assert_equal,
    assert_owned,
    batch_indices,
    nothing_left,
    run,
)
from harness import FAST, FAST_EXAMPLES, Budget, campaign, in_chunks, traced, trail
from hypothesis import assume, note, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import drapps

EPOCHS = 3


@dataclass(frozen=True)
class Run:
    """A loader with workers and the reference it is held to."""

    # The defaults are the plainest run, which the walks written out below vary.
    n: int
    payload: Payload
    workers: int | str
    seed: int | None = None
    batch_size: int = 1
    shuffle: bool = False
    # None, "random", one that gives keys again: "replacement", "weighted", or a permutation
    # whose keys are 0-d tensors or NumPy integers: "tensor_keys", "numpy_keys"
    sampler: str | None = None
    dispatch: str = "batches"
    cache: bool = False
    persistent: bool = False
    iterable: bool = False
    threads: bool = False
    waits: bool = False  # samples that wait, under workers="auto": made several at a time
    defer: bool = False  # batches filled from made samples (defer_after=0), map-style only
    codec: str = "none"  # the sample cache's ("auto": lossless ones, profiled on first samples)
    held: bool = False  # map-style samples kept and returned as they are (no draws then)
    keep: bool = False  # a collate_fn that keeps the samples as they are (not with defer)
    generator: bool = False  # orders and base seeds drawn from a generator of the loader's

    def dataset(self) -> Any:
        if self.iterable:
            return Stream(self.n, self.payload, sharded=True, shuffle="random")
        if self.waits and self.workers == "auto":
            return Samples(self.n + WAITED, self.payload, wait_s=WAIT_S, held=self.held)
        return Samples(self.n, self.payload, held=self.held)

    @property
    def per_sample(self) -> bool:
        """Whether its samples' global RNGs are seeded each from (seed, epoch, index): else a
        fixed count draws from each worker's RNGs, as DataLoader's (held to DataLoader in
        ``test_differential_dataloader.py``), and its samples draw nothing here."""
        return (
            self.seed is not None
            or self.workers == "auto"
            or self.dispatch == "samples"
            or self.filled
        )

    @property
    def filled(self) -> bool:
        """Whether its batches are filled from made samples (``defer_after``): each epoch
        holds every planned sample once, in as many batches, and not the planned ones."""
        return self.defer and not self.iterable

    def kwargs(self, dataset: Any, *, workers: int | str | None = None) -> dict[str, Any]:
        inline = workers == 0
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.workers if workers is None else workers,
            "seed": self.seed,
        }
        if self.generator:
            kwargs["generator"] = torch.Generator().manual_seed(5)
        if self.keep:
            kwargs["collate_fn"] = identity
        if not self.iterable:
            kwargs["shuffle"] = self.shuffle and not self.sampler
            if self.sampler is not None:
                kwargs["sampler"] = _sampler(self.sampler, len(dataset))
            if inline and self.per_sample:
                kwargs["dispatch"] = "samples"  # without workers too, each sample seeded
            if not inline:
                kwargs["dispatch"] = self.dispatch
                if self.filled:
                    kwargs["defer_after"] = 0.0
                if self.cache:
                    kwargs["cache"] = drapps.Cache(memory="16MB", codec=self.codec)
        if not inline:
            kwargs["persistent_workers"] = self.persistent
            # Kills may land on one batch's worker at every attempt; a batch whose attempts
            # run out is an error by design (tests/test_loader_faults.py), not a loss.
            kwargs["max_attempts"] = 64
            if self.threads and not self.iterable and not self.cache:
                kwargs["backend"] = "thread"  # the sample cache keeps worker processes
        return kwargs


def runs() -> st.SearchStrategy[Run]:
    return st.builds(
        Run,
        n=st.integers(1, 24),
        payload=payloads(draws=RNGS, alternate=False),
        workers=st.sampled_from((1, 2, 3, "auto", "auto")),  # the default's events are its own
        seed=st.sampled_from((None, 0, 7)),
        batch_size=st.integers(1, 5),
        shuffle=st.booleans(),
        sampler=st.sampled_from(
            (None, None, "random", "replacement", "weighted", "tensor_keys", "numpy_keys")
        ),
        dispatch=st.sampled_from(("batches", "samples")),
        cache=st.booleans(),
        persistent=st.booleans(),
        iterable=st.booleans(),
        threads=st.booleans(),
        waits=st.booleans(),
        defer=st.sampled_from((False, False, False, True)),
        codec=st.sampled_from(("none", "auto")),
        held=st.booleans(),
        keep=st.sampled_from((False, False, True)),
        generator=st.booleans(),
    )


class TypedKeys(torch.utils.data.Sampler[Any]):
    """A permutation drawn from torch's RNG at ``iter()``, whose keys are 0-d int32 tensors
    (``"tensor_keys"``) or NumPy int16s (``"numpy_keys"``): a checkpoint must give them back
    as such, as ``__getitem__`` got them before it."""

    def __init__(self, kind: str, n: int) -> None:
        self.kind, self.n = kind, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        order = torch.randperm(self.n, dtype=torch.int32)
        return iter(order if self.kind == "tensor_keys" else order.numpy().astype(np.int16))


def _sampler(kind: str, n: int) -> Any:
    """A sampler drawing from torch's RNG: a permutation (of int keys, or typed ones:
    :class:`TypedKeys`), or keys drawn with replacement (as often as the dataset is long),
    the last key 20 times as likely as the others."""
    if kind == "random":
        return torch.utils.data.RandomSampler(range(n))
    if kind in ("tensor_keys", "numpy_keys"):
        return TypedKeys(kind, n)
    if kind == "replacement":
        return torch.utils.data.RandomSampler(range(n), replacement=True)
    return torch.utils.data.WeightedRandomSampler([1.0] * (n - 1) + [20.0], n)


def _seed_everything(value: int = 0) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def _pickled(obj: Any) -> Any:
    """``obj`` through pickle, with protocol 5: under the older ones NumPy pickles a
    big-endian array as native (the copy's dataset would not be the one it copied)."""
    return pickle.loads(pickle.dumps(obj, protocol=5))


def _waited(pid: int, timeout: float) -> int | None:
    """The exit status of child ``pid``, or None (and the child killed) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


class LoaderMachine(RuleBasedStateMachine):
    """One loader with workers, held to its reference after every event."""

    @initialize(case=runs())
    def start(self, case: Run) -> None:
        if case.keep and case.defer:  # batches filled from made samples are default_collate's
            case = Run(**{**case.__dict__, "defer": False})
        # After the line above: without defer, a fixed count draws from its workers' RNGs
        # (found by a campaign: the draws were kept for filled batches, then defer was off).
        if case.cache or case.held or not case.per_sample:  # dataset[i] kept: no draws then
            case = Run(**{**case.__dict__, "payload": without_draws(case.payload)})
        note(f"case = {case!r}")
        trail(f"case = {case!r}", new=True)
        self.case = case
        self.dataset = case.dataset()
        if case.iterable and case.workers == "auto":
            self.case = case = Run(**{**case.__dict__, "workers": 2})  # a stream is its workers'
        _seed_everything()
        self.reference = run(
            lambda: drapps.Loader(self.dataset, **case.kwargs(self.dataset, workers=0)), EPOCHS
        )
        if case.iterable or case.persistent:
            # A stream is each worker's shard, and without a seed persistent workers draw one
            # base seed for all epochs (a loader without workers draws one each): the
            # reference then has the workers, and no events.
            _seed_everything()
            self.reference = run(
                lambda: drapps.Loader(self.dataset, **case.kwargs(self.dataset)), EPOCHS
            )
        assume(not self.reference.failed)  # a sample the default collate cannot take
        self.leak_check = nothing_left()
        self.leak_check.__enter__()
        _seed_everything()
        self.loader = drapps.Loader(self.dataset, **case.kwargs(self.dataset))
        self.epoch, self.got = 0, []
        self.beside = 0  # epochs second iterators ran while the loop's was under way
        self.skipped_draw = False  # one of them was let go of with its order never drawn
        self.iterator: Any = iter(self.loader)
        self.exact = not case.filled  # False once batches are not the reference's
        self.resumed_epoch: int | None = None
        self.resized = False

    # ----------------------------------------------------------------------------- events

    @rule()
    @traced
    def take_a_batch(self) -> None:
        if self.epoch >= EPOCHS:
            return  # the run is over
        try:
            self.got.append(next(self.iterator))
        except StopIteration:
            self._epoch_ended()
            return
        # Wherever the loader made it (a worker process or thread, or the loop standing in
        # for them), the batch is the loop's own, as a worker process's is.
        assert_owned(Outcome(epochs=[self.got[-1:]]), self.dataset)
        assert_aligned(Outcome(epochs=[self.got[-1:]]))

    @precondition(lambda self: self.epoch < EPOCHS and not self.case.iterable)
    @rule(workers=st.integers(1, 3))
    @traced
    def resize(self, workers: int) -> None:
        self.loader.resize(workers)
        self.resized = True  # a count the user sets stays with workers

    @precondition(lambda self: self.epoch < EPOCHS and not self.case.iterable)
    @rule(which=st.integers(0, 7))
    @traced
    def kill_a_worker(self, which: int) -> None:
        pids = self.loader.stats().worker_pids
        if pids:
            with contextlib.suppress(ProcessLookupError):  # one that just retired
                os.kill(pids[which % len(pids)], signal.SIGKILL)

    @precondition(lambda self: self.epoch < EPOCHS and not self.case.iterable)
    @rule(threads=st.booleans())
    @traced
    def move_the_workers_between_processes_and_threads(self, threads: bool) -> None:
        """What the controller does under the default count (refused while the workers have
        not yet shown that the dataset draws from no global generator)."""
        dispatcher = getattr(self.loader._parts.engine, "dispatcher", None)
        if dispatcher is not None and dispatcher.pool.choosable:
            dispatcher.set_executor("threads" if threads else "processes")

    @precondition(lambda self: self.epoch < EPOCHS and not self.case.iterable)
    @rule(moves=st.lists(st.booleans(), min_size=1, max_size=4))
    @traced
    def move_between_the_loop_and_the_workers(self, moves: list[bool]) -> None:
        """What the default count does where batches cost less to make than to wait for: make
        them in the training process (True) or bring the workers back (False), a batch taken
        after each move (refused under a fixed count)."""
        engine = self.loader._parts.engine
        use_loop = getattr(engine, "use_loop", None)
        for on in moves if use_loop is not None else ():
            # Only within an epoch, as the rule moves: a loader resumed at an epoch's end has
            # none running until its next batch is asked for.
            running = engine._job is not None
            moved = use_loop(on)
            expected = self.case.workers == "auto" and not self.case.filled and not self.resized
            assert moved == (expected and running), f"use_loop({on}) -> {moved}"
            self.take_a_batch()

    @precondition(lambda self: self.epoch < EPOCHS)
    @rule(
        torch_seed=st.integers(1, 3),
        drop=st.booleans(),
        let_go=st.booleans(),
        how=st.sampled_from(("state_dict", "state_dict", "deepcopy", "pickle")),
        workers=st.sampled_from((None, None, 1, 2, 3, "auto")),
    )
    @traced
    def checkpoint_and_resume_in_a_new_loader(
        self,
        torch_seed: int,
        drop: bool,
        let_go: bool = False,
        how: str = "state_dict",
        workers: int | str | None = None,
    ) -> None:
        """Resume in a new loader; the old one closed, or dropped mid-epoch unclosed (its
        workers and memory must go with it). ``let_go``: the loop let go of its iterator
        before the checkpoint (it broke out of the epoch), which still holds the epoch.
        ``how``: through ``state_dict()`` as JSON, or a copy of the loader (which stands
        where the loader stood). ``workers``: the new loader's count, where it differs from
        the old one's (a job resumed on another machine): a map-style dataset's batches are
        the same for any count where each sample is seeded, and where its samples draw
        nothing."""
        if let_go:
            self.iterator = None
            gc.collect()
        state = json.loads(json.dumps(self.loader.state_dict()))
        copied = None
        if how != "state_dict":
            # torch's own copying fails for some datasets (a uint16 tensor pickled, a sparse
            # CSR one deep-copied, found by a campaign): DataLoader's copy fails alike.
            copy_of = copy.deepcopy if how == "deepcopy" else _pickled
            try:
                copy_of(self.dataset)
            except Exception as exc:
                with pytest.raises(type(exc)):
                    copy_of(self.loader)
            else:
                copied = copy_of(self.loader)
        if drop:
            del self.loader, self.iterator
            gc.collect()
        else:
            self.loader.close()
        _seed_everything(torch_seed)  # another process, another torch RNG
        if copied is not None:
            assert copied.state_dict() == state
            self.loader = copied
        else:
            if workers is not None and self._resumable_at(workers):
                self.case = replace(self.case, workers=workers)
            self.loader = drapps.Loader(self.dataset, **self.case.kwargs(self.dataset))
            self.loader.load_state_dict(state)
        self.iterator = iter(self.loader)
        self.resumed_epoch = self.epoch
        self.resized = False

    def _resumable_at(self, workers: int | str) -> bool:
        """Whether the reference holds for the case at another count: not for a stream or
        persistent workers (the reference has the case's own workers), nor for filled
        batches (not the planned ones), nor where seeding per sample would give way to the
        workers' own RNGs (``"auto"`` without a seed, resumed at a fixed count)."""
        case = self.case
        if case.iterable or case.persistent or case.filled:
            return False
        return replace(case, workers=workers).per_sample or not case.per_sample

    @precondition(lambda self: self.epoch < EPOCHS - 1 and self.got)
    @rule()
    @traced
    def start_the_next_epoch_midway(self) -> None:
        """A new ``iter(loader)`` mid-epoch: the next epoch, whole; the old one is over."""
        self._epoch_ended(abandoned=True)
        if self.case.iterable and self.case.persistent:
            # How far each persistent worker drew into the abandoned epoch is the timing's
            # (as under DataLoader): later epochs hold the same samples, in another order.
            self.exact = False

    @precondition(lambda self: self.epoch < EPOCHS - 1 and self.got)
    @rule()
    @traced
    def start_the_next_epoch_while_another_thread_takes(self) -> None:
        """A new ``iter(loader)`` while another thread may be inside the old iterator's
        ``next()``: that thread gets the old epoch's next batch (or, where workers hold its
        stream, the superseded error), never a batch of the new epoch, and the new epoch
        loses none."""
        old, epoch, position, exact = self.iterator, self.epoch, len(self.got), self.exact
        outcome: dict[str, Any] = {}

        def take() -> None:
            try:
                outcome["batch"] = next(old)
            except (RuntimeError, StopIteration) as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=take)
        thread.start()
        self.start_the_next_epoch_midway()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the superseded iterator's next() does not return"
        if "batch" in outcome and exact:
            expected = self.reference.epochs[epoch]
            assert position < len(expected), f"a batch past the end of epoch {epoch}"
            assert_equal(expected[position], outcome["batch"], f"epoch {epoch} batch {position}")
        elif "error" in outcome and isinstance(outcome["error"], RuntimeError):
            assert "superseded" in str(outcome["error"]), outcome["error"]

    @precondition(
        lambda self: (
            self.epoch + 1 + self.beside < EPOCHS
            and not (self.case.iterable and self.case.persistent)
            and not self.case.filled
        )
    )
    @rule(
        steps=st.lists(
            st.sampled_from(("second", "second", "loop", "kill", "resize", "fork")),
            min_size=1,
            max_size=8,
        )
    )
    @traced
    def take_from_a_second_iterator(self, steps: list[str]) -> None:
        """A second ``iter(loader)`` while the loop's is under way (``next(iter(loader))``
        inside the loop, ``zip(loader, loader)``), held through ``steps``: take a batch from
        it ("second": the next epoch's, as the reference's) or from the loop's ("loop": it
        goes on as it would have, into its next epoch past its end), SIGKILL a worker,
        resize, or fork a child that drops its copies and exits. Then the second is let go
        of, and the loop's goes on. A stream's iterators each have workers of their own
        (persistent stream workers supersede the older one), and its workers are neither
        killed nor resized (a stream's position is its workers')."""
        epoch = self.epoch + 1 + self.beside
        self.beside += 1
        if not self.got and self._drawn_at_first_batch():
            # The loop's iterator has drawn no order yet, and the second draws its own first,
            # as under DataLoader without workers: both orders are not the reference's, whose
            # epochs drew in turn (found by a campaign).
            self.exact = False
        if self._ends_with_a_draw():
            # The loop's shuffle draws once more from the loader's generator as its pass runs
            # out, where DataLoader's would (as its workers' prefetch, or without workers its
            # loop, reaches the end): a second iterator that draws its order before that draws
            # where the reference's, which ran each epoch whole, did not (found by a campaign).
            self.exact = False
        second = iter(self.loader)
        expected, taken, loops_epoch = self.reference.epochs[epoch], 0, self.epoch
        asked = False  # the second's order drawn (at its first next())
        for step in steps:
            if step == "second":
                batch, asked = next(second, None), True
                held_to_it = self.exact and not (self.skipped_draw or self._drawn_anew())
                if batch is not None and held_to_it:
                    where = f"epoch {epoch} batch {taken} (a second iterator)"
                    assert_equal(expected[taken], batch, where)
                taken += batch is not None
            elif step == "loop":
                self.take_a_batch()
                if not asked and self._drew_before_the_second(loops_epoch):
                    self.exact = False
                self.the_epoch_so_far_is_the_references()
            elif step == "fork":
                self.fork_a_child_that_drops_its_copies("iterator")
            elif self.case.iterable:
                continue
            elif step == "kill":
                self.kill_a_worker(0)
            else:
                self.resize(2)
        del second
        if "second" not in steps and self._drawn_at_first_batch():
            # Let go of before its first next(), the second iterator drew no order, as under
            # DataLoader without workers: the later epochs draw theirs where the reference's
            # drew one more first (found by a campaign), the loop's next one too where it
            # started while the second was held.
            if self.epoch == loops_epoch:
                self.skipped_draw = True
            else:
                self.exact = False

    @precondition(lambda self: self.epoch < EPOCHS)
    @rule(drops=st.sampled_from(("nothing", "batches", "iterator", "loader")))
    @traced
    def fork_a_child_that_drops_its_copies(self, drops: str) -> None:
        """A child forked mid-epoch (a helper process, another loader's worker) drops its
        copies of what the loop holds (``drops``: the batches; the iterator too; the loader
        too), collects, runs its exit handlers and exits. It exits at once and says nothing,
        and the parent's loader goes on as it was: the next batches are the reference's."""
        with tempfile.TemporaryFile() as said:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 0
                try:
                    os.dup2(said.fileno(), 2)
                    # A child that hangs says where: every thread's stack, then it exits
                    # (before the parent's wait gives up on it).
                    faulthandler.dump_traceback_later(50, exit=True)
                    if drops != "nothing":
                        self.got = []
                    if drops in ("iterator", "loader"):
                        self.iterator = None
                    if drops == "loader":
                        self.loader = None
                    gc.collect()
                    atexit._run_exitfuncs()
                except BaseException:
                    code = 1
                os._exit(code)
            status = _waited(pid, timeout=60)
            said.seek(0)
            text = said.read().decode(errors="replace")
        assert status is not None, f"a forked child that dropped its {drops} hung:\n{text}"
        assert status == 0 and not text, f"a forked child exited {status}, saying:\n{text}"

    def _drew_before_the_second(self, loops_epoch: int) -> bool:
        """Whether the loop's next epoch, started while a second iterator is held, drew its
        order before the second's: the reference's next epoch drew after it."""
        moved_on = self.epoch != loops_epoch and bool(self.got)
        return moved_on and self._drawn_at_first_batch()

    # ------------------------------------------------------------------------- the checks

    @invariant()
    def the_epoch_so_far_is_the_references(self) -> None:
        if not hasattr(self, "case") or self.epoch >= EPOCHS or not self.exact:
            return
        expected = self.reference.epochs[self.epoch]
        assert len(self.got) <= len(expected), f"{len(self.got)} batches of {len(expected)}"
        for b, batch in enumerate(self.got):
            assert_equal(expected[b], batch, f"epoch {self.epoch} batch {b}")

    def _epoch_ended(self, abandoned: bool = False) -> None:
        expected = self.reference.epochs[self.epoch]
        if not abandoned:
            delivered = sorted(i for batch in self.got for i in batch_indices(batch))
            planned = sorted(i for batch in expected for i in batch_indices(batch))
            if self.exact or self.case.filled:
                assert len(self.got) == len(expected), f"{len(self.got)} of {len(expected)}"
            if not self.exact and not self.case.sampler:  # a sampler may draw others
                assert delivered == planned, f"epoch {self.epoch}: {delivered} != {planned}"
            if self.case.filled and self.resumed_epoch != self.epoch:
                self._replay_filled_epoch()
        if self._drawn_anew() or self.skipped_draw or (abandoned and self._ends_with_a_draw()):
            self.exact = False
        self.epoch += 1 + self.beside
        self.got, self.beside = [], 0
        if self.epoch < EPOCHS:
            self.iterator = iter(self.loader)

    def _drawn_at_first_batch(self) -> bool:
        """Whether each epoch's order is drawn at its iterator's first ``next()``, from torch's
        RNG: a sampler's, or a shuffle without a seed, without workers or under "auto"."""
        drawn = bool(self.case.sampler) or (self.case.seed is None and self.case.shuffle)
        return drawn and self.case.workers in (0, "auto") and not self.case.iterable

    def _ends_with_a_draw(self) -> bool:
        """Whether the shuffle draws once more from the loader's generator as its pass runs
        out (torch's ``RandomSampler``), at the ``next()`` where DataLoader's would: an epoch
        abandoned before it leaves the generator behind the reference's, which ran each epoch
        whole, so the later orders are not the reference's (they are DataLoader's: found by a
        campaign; ``tests/test_compat.py`` holds that draw to DataLoader's)."""
        case = self.case
        shuffled = case.shuffle and case.seed is None and not case.sampler
        return case.generator and shuffled and not case.iterable

    def _drawn_anew(self) -> bool:
        """Whether the epochs after a resumed one are drawn anew: a resumed loader without a
        seed or a generator, or with a sampler that draws from torch's RNG, draws them from
        the new process's torch RNG (as a new DataLoader would). A generator's state is in
        the checkpoint: the later epochs go on drawing from it as the reference's did."""
        drawn = (self.case.seed is None and not self.case.generator) or bool(self.case.sampler)
        return drawn and self.resumed_epoch is not None

    def _replay_filled_epoch(self) -> None:
        """Batches filled from made samples replay bit for bit as a ``batch_sampler`` of the
        keys the epoch delivered (with the same seed and epoch), without workers."""
        if self.case.seed is None or self.case.cache:
            return  # a base seed drawn per epoch; dataset[i] made once and kept
        keys = self.iterator.delivered_keys
        assert len(keys) == len(self.got), f"{len(keys)} keys for {len(self.got)} batches"
        replay = drapps.Loader(self.dataset, batch_sampler=keys, seed=self.case.seed, num_workers=0)
        replay.set_epoch(self.epoch)
        with replay:
            for b, (expected, got) in enumerate(zip(replay, self.got, strict=True)):
                assert_equal(expected, got, f"epoch {self.epoch} batch {b} (replayed)")

    def teardown(self) -> None:
        if hasattr(self, "loader"):
            self.loader.close()
            del self.loader, self.iterator, self.got
            self.leak_check.__exit__(None, None, None)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dispatch", ["batches", "samples"])
def test_moves_between_the_loop_and_the_workers_are_held_to_the_reference(
    dispatch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One walk, written out, through what random ones seldom combine: into the training
    process and back, and into it again, within an epoch and across its end, with a
    checkpoint resumed between (each move followed by a batch)."""
    case = Run(
        n=23,
        payload=Payload(leaf=Leaf(kind="tensor"), draw="torch"),
        workers="auto",
        batch_size=2,
        shuffle=True,
        dispatch=dispatch,
    )
    take, move = LoaderMachine.take_a_batch, LoaderMachine.move_between_the_loop_and_the_workers
    machine = walk(
        case,
        [
            take,
            lambda m: move(m, [True, True, False, True]),
            lambda m: move(m, [False, True]),
            take,
            lambda m: m.checkpoint_and_resume_in_a_new_loader(2, drop=False),
            lambda m: move(m, [True, False, False]),
            *[take] * 10,  # past the epoch's end
            lambda m: move(m, [True, False, True]),
            *[take] * 14,
        ],
        monkeypatch,
    )
    assert machine.epoch >= 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("sampler", "workers"), [("tensor_keys", 2), ("numpy_keys", "auto")])
def test_a_resumed_epoch_gives_the_samplers_keys_as_it_gave_them(
    sampler: str, workers: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampler whose keys are 0-d tensors or NumPy integers, resumed mid-epoch in a new
    loader: the resumed batches reach ``__getitem__`` with the sampler's keys, as the
    reference's do (the samples hold the key, so its type shows in the batch)."""
    case = Run(
        n=9,
        payload=Payload(leaf=Leaf(kind="python", dtype="int")),
        workers=workers,
        batch_size=2,
        sampler=sampler,
        keep=True,
    )
    take = LoaderMachine.take_a_batch
    resume = LoaderMachine.checkpoint_and_resume_in_a_new_loader
    walk(case, [take, take, lambda m: resume(m, 3, drop=False), *[take] * 8], monkeypatch)


@pytest.mark.parametrize(
    ("before", "after", "threads"),
    [(2, 3, False), (3, 1, False), (2, "auto", False), ("auto", 2, False), (1, 3, True)],
)
def test_a_checkpoint_resumes_at_another_worker_count(
    before: int | str, after: int | str, threads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job resumed on a machine with another count (a seed given, each sample's torch draws
    seeded from it): the resumed epoch and the next are the reference's, batch for batch, and
    a resize and a killed worker after it change nothing. On threads the samples draw nothing
    (a dataset that draws from torch's generator keeps processes)."""
    case = Run(
        n=17,
        payload=Payload(leaf=Leaf(kind="tensor"), draw=None if threads else "torch"),
        workers=before,
        seed=7,
        batch_size=3,
        shuffle=True,
        threads=threads,
    )
    take = LoaderMachine.take_a_batch
    resume = LoaderMachine.checkpoint_and_resume_in_a_new_loader
    steps = [take, take, lambda m: resume(m, 2, drop=False, workers=after), take]
    kill = [lambda m: m.kill_a_worker(0)] if not threads else []
    machine = walk(case, [*steps, lambda m: m.resize(2), *kill, *[take] * 12], monkeypatch)
    assert machine.case.workers == after
    assert machine.epoch == 2 and machine.exact


@pytest.mark.timeout(600)
def test_a_worker_killed_with_tensor_keys_leaves_no_descriptor_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a campaign: a sampler's tensor keys reached the workers by descriptor,
    through multiprocessing's resource sharer, which kept its duplicate open in the
    training process where the worker was killed before it took it (most walks)."""
    case = Run(
        n=4,
        payload=Payload(leaf=Leaf(kind="tensor", dtype="bool", shape=(2, 3))),
        workers=1,
        sampler="tensor_keys",
    )
    kill, take = (lambda m: m.kill_a_worker(0)), LoaderMachine.take_a_batch
    for _ in range(3):
        walk(case, [kill, take, LoaderMachine.start_the_next_epoch_midway], monkeypatch)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_started_in_a_killed_ones_place_takes_its_id(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a probe: the worker started in place of a killed one whose pipe had broken
    but which was not yet reaped took a new id, 2 of ``num_workers`` 2, in that epoch and
    (kept) the next. Every sample the harness makes checks its id against the count
    (``ids_below_the_count``), so a campaign finds it too."""
    case = Run(
        n=8,
        payload=Payload(leaf=Leaf(kind="python", dtype="int")),
        workers=2,
        persistent=persistent,
    )
    kill, take = (lambda m: m.kill_a_worker(1)), LoaderMachine.take_a_batch
    for _ in range(3):
        walk(case, [take, kill, *[take] * 12], monkeypatch)


def test_a_pickled_copy_of_a_dataset_that_holds_big_endian_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a campaign: the copy went on with native arrays where the reference has
    big-endian ones. NumPy pickles a big-endian array as native under pickle's default
    protocol (4; 5 keeps its byte order), so a dataset that holds them changes in any
    pickled copy, DataLoader's too: the harness copies with protocol 5."""
    big_endian = Payload(leaf=Leaf(kind="array", dtype=">i4", layout="contiguous", shape=(3,)))
    case = Run(
        n=5,
        payload=big_endian,
        workers=2,
        held=True,
        keep=True,
    )
    take = LoaderMachine.take_a_batch
    resume = LoaderMachine.checkpoint_and_resume_in_a_new_loader
    walk(case, [take, lambda m: resume(m, 1, drop=False, how="pickle"), take, take], monkeypatch)


def walk(
    case: Run, steps: list[Callable[[LoaderMachine], Any]], monkeypatch: pytest.MonkeyPatch
) -> LoaderMachine:
    """A walk written out, outside Hypothesis' run: ``case`` started, each step taken and the
    epoch so far held to the reference after it, then torn down (nothing left behind)."""
    monkeypatch.setitem(globals(), "note", print)
    machine = LoaderMachine()
    machine.start(case)
    try:
        for step in steps:
            step(machine)
            machine.the_epoch_so_far_is_the_references()
    finally:
        machine.teardown()
    return machine


@pytest.mark.parametrize("workers", [0, 1, "auto"])
def test_a_second_iterator_before_the_loops_end_draw_is_not_held_to_the_whole_reference(
    workers: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a campaign: the loop's shuffle from the loader's generator has its end draw
    still to make (as under DataLoader, whose order drapps' is there: tests/test_compat.py),
    and a second iterator draws its order before it, so the second's epoch is not the
    reference's next one. The samples are still held: every one once."""
    payload = Payload(leaf=Leaf(kind="tensor", dtype="bool"))
    case = Run(n=3, payload=payload, workers=workers, batch_size=1, shuffle=True, generator=True)
    second = functools.partial(LoaderMachine.take_from_a_second_iterator, steps=["second"])
    machine = walk(case, [LoaderMachine.take_a_batch, second], monkeypatch)
    assert not machine.exact


@pytest.mark.parametrize("workers", [0, 1, "auto"])
def test_an_epoch_abandoned_before_its_shuffles_end_draw_is_not_held_to_the_whole_reference(
    workers: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a campaign: a shuffle from the loader's generator draws once more as its pass
    runs out, where DataLoader's would; an epoch abandoned before that leaves the generator
    behind the reference's, so the next epoch's order is DataLoader's, not the reference's.
    The samples are still held: every one once."""
    payload = Payload(leaf=Leaf(kind="python", dtype="int"))
    case = Run(n=3, payload=payload, workers=workers, batch_size=1, shuffle=True, generator=True)
    take = LoaderMachine.take_a_batch
    machine = walk(case, [take, LoaderMachine.start_the_next_epoch_midway, take], monkeypatch)
    assert not machine.exact


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_a_copy_fails_as_dataloaders_where_the_dataset_cannot_be_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a campaign: a dataset that keeps a sparse CSR tensor cannot be deep-copied
    (torch refuses it), so neither can its loader, as DataLoader's cannot; the loader it
    was to copy goes on, and nothing is left behind."""
    csr = Payload(leaf=Leaf(kind="tensor", dtype="bool", layout="sparse_csr", shape=(2, 3)))
    case = Run(
        n=4,
        payload=csr,
        workers=1,
        held=True,
        keep=True,
    )
    take = LoaderMachine.take_a_batch
    copied = walk(
        case,
        [
            take,
            lambda m: m.checkpoint_and_resume_in_a_new_loader(1, drop=False, how="deepcopy"),
            *[take] * 4,
        ],
        monkeypatch,
    )
    assert copied.epoch == 1


@pytest.mark.timeout(600)
def test_a_loader_through_events_is_held_to_its_inline_reference() -> None:
    fast = settings(FAST, max_examples=max(1, FAST_EXAMPLES // 2), stateful_step_count=12)
    run_state_machine_as_test(LoaderMachine, settings=fast)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_campaign_of_events() -> None:
    budget = Budget("Campaign of events")

    def run_some(seeded: int, examples: int) -> None:
        machine = seed(seeded)(lambda: LoaderMachine())
        # max_examples: the run's own length, not DRAPPS_DIFF_EXAMPLES (the campaign's)
        every = settings(campaign(examples, stateful_step_count=30), max_examples=examples)
        run_state_machine_as_test(machine, settings=every)

    in_chunks(budget, 75, 5, run_some)  # runs of 5: the budget is checked every 5 examples


@pytest.mark.timeout(600)
@pytest.mark.parametrize("iterable", [False, True])
def test_a_forked_child_that_drops_its_copies_leaves_the_loader_to_the_loop(
    iterable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a probe: a child forked mid-epoch that dropped its copy of a stream's
    iterator stopped the parent's stream workers, and the loop's next batch failed on a
    broken pipe; one that exited with a second iterator held stopped the first epoch's."""
    case = Run(
        n=12,
        payload=Payload(leaf=Leaf(kind="python", dtype="int")),
        workers=2,
        batch_size=2,
        iterable=iterable,
    )
    take, fork = LoaderMachine.take_a_batch, LoaderMachine.fork_a_child_that_drops_its_copies
    beside = LoaderMachine.take_from_a_second_iterator
    steps = [
        take,
        *(lambda m, drops=drops: fork(m, drops) for drops in ("nothing", "batches", "iterator")),
        take,
        lambda m: beside(m, ["second", "fork", "loop", "fork", "second"]),
        lambda m: fork(m, "loader"),
        *[take] * 12,
    ]
    assert walk(case, steps, monkeypatch).epoch == 3


@pytest.mark.timeout(600)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_second_iterator_let_go_of_after_the_loops_epoch_ended_is_held_to_the_reference(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a campaign: the loop's epoch ends while a second iterator that never took a
    batch is held, and the loop's next epoch draws its order after it, from torch's RNG,
    where the reference's next epoch drew after the second's. Under DataLoader without
    workers the second draws nothing: the loop's next epoch is not the reference's, and
    each epoch still holds every sample once."""
    case = Run(
        n=9,
        payload=Payload(leaf=Leaf(kind="tensor", dtype="bool", shape=(2, 3))),
        workers="auto",
        batch_size=3,
        shuffle=True,
        persistent=persistent,
    )
    take = LoaderMachine.take_a_batch
    machine = walk(
        case,
        [
            take,
            lambda m: m.move_between_the_loop_and_the_workers([False]),
            lambda m: m.take_from_a_second_iterator(["loop", "loop", "loop"]),
            *[take] * 4,
        ],
        monkeypatch,
    )
    assert machine.epoch == 3


@pytest.mark.timeout(600)
def test_a_second_iterator_after_one_let_go_of_untaken_is_held_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a campaign: a second iterator let go of before its first batch drew no order,
    so the next one draws the order the reference's epoch before it drew: neither is held
    to the reference's epoch of its number, and each epoch still holds every sample once."""
    case = Run(
        n=24,
        payload=Payload(leaf=Leaf(kind="tensor", dtype="bool", shape=(2, 3))),
        workers="auto",
        shuffle=True,
        persistent=True,
    )
    take = LoaderMachine.take_a_batch
    machine = walk(
        case,
        [
            take,
            lambda m: m.take_from_a_second_iterator(["loop"]),
            lambda m: m.take_from_a_second_iterator(["second", "second"]),
            *[take] * 23,  # to the end of the loop's epoch
        ],
        monkeypatch,
    )
    assert machine.epoch == 3
