"""The dispatcher: one thread that owns the worker pool and feeds the reorder buffer.

Every tick it applies commands (new epoch, resize, prefetch depth, stop), keeps the pool at its
target size, hands out tasks while the prefetch depth and memory budget allow, and waits for the
pool's replies and exits at once (``WorkerPool.poll``). A worker that dies or overruns
``timeout`` is reaped and its unanswered tasks go back to the front of the queue; results are
deduplicated by batch id in the reorder buffer, so every batch is delivered exactly once.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from drapps.runtime.admission import Admission
from drapps.runtime.collector import Collector
from drapps.runtime.config import PoolSettings
from drapps.runtime.cost import SampleCosts
from drapps.runtime.dealing import Dealer
from drapps.runtime.errors import WorkerTimeoutError, sample_path
from drapps.runtime.hedging import TICK_S, Hedging
from drapps.runtime.mailbox import Mailbox
from drapps.runtime.messages import (
    BatchMade,
    BatchTask,
    SlabsFreed,
    WorkerFatal,
    WorkerReply,
    task_keys,
)
from drapps.runtime.plan import EpochPlan
from drapps.runtime.pool import Reply, Task, Worker, WorkerPool
from drapps.runtime.process_pool import ProcessPool
from drapps.runtime.reorder import Entry, ReorderBuffer
from drapps.runtime.retries import Retries
from drapps.runtime.schedule import Schedule, Work
from drapps.runtime.worker import BatchRecipe, splittable

logger = logging.getLogger(__name__)

_WATCH_EVERY = 4  # with light-tailed costs, batches per one whose sample costs are learnt
_TAIL_DEPTH = 4  # the most a heavy tail deepens prefetch, in multiples of the depth


LOW_NICENESS = 10
"""How much nicer than the training process workers at ``"low"`` priority run: the scheduler
weighs a process 10 nicer at about a tenth, so a CPU-bound training loop is served first."""


class Dispatcher:
    """Runs the worker pool for a loader (started lazily, stopped by :meth:`shutdown`)."""

    def __init__(
        self,
        recipe: BatchRecipe,
        settings: PoolSettings,
        *,
        finish: Callable[[Any], Any] | None = None,
        pool: WorkerPool | None = None,
        split: Any = None,
    ) -> None:
        """
        Args:
            recipe: what a batch is made of, sent to every worker.
            settings: how the pool runs (counts, budget, timeout, dealing, dispatch).
            finish: applied to each batch in this thread as it arrives (e.g. pinning it), so
                the training loop does not pay for it.
            pool: the workers (default: a :class:`ProcessPool` of ``recipe`` in the settings'
                context); the dispatcher owns it from here and shuts it down.
            split: with a Pipeline transform, the split point to make batches with.
        """
        self.session = f"{os.getpid()}_{secrets.token_hex(4)}"
        # A loop that starts waiting wakes the thread: filled batches have a deadline.
        defer_after = settings.defer_after
        on_wait = self._wake_soon if defer_after is not None else None
        self.buffer = ReorderBuffer(on_consumed=self._wake_soon, on_wait=on_wait)
        self.pool = pool if pool is not None else ProcessPool(recipe, settings.context)
        self._recipe = recipe
        self.costs = SampleCosts(_length(recipe.dataset), _paths(recipe.dataset))
        self._deepen = settings.deepen_for_tails
        self.schedule = Schedule(
            self.costs,
            mode=settings.dispatch if defer_after is None else "samples",
            lookahead=settings.lookahead,
            splittable=splittable(recipe),
            fifo_batches=settings.deal != "least_loaded",
            always_parts=defer_after is not None,
        )
        self._on_error = recipe.on_error
        self._target = settings.workers
        self.priority: str | None = None
        """The workers' CPU priority, where the pool can set it."""
        self._prefetch = settings.prefetch
        self._split = split
        self.dealer = Dealer(settings.deal)
        # A fixed count's samples drawing on from each worker's own global RNGs, as
        # DataLoader's: each worker makes its tasks in the order it was dealt them.
        self._draws_on = not recipe.reseed and settings.deal == "round_robin"
        self._idle = False
        self._per_worker = settings.prefetch_per_worker
        self._finish = finish
        self.admission = Admission(settings.memory_budget)
        self.retries = Retries(settings.max_attempts, settings.timeout)
        self._lock = threading.Lock()  # the generation count
        self.mailbox = Mailbox(f"drapps-dispatcher-{self.session}", self._run, self._set)
        # Epoch state, owned by the dispatcher thread.
        self._plan: EpochPlan | None = None
        self._generation = 0
        self._generation_now = 0
        self._in_flight: dict[tuple[int, int | None], Worker] = {}
        self._replies = 0
        # Wall seconds a task takes per second of its samples' own cost: above 1 with more
        # busy workers than cores (costs leave out the time a worker waited for a core).
        self.hedging = Hedging(self.costs)
        # Counters read by snapshot().
        self.counters: dict[str, float] = {
            "worker_restarts": 0,
            "fetch_s": 0.0,
            "transform_s": 0.0,
            "collate_s": 0.0,
            "transport_s": 0.0,
            "assemble_s": 0.0,
        }
        self.latencies: deque[tuple[float, float]] = deque(maxlen=4096)
        """(arrival time, seconds from dispatch to arrival) of recent batches."""
        self.collector = Collector(
            recipe, self.admission, self.buffer, finish, defer_after, self.counters,
            self.latencies,
        )  # fmt: skip

    # ----------------------------------------------------------------- calls from other threads

    def start_epoch(self, plan: EpochPlan, start: int, *, fresh_workers: bool = False) -> int:
        """Begin delivering batches ``start..`` of ``plan``; returns the epoch's generation.

        ``fresh_workers`` replaces every worker process first (DataLoader's
        ``persistent_workers=False``: each epoch's workers see the dataset as it is now).
        """
        with self._lock:
            self._generation += 1
            generation = self._generation
        left_at = self.buffer.next_id  # where the loop left the previous epoch
        # The previous epoch's held batches are dropped here, outside the buffer's lock.
        self.buffer.reset(generation, start, len(plan))
        self.pool.prepare(fresh_workers)  # here, where DataLoader starts its workers
        message = (generation, plan, start, fresh_workers, left_at)
        self.mailbox.post("epoch", message, wait_applied=False)
        return generation

    def stop_workers(self, generation: int) -> None:
        """The epoch ``generation`` is over and its workers are not kept (DataLoader's
        ``persistent_workers=False``): let them exit now; the next epoch starts new ones."""
        self.mailbox.post("idle", generation, wait_applied=False)

    def let_go_workers(self, generation: int) -> None:
        """:meth:`stop_workers`, from the ``__del__`` of an epoch the loop let go of before its
        end (:meth:`Mailbox.post_from_finalizer`: it never waits for the mailbox's lock)."""
        self.mailbox.post_from_finalizer("let_go", generation)

    def resize(self, workers: int) -> None:
        """Set the worker count; returns once the dispatcher has acted on it."""
        self.mailbox.post("resize", workers, wait_applied=True)

    def set_split(self, split: Any) -> None:
        """Make batches dispatched from now on with the transform pipeline's ops before
        ``split`` (batches already in flight keep the split they were sent with)."""
        self.mailbox.post("split", split, wait_applied=True)

    def set_executor(self, executor: str) -> None:
        """Start new workers as ``executor`` ("processes" or "threads") where the pool can
        (:meth:`WorkerPool.use`); returns once the dispatcher has acted on it."""
        self.mailbox.post("executor", executor, wait_applied=True)

    def set_priority(self, priority: str) -> bool:
        """Run the workers at ``"normal"`` CPU priority (the training process's niceness,
        which they inherit) or ``"low"`` (``LOW_NICENESS`` above it); returns whether the pool
        can (worker processes can, Ray actors cannot)."""
        niceness = os.getpriority(os.PRIO_PROCESS, 0)
        able = self.pool.set_priority(niceness + (LOW_NICENESS if priority == "low" else 0))
        self.priority = priority if able else None
        return able

    def set_lookahead(self, lookahead: int | None) -> None:
        """Set how many batches past the next one may have work started early (None: twice
        the prefetch depth)."""
        self.mailbox.post("lookahead", lookahead, wait_applied=True)

    def set_prefetch(self, depth: int | None) -> None:
        """Set the prefetch depth (None: twice the worker count)."""
        self.mailbox.post("prefetch", depth, wait_applied=True)

    @property
    def target_workers(self) -> int:
        return self._target

    @property
    def prefetch_depth(self) -> int:
        depth = self._prefetch
        if depth is None:
            depth = max(1, self._per_worker * self._target)
        if self._deepen and self.schedule.heavy_tailed():
            interval = self.costs.mean * self.schedule.batch_len / max(1, self._target)
            if interval > 0:
                depth += min(math.ceil(self.costs.p99 / interval), _TAIL_DEPTH * depth)
        return depth

    def batch_bytes(self) -> int:
        """Bytes of the largest batch received so far (0 before the first)."""
        return self.admission.batch_bytes

    def alive(self) -> bool:
        thread = self.mailbox.thread
        return thread is not None and thread.is_alive()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and every worker; remove our shared memory. Idempotent."""
        if not self.mailbox.stop():
            return
        thread = self.mailbox.thread
        self.mailbox.wake()
        if thread is not None and thread is not threading.current_thread():
            waited_s = timeout_s + self.pool.exit_wait_s()
            thread.join(timeout=waited_s)
            if thread.is_alive():
                logger.warning("drapps dispatcher did not stop in %.0fs; killing workers", waited_s)
                for worker in list(self.pool.workers):
                    self.pool.kill(worker, wait_s=0.0)
        if thread is None or not thread.is_alive():
            self._release()

    # ----------------------------------------------------------------------------- internals

    def _wake_soon(self) -> None:
        self.mailbox.wake()

    def _release(self) -> None:
        if not self.mailbox.close():
            return
        self.admission.recycler.close()  # the workers stop: their slabs go with them
        self.pool.shutdown()
        self.buffer.fail(RuntimeError("this drapps.Loader is closed"))
        # Samples of batches made in part, or waiting to fill one, map their parts' slabs.
        self.collector.close()

    def _run(self) -> None:
        try:
            while not self.mailbox.stopped:
                self.mailbox.apply_all()
                self._keep_pool_size()
                self._dispatch()
                self._wait_and_receive()
                self.collector.fill_ready(self._generation_now, self._split)
                self._send_releases()
                self._enforce_timeout()
        except BaseException as exc:
            logger.exception("drapps dispatcher failed")
            failure = RuntimeError(f"drapps dispatcher failed: {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            self.buffer.fail(failure)
        finally:
            self._release()
            self.mailbox.finished()

    def _set(self, name: str, value: Any) -> None:
        if name == "epoch":
            self._idle = False
            generation, plan, start, fresh_workers, left_at = value
            if not fresh_workers:
                self._send_what_dataloader_sent(left_at)
            self._generation_now, self._plan = generation, plan
            self.retries.reset(self._plan, start)
            self._in_flight.clear()
            self.admission.reset(self._plan, start)
            self.hedging.reset(self._plan, start)
            self.schedule.reset(self._plan, start)
            self.collector.reset(self._plan, start)
            if fresh_workers:
                for worker in list(self.pool.workers):
                    self.pool.kill(worker)
                    self._reap(worker)
        elif name == "resize":
            self._target = value
        elif name == "prefetch":
            self._prefetch = value
        elif name == "split":
            self._split = value
        elif name == "executor":
            self.pool.use(value)
        elif name == "lookahead":
            self.schedule.set_lookahead(value)
        elif (
            name in ("idle", "let_go")
            # Not once a newer epoch has begun (its iter() may come before this is applied):
            # its zygote, made at that iter(), and its batches are not this one's to let go.
            and value == self._generation_now == self._generation
            and not self._idle
        ):
            self._idle = True  # until the next epoch: no worker is kept or started
            for worker in self.pool.live() + self.pool.parked():
                self.pool.retire(worker)
            self.pool.idle()
            if name == "let_go":  # the loop let go of the epoch: what was made ahead goes
                dropped = self.buffer.let_go(value)
                del dropped

    def _send_what_dataloader_sent(self, left_at: int) -> None:
        """An epoch left before its end, its workers kept for the next (persistent workers):
        a fixed count's workers, whose samples draw on from their own global RNGs, make the
        rest of what DataLoader would have sent them of it by now, each batch to the worker
        it deals it to: every batch up to ``left_at`` (the one the loop would have taken next)
        plus the prefetch depth. Their draws then leave each worker's RNGs where DataLoader's
        are as the next epoch starts; the batches, an older generation's, are dropped."""
        plan = self._plan
        if plan is None or not self._draws_on:
            return
        if self.schedule.cutting:
            return  # batches made in parts: no worker holds DataLoader's share of them
        self._keep_pool_size()  # the loop may have left before this thread started them
        dealt = {worker.slot: worker for worker in self.pool.live()}
        now = time.monotonic()
        for batch_id in range(
            self.schedule.frontier, min(len(plan), left_at + self.prefetch_depth)
        ):
            worker = dealt.get(self.dealer.round_robin_slot(batch_id, self._target))
            if worker is None:
                continue  # being replaced: a new worker's RNGs start afresh
            task = Task(
                self._generation_now, plan.epoch, batch_id, plan.batch(batch_id), now, self._split
            )
            worker.assigned.append(task)
            self.pool.send(worker, self._task_message(task, None))

    def _keep_pool_size(self) -> None:
        if not self._idle:  # until the next epoch, no worker is kept or started
            self.pool.keep_size(self._target, self._plan.seed if self._plan is not None else 0)

    def _hedge(self) -> None:
        """Send the copies of overdue parts that :class:`Hedging` asks for."""
        if self._plan is None:
            return
        copies = self.hedging.copies(
            head=self.buffer.next_id,
            waiting=self.buffer.waiting_s() is not None,
            cut=self.collector.partial,
            in_flight=self._in_flight,
            live=self.pool.live(),
        )
        for spare, copy in copies:
            self.pool.send(spare, self._task_message(copy, copy.part))

    def _send_releases(self) -> None:
        """Tell each worker which of its slabs the training process has let go of."""
        notices = self.admission.recycler.drain()
        if not notices:
            return
        for worker in self.pool.workers:
            released = notices.get(worker.wid)
            if released and not worker.broken:
                self.pool.send(worker, SlabsFreed(released))

    def _dispatch(self) -> None:
        plan = self._plan
        if self.buffer.generation != self._generation_now:
            # A new epoch has begun and its command is not applied yet: the buffer is already
            # the new epoch's, and would let the old plan's batches open.
            return
        self.schedule.samples_at_once = self.pool.sample_threads()
        if plan is not None and self.schedule.cutting:
            self.schedule.note_wait(self.buffer.waited_s(), time.monotonic())
            self._hedge()
        depth = self.prefetch_depth
        head = ready = 0  # the buffer's, read with its generation at each step below

        def may_open(batch_id: int) -> bool:
            pooled = self.collector.pooled_batches(self.schedule.batch_len)
            return self.admission.may_open(
                batch_id, depth, head=head, ready=ready,
                pooled=pooled, workers=len(self.pool.live()),
            )  # fmt: skip

        while plan is not None:
            generation, head, ready = self.buffer.view()
            if generation != self._generation_now:
                return  # the loop began the next epoch during this pass (as above)
            cutting = self.schedule.cutting
            candidates = [
                w
                for w in self.pool.live()
                if self.admission.may_queue(w, cutting=cutting, costs=self.costs)
                and not self._owes_older(w)
            ]
            if not candidates:
                return
            live = len(self.pool.live())
            work = self.schedule.peek(head, live, depth, may_open)
            if work is None:
                return
            retrying = self.schedule.retrying(work)
            worker = self.dealer.choose(work, candidates, self.pool.live(), self._target, retrying)
            if worker is None:
                return
            parts = [] if retrying else self.schedule.parts_of(work.batch_id)
            self.schedule.take(work)
            batch_id = work.batch_id
            if self._made_already(work):
                continue  # already delivered or held: a late duplicate retry
            indices = plan.batch(batch_id)
            now = time.monotonic()
            if batch_id not in self.admission.open:
                self.admission.open.add(batch_id)
                if work.part is not None:
                    self.collector.open(batch_id, indices, parts, self._split, now)
            split = self._split
            if work.part is not None:
                indices = [indices[p] for p in work.positions]
                split = self.collector.partial[batch_id].split  # every part is made with one split
            task = Task(self._generation_now, plan.epoch, batch_id, indices, now, split, work)
            worker.assigned.append(task)
            self._in_flight[batch_id, work.part] = worker
            # A failed send shows as the worker's exit.
            self.pool.send(worker, self._task_message(task, work.part))

    def _owes_older(self, worker: Worker) -> bool:
        """Whether ``worker`` has an older epoch's tasks to make first, where its samples draw
        on from its RNGs: a worker takes the newest epoch's tasks first
        (:func:`~drapps.runtime.inbox.urgency`), and DataLoader's make theirs as dealt."""
        generation = self._generation_now
        return self._draws_on and any(t.generation != generation for t in worker.assigned)

    def _task_message(self, task: Task, part: int | None) -> BatchTask:
        """What a worker is sent to make ``task`` (part ``part`` of its batch, or all), with
        as many samples at once as this dispatch pass found (``Schedule.samples_at_once``)."""
        assert self._plan is not None
        repeats = self._plan.repeats_of(task.batch_id)
        if repeats is not None and task.work is not None and part is not None:
            repeats = tuple(repeats[p] for p in task.work.positions)
        return BatchTask(
            task.generation, self._plan.seed, task.epoch, task.batch_id, task_keys(task.indices),
            self._target, task.split, part, self.schedule.samples_at_once, repeats,
        )  # fmt: skip

    def _wait_and_receive(self) -> None:
        timeout = self._wait_timeout()
        before = time.monotonic()
        polled = self.pool.poll(timeout, self.mailbox.wake_fd)
        overrun_s = time.monotonic() - before - timeout
        if self.retries.credit_pause(self.pool.workers, overrun_s):
            logger.info(
                "the loader's process was paused for %.1fs; workers' clocks credited", overrun_s
            )
        if polled.woke:
            self.mailbox.woken()
        self._on_replies(polled.replies)
        for worker in polled.exited:
            if worker in self.pool.workers:
                self._on_exit(worker, "died")

    def _wait_timeout(self) -> float:
        tick = TICK_S
        waited = self.buffer.waiting_s()
        defer_after = self.collector.defer_after
        if self.collector.fill is not None and defer_after is not None and waited is not None:
            tick = max(0.001, min(tick, defer_after - waited))  # to fill it on time
        if waited is not None and self.schedule.cutting:
            tick = max(
                0.001, min(tick, self.hedging.next_look_s(self.buffer.next_id, self._in_flight))
            )
        return self.retries.wait_s(self.pool.workers, tick)

    def _on_replies(self, replies: list[Reply]) -> None:
        for worker, reply in replies:
            self._on_reply(worker, reply)

    def _on_reply(self, worker: Worker, reply: WorkerReply) -> None:
        if isinstance(reply, WorkerFatal):  # the worker's last words before it dies
            worker.last_error = reply.traceback.strip().splitlines()[-1]
            return
        generation, batch_id, part = reply.generation, reply.batch_id, reply.part
        made = reply if isinstance(reply, BatchMade) else None
        if made is not None:
            if made.watched:
                self.pool.note_draws(made.watched, made.drew, made.python_s, made.measured_s)
            self.pool.note_work(worker, made.costs, made.cpu_s, made.alone)
        now = time.monotonic()
        task = next(
            (
                t
                for t in worker.assigned
                if (t.generation, t.batch_id, t.part) == (generation, batch_id, part)
            ),
            None,
        )
        if task is not None:
            if made is not None and worker.assigned[0] is task:
                wall_s = now - max(task.assigned_at, worker.last_progress)
                self.hedging.note_stretch(wall_s, made.costs)
                self.retries.limit.note(wall_s)
            worker.assigned.remove(task)
        worker.last_progress = now
        current = generation == self._generation_now
        if current and self._in_flight.get((batch_id, part)) is worker:
            del self._in_flight[batch_id, part]
        self._replies += 1
        # With light-tailed costs a quarter of the batches is plenty to watch the tail by, and
        # the training process pays for every sample observed.
        watch = self.schedule.cutting or self._replies % _WATCH_EVERY == 0
        slow = False
        if watch and made is not None and task is not None:
            slow = self.costs.observe(task.indices, made.costs)
        if part is not None:
            partial = self.collector.partial.get(batch_id)
            if slow and partial is not None:
                partial.slow = True
            self.collector.on_part(worker, reply, current, task, self._deliver, self._unreadable)
            return
        self.collector.slow_batches += slow
        split = task.split if task is not None else self._split
        self.collector.on_whole(
            worker, reply, current, task, split, self._deliver, self._unreadable
        )

    def _made_already(self, work: Work) -> bool:
        """Whether ``work`` came back already (a late duplicate of a retry)."""
        already = self.collector.made_already(work)
        return already if already is not None else self.buffer.done(work.batch_id)

    def _deliver(self, generation: int, batch_id: int, entry: Entry) -> None:
        self.admission.open.discard(batch_id)
        self.buffer.put(generation, batch_id, entry)

    def _unreadable(self, batch_id: int, work: Work | None, exc: Exception) -> None:
        logger.warning("batch %d could not be read back (%s); retrying it", batch_id, str(exc))
        self._retry_task(batch_id, work, f"could not be read back ({exc})")

    def _enforce_timeout(self) -> None:
        for worker in self.retries.overdue(self.pool.workers):
            logger.warning(
                "worker %d spent over %.1fs on batch %d; restarting it",
                worker.wid,
                self.retries.timeout,
                worker.assigned[0].batch_id,
            )
            self.pool.kill(worker)
            self._on_exit(worker, *self.retries.timeout_words())

    def _reap(self, worker: Worker) -> list[Task]:
        """Drop an exited ``worker`` from the pool and unmap the slabs of it this process
        kept (they will not come back); its unanswered tasks."""
        unanswered = self.pool.reap(worker)
        self.admission.recycler.mappings.gone(worker.wid)
        return unanswered

    def _on_exit(self, worker: Worker, reason: str, lead: str | None = None) -> None:
        """``worker`` exited (``reason``: "died", or why it was stopped); its unanswered
        tasks go back to the queue, the one it was making counted as an attempt. ``lead``:
        DataLoader's words for the error if the batch is given up."""
        self._on_replies(self.pool.drain(worker))  # replies sent before it exited still count
        if reason == "died":  # before the reap lets go of the process
            reason, lead = self.pool.exit_reason(worker), self.pool.exit_words(worker)
        unanswered = self._reap(worker)
        if worker.last_error:
            reason = f"{reason} (its last error: {worker.last_error})"
        expected = worker.retiring and not unanswered
        if not expected:
            self.counters["worker_restarts"] += 1
            logger.warning(
                "worker %d %s with %d unanswered tasks", worker.wid, reason, len(unanswered)
            )
        for position, task in enumerate(unanswered):
            if task.generation != self._generation_now:
                continue
            self._in_flight.pop((task.batch_id, task.part), None)
            # The task it was making counts as an attempt; those queued behind it do not.
            if position == 0 and not expected and not self.retries.again(task.batch_id, task.part):
                self._give_up(task, reason, lead)
                continue
            self.retries.requeued()
            self._requeue(task.batch_id, task.work)

    def _requeue(self, batch_id: int, work: Work | None) -> None:
        self.schedule.requeue(work if work is not None else Work(batch_id, None, ()))

    def _retry_task(self, batch_id: int, work: Work | None, reason: str) -> None:
        """Make ``batch_id`` (or its part ``work``) again, or give up after ``max_attempts``."""
        part = work.part if work is not None else None
        if not self.retries.again(batch_id, part) and self._plan is not None:
            indices = self._plan.batch(batch_id)
            if work is not None and part is not None:
                indices = [indices[p] for p in work.positions]
            task = Task(self._generation_now, self._plan.epoch, batch_id, indices, 0.0, work=work)
            self._give_up(task, reason)
            return
        self.retries.requeued()
        self._requeue(batch_id, work)

    def _give_up(self, task: Task, reason: str, lead: str | None = None) -> None:
        message = self.retries.given_up(task, reason, lead)
        if task.part is not None:
            self.collector.give_up(task, message, self._on_error == "skip", self._deliver)
            return
        if self._on_error == "skip":
            entry = Entry(skipped=[(index, message) for index in task.indices])
        else:
            entry = Entry(error=WorkerTimeoutError(message, stage="worker", indices=task.indices))
        self._deliver(task.generation, task.batch_id, entry)

    def epoch_left(self) -> int | None:
        """Batches of the epoch not yet handed to the loop (None: no epoch yet)."""
        return None if self._plan is None else self.buffer.left


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # no __len__, or one that fails: no per-index history
        return None


def _paths(dataset: Any) -> Any:
    """The file behind an index, for datasets that list their files (else None)."""
    if not any(hasattr(dataset, name) for name in ("samples", "imgs", "paths", "files")):
        return None
    return lambda index: sample_path(dataset, index)
