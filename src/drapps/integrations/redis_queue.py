"""A batch queue in Redis: producers on any machine make batches, the training host reads them.

The training host (:class:`RemoteLoader`, made by ``drapps.Loader(source="redis://...")``) plans
each epoch exactly as a local loader would and posts its batches as tasks; producers
(``drapps serve``, :class:`Producer`) take tasks through a consumer group, make each batch with
the same code a worker process runs, and push it back. Keys, for a queue named ``Q``:

``Q:meta``     hash: the dataset's length and name, written by every producer at start.
``Q:reader``   the one reader that holds the queue (host, pid, since), with an expiry its
               holder renews: a second reader is refused, naming it (:class:`ReaderLease`).
``Q:gen``      the generation the training host reads now; tasks of another are dropped.
``Q:tasks``    stream of tasks ``{gen, epoch, batch, seed, indices}``; consumer group
               ``producers``. A task is acknowledged (and deleted) once its batch is pushed;
               one a dead producer held is claimed by another after ``claim_after_s``.
``Q:ready``    stream of made batches ``{gen, batch, key, nbytes}`` or ``{gen, batch, error}``;
               consumer group ``trainer``; acknowledged and deleted once delivered.
``Q:batch:..`` the batch's bytes (:mod:`drapps.integrations.wire`, never pickle), with an
               expiry so that nothing outlives a vanished reader for long.

Exactly once: batches are delivered in batch order and a batch made twice (a claimed task whose
first producer was only slow) is dropped by id. Back-pressure: the training host keeps at most
``prefetch`` tasks ahead of what it has delivered, and producers wait while ``Q:ready`` holds
``max_ready`` batches. Sizes: a batch's size is in its stream entry and checked against
``max_batch_bytes`` before its bytes are fetched, and no more than that size (and one byte) is
fetched: stored bytes of another size are refused with an error that names both. A batch
whose bytes are gone when read (evicted, expired) is asked for again, a few times at most.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from drapps.integrations import wire
from drapps.integrations._redis import (
    check_url,
    connect,
    redact,
    redis_errors,
    response_error,
    watch_error,
)
from drapps.runtime.errors import SampleError
from drapps.runtime.plan import EpochPlan

logger = logging.getLogger(__name__)

PRODUCERS = "producers"
TRAINER = "trainer"
_BLOCK_MS = 500
_PAYLOAD_TTL_S = 3600
LEASE_S = 15.0
"""How long a reader's hold on its queue outlives its last renewal (renewed every third of it):
the longest a reader that crashed keeps the next one out."""


@dataclass(frozen=True, repr=False)
class QueueAddress:
    """Where a queue lives: the Redis URL and the queue's name (``?queue=`` in the URL)."""

    url: str
    name: str

    def __repr__(self) -> str:
        return f"QueueAddress(url={redact(self.url)!r}, name={self.name!r})"

    @classmethod
    def parse(cls, source: str, what: str = "source") -> QueueAddress:
        """``redis://[user:password@]host:port/db?queue=NAME`` (queue "drapps" if absent).

        Raises:
            ValueError: not a Redis URL, or an empty queue name.
        """
        check_url(source, what)
        parts = urllib.parse.urlsplit(source)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        names = query.pop("queue", ["drapps"])
        if len(names) != 1 or not names[0] or any(c in names[0] for c in " {}*?[]"):
            raise ValueError(f"{what}: the queue name must be one plain word, got {names!r}")
        rest = urllib.parse.urlencode(query, doseq=True)
        return cls(urllib.parse.urlunsplit(parts._replace(query=rest)), names[0])

    def key(self, part: str) -> str:
        return f"{self.name}:{part}"


def _ensure_group(client: Any, stream: str, group: str) -> None:
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except response_error() as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------- producers


class Producer:
    """Makes the batches a queue's tasks ask for (one process; ``drapps serve`` runs several).

    Args:
        address: the queue.
        dataset: the dataset (map-style), as the training host would have it.
        transform: applied to each sample, as ``Loader(transform=...)`` does.
        collate_fn: list of samples -> batch (default: torch's ``default_collate``).
        max_ready: wait while this many made batches are waiting in ``Q:ready``.
        claim_after_s: take over a task another producer has held this long (it died).
        username, password: an ACL user, when not in the URL.
    """

    def __init__(
        self,
        address: QueueAddress,
        dataset: Any,
        *,
        transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        max_ready: int = 32,
        claim_after_s: float = 30.0,
        username: str | None = None,
        password: str | None = None,
        name: str | None = None,
    ) -> None:
        from torch.utils.data import default_collate

        from drapps.runtime.worker import BatchRecipe

        if max_ready < 1:
            raise ValueError(f"max_ready must be >= 1, got {max_ready!r}")
        if claim_after_s <= 0:
            raise ValueError(f"claim_after_s must be > 0, got {claim_after_s!r}")
        self.address = address
        self.length = len(dataset)
        self._recipe = BatchRecipe(dataset, transform, collate_fn or default_collate, "raise")
        self._dataset_name = type(dataset).__name__
        self._max_ready = max_ready
        self._claim_ms = int(claim_after_s * 1000)
        self._credentials = (username, password)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.made = 0
        self._stop = False

    def stop(self) -> None:
        """Finish the batch in hand, then return from :meth:`run`."""
        self._stop = True

    def run(self, *, max_batches: int | None = None, idle_exit_s: float | None = None) -> int:
        """Take and make tasks until :meth:`stop` (or ``max_batches`` made, or nothing to do
        for ``idle_exit_s``); returns how many batches it made. A lost Redis is retried."""
        from drapps.runtime.seeding import seed_worker, set_worker_info

        seed_worker(0, 0)
        set_worker_info(0, 1, 0, self._recipe.dataset)
        client = None
        lost = False
        idle_since = time.monotonic()
        last_claim = 0.0
        while not self._stop and (max_batches is None or self.made < max_batches):
            try:
                if client is None:
                    client = self._connect()
                    if lost:
                        lost = False
                        logger.warning("producer %s reached Redis again", self.name)
                tasks = []
                if time.monotonic() - last_claim > min(5.0, self._claim_ms / 2000):
                    last_claim = time.monotonic()
                    self._announce(client)  # again: a Redis that restarted has lost it
                    tasks = self._claim(client)
                if not tasks:
                    tasks = self._take(client)
                for entry_id, fields in tasks:
                    self._handle(client, entry_id, fields)
                    idle_since = time.monotonic()
            except (*redis_errors(), response_error()) as exc:
                # Unreachable, or a Redis that restarted empty (NOGROUP): connect afresh,
                # which makes the group and announces the dataset again.
                if not lost:
                    lost = True
                    logger.warning(
                        "producer %s cannot use Redis at %s (%s: %s); retrying every second",
                        self.name,
                        redact(self.address.url),
                        type(exc).__name__,
                        str(exc),
                    )
                client = None
                time.sleep(1.0)
            if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break  # nothing made for that long (Redis unreachable counts as idle)
        return self.made

    def _connect(self) -> Any:
        client = connect(
            self.address.url, username=self._credentials[0], password=self._credentials[1]
        )
        _ensure_group(client, self.address.key("tasks"), PRODUCERS)
        self._announce(client)
        return client

    def _announce(self, client: Any) -> None:
        """Tell readers the dataset's length (they plan epochs from it)."""
        client.hset(
            self.address.key("meta"),
            mapping={"length": self.length, "dataset": self._dataset_name},
        )

    def _take(self, client: Any) -> list[tuple[Any, dict[bytes, bytes]]]:
        got = client.xreadgroup(
            PRODUCERS, self.name, {self.address.key("tasks"): ">"}, count=1, block=_BLOCK_MS
        )
        return [entry for _, entries in got or [] for entry in entries]

    def _claim(self, client: Any) -> list[tuple[Any, dict[bytes, bytes]]]:
        """Tasks a producer took and never finished (it died), now ours."""
        reply = client.xautoclaim(
            self.address.key("tasks"), PRODUCERS, self.name, self._claim_ms, "0-0", count=4
        )
        claimed = [e for e in reply[1] if e and e[1]]
        if claimed:
            logger.info("producer %s took over %d stalled task(s)", self.name, len(claimed))
        return claimed

    def _handle(self, client: Any, entry_id: Any, fields: dict[bytes, bytes]) -> None:
        from drapps.runtime.worker import make_batch

        tasks = self.address.key("tasks")
        try:
            gen = _text(fields[b"gen"])
            epoch, batch_id, seed = (int(fields[k]) for k in (b"epoch", b"batch", b"seed"))
            indices = json.loads(fields[b"indices"])
            if not all(isinstance(i, int) and 0 <= i < self.length for i in indices):
                raise ValueError(f"indices out of range 0..{self.length - 1}")
            repeats = json.loads(fields.get(b"repeats", b"null"))
            if repeats is not None and (
                not isinstance(repeats, list)
                or len(repeats) != len(indices)
                or not all(type(r) is int and r >= 0 for r in repeats)
            ):
                raise ValueError(f"repeats must be {len(indices)} counts, got {repeats!r}")
        except (KeyError, ValueError, TypeError) as exc:
            logger.warning(
                "producer %s dropped a malformed task %r: %s", self.name, entry_id, str(exc)
            )
            self._done(client, tasks, entry_id)
            return
        current = client.get(self.address.key("gen"))
        if current is None or _text(current) != gen:
            self._done(client, tasks, entry_id)  # the reader has moved on
            return
        while client.xlen(self.address.key("ready")) >= self._max_ready and not self._stop:
            time.sleep(0.02)  # back-pressure: the training host is behind
        fields_out: dict[str, Any] = {"gen": gen, "batch": batch_id}
        try:
            counts = None if repeats is None else tuple(repeats)
            made = make_batch(self._recipe, seed, epoch, indices, repeats=counts)
            payload = wire.encode(made.batch)
        except (SampleError, wire.WireError) as exc:
            fields_out["error"] = str(exc)
        else:
            key = self.address.key(f"batch:{gen}:{batch_id}:{secrets.token_hex(4)}")
            client.set(key, payload, ex=_PAYLOAD_TTL_S)
            fields_out.update(key=key, nbytes=len(payload))
        client.xadd(self.address.key("ready"), fields_out)
        self._done(client, tasks, entry_id)
        self.made += 1

    @staticmethod
    def _done(client: Any, stream: str, entry_id: Any) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, PRODUCERS, entry_id)
        pipe.xdel(stream, entry_id)
        pipe.execute()


# --------------------------------------------------------------------------------- reader


class QueueInUseError(RuntimeError):
    """Another reader holds the queue: a queue has one reader (give each loader its own)."""


class ReaderLease:
    """One reader per queue: ``Q:reader`` names the reader that holds it.

    Taken only when nobody holds it (``SET NX``), with an expiry of ``lease_s`` that a thread
    renews every third of that while the reader lives. So a reader that exits, crashes or
    loses Redis lets go within ``lease_s``, and :meth:`release` lets go at once. A renewal
    first compares the holder (WATCH/MULTI): a lease that ran out and was taken by another
    reader is never renewed over it, and its old holder learns so at its next
    :meth:`check`.

    Args:
        client: the reader's Redis client (shared: redis-py's pool is thread-safe).
        address: the queue.
        lease_s: seconds the hold outlives its last renewal.

    Raises:
        QueueInUseError: another reader holds the queue.
    """

    def __init__(self, client: Any, address: QueueAddress, lease_s: float) -> None:
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or lease_s <= 0:
            raise ValueError(f"lease_s must be > 0 seconds, got {lease_s!r}")
        self._client = client
        self._key = address.key("reader")
        self._queue = address.name
        self._lease_ms = max(1, int(lease_s * 1000))
        self._holder = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": round(time.time(), 3),
                "token": secrets.token_hex(8),
            }
        ).encode()
        self._lock = threading.Lock()
        self._lost: bytes | None = None  # what the key held when it stopped being ours
        self._renewed = 0.0
        self._stop = threading.Event()
        with self._lock:
            self._take()
        self._thread = threading.Thread(
            target=self._run, name=f"drapps-queue-lease-{address.name}", daemon=True
        )
        self._thread.start()

    def check(self) -> None:
        """Raise unless this reader still holds the queue. Local, unless the renewing thread
        has not renewed for half the lease (a paused process, a slow Redis): then it renews
        here first, so a reader never acts on a lease that may have run out.

        Raises:
            QueueInUseError: another reader holds the queue now.
            ConnectionError: the hold ran out and nobody has it (Redis did not answer the
                renewals, or restarted empty); what this reader posted may be gone.
        """
        if self._lost is None and time.monotonic() - self._renewed > self._lease_ms / 2000:
            with self._lock:
                self._renew()
        lost = self._lost
        if lost is None:
            return
        if lost:
            raise QueueInUseError(self._in_use(lost))
        raise ConnectionError(
            f"this reader's hold on queue {self._queue!r} ran out (Redis did not answer its "
            f"renewals for {self._lease_ms / 1000:g} s, or restarted empty); the batches "
            "delivered so far stand: resume with a new loader from state_dict()"
        )

    def hold(self) -> None:
        """Before a generation begins: hold the queue, taking it again if the hold ran out
        and nobody has it (Redis restarted between epochs, say).

        Raises:
            QueueInUseError: another reader holds the queue.
        """
        with self._lock:
            if self._lost == b"":
                self._take()
        self.check()

    def release(self) -> None:
        """Stop renewing and let go of the queue, if it is still this reader's. Idempotent;
        quiet when Redis is gone (the hold then runs out by itself)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock, contextlib.suppress(*redis_errors(), response_error(), watch_error()):
            if self._lost is None:
                with self._client.pipeline() as pipe:
                    pipe.watch(self._key)
                    if pipe.get(self._key) == self._holder:
                        pipe.multi()
                        pipe.delete(self._key)
                        pipe.execute()
            self._lost = b""

    # --------------------------------------------------------------------------- plumbing

    def _take(self) -> None:
        for _ in range(3):  # a holder whose key runs out between the SET and the GET
            if self._client.set(self._key, self._holder, nx=True, px=self._lease_ms):
                self._renewed = time.monotonic()
                self._lost = None
                return
            held = self._client.get(self._key)
            if held is not None:
                raise QueueInUseError(self._in_use(held))
        raise QueueInUseError(f"queue {self._queue!r}: its reader keeps changing; try again")

    def _renew(self) -> None:
        """Extend the hold if it is still ours; else note what the key holds (b"": nothing)."""
        try:
            with self._client.pipeline() as pipe:
                pipe.watch(self._key)
                held = pipe.get(self._key)
                if held == self._holder:
                    pipe.multi()
                    pipe.pexpire(self._key, self._lease_ms)
                    pipe.execute()
                    self._renewed = time.monotonic()
                    return
        except watch_error():  # changed between the GET and the PEXPIRE
            held = self._client.get(self._key)
        self._lost = held or b""
        logger.warning("the reader of queue %r lost its hold on it", self._queue)

    def _run(self) -> None:
        every = self._lease_ms / 3000
        wait = every
        while not self._stop.wait(wait):
            wait = every
            try:
                with self._lock:
                    if self._lost is None:
                        self._renew()
            except (*redis_errors(), response_error()):
                wait = min(every, 1.0)  # soon again: the hold runs out if this lasts

    def _in_use(self, held: bytes) -> str:
        """Who holds the queue, for the error."""
        try:
            who = json.loads(held)
            host, pid, since = str(who["host"]), int(who["pid"]), float(who["since"])
        except (ValueError, KeyError, TypeError):
            holder = f"a holder drapps does not know: {held[:80]!r}"
        else:
            here = host == socket.gethostname() and pid == os.getpid()
            stamp = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            holder = (
                f"host {host}, pid {pid}{' (this process)' if here else ''}, since {stamp}, "
                f"{max(0.0, time.time() - since):.0f} s ago"
            )
        left_ms = int(self._client.pttl(self._key))
        runs_out = (
            f"; if that reader is gone, its hold runs out in {left_ms / 1000:.0f} s"
            if left_ms > 0
            else ""
        )
        return (
            f"queue {self._queue!r} is already read by another loader ({holder}): a queue has "
            "one reader. Close that loader, or give each loader its own queue (?queue=NAME) "
            f"and its own `drapps serve` producers{runs_out}"
        )


class QueueReader:
    """The training host's side of one queue: posts tasks, receives batches in order.

    Used by :class:`~drapps.integrations.redis_source.RedisSource`. A queue has one reader:
    it holds the queue (:class:`ReaderLease`) from here until :meth:`close`.

    Raises:
        ConnectionError: Redis cannot be reached.
        QueueInUseError: another reader holds the queue.
    """

    def __init__(
        self,
        address: QueueAddress,
        *,
        max_batch_bytes: int,
        timeout: float,
        username: str | None = None,
        password: str | None = None,
        lease_s: float = LEASE_S,
    ) -> None:
        self.address = address
        self._max_bytes = max_batch_bytes
        self._timeout = timeout
        self._client = connect(address.url, username=username, password=password)
        try:
            self._client.ping()
            _ensure_group(self._client, address.key("ready"), TRAINER)
            _ensure_group(self._client, address.key("tasks"), PRODUCERS)
            self._lease = ReaderLease(self._client, address, lease_s)
        except redis_errors() as exc:
            self._client.close()
            raise ConnectionError(
                f"cannot reach the Redis of queue {address.name!r} at {redact(address.url)}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        except BaseException:
            self._client.close()
            raise
        self._finalizer = weakref.finalize(self, _close, os.getpid(), self._client, self._lease)
        self._name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"

    def length(self) -> int:
        """The dataset's length, as the producers announced it (waits up to the timeout)."""
        deadline = time.monotonic() + self._timeout
        while True:
            value = self._client.hget(self.address.key("meta"), "length")
            if value is not None:
                return int(value)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no producer has announced itself on queue {self.address.name!r} in "
                    f"{self._timeout:.0f} s; start one with `drapps serve --redis URL "
                    f"--queue {self.address.name} --dataset module:factory`"
                )
            time.sleep(0.1)

    def begin(self) -> str:
        """Start a generation (one epoch's reading); tasks of any other are dropped.

        Raises:
            QueueInUseError: another reader took the queue.
        """
        self._lease.hold()
        gen = secrets.token_hex(6)
        self._client.set(self.address.key("gen"), gen)
        return gen

    def post(self, gen: str, plan: EpochPlan, batch_id: int) -> None:
        """Ask the producers for batch ``batch_id`` of ``plan``."""
        self._lease.check()
        task = {
            "gen": gen,
            "epoch": plan.epoch,
            "batch": batch_id,
            "seed": plan.seed,
            "indices": json.dumps([int(i) for i in plan.batch(batch_id)]),
        }
        repeats = plan.repeats_of(batch_id)
        if repeats is not None:
            task["repeats"] = json.dumps(repeats)
        self._client.xadd(self.address.key("tasks"), task)

    def receive(self, gen: str, want: int, held: dict[int, Any]) -> None:
        """Wait for batch ``want``; put every batch of ``gen`` that arrives into ``held``
        (id -> (entry id, batch or error)); drop other generations' and duplicates.

        Raises:
            TimeoutError: nothing arrived for ``timeout`` seconds.
            QueueInUseError: another reader took the queue.
        """
        ready = self.address.key("ready")
        deadline = time.monotonic() + self._timeout
        while want not in held:
            self._lease.check()  # never read (and drop) another reader's batches
            got = self._client.xreadgroup(
                TRAINER, self._name, {ready: ">"}, count=16, block=_BLOCK_MS
            )
            entries = [entry for _, batch in got or [] for entry in batch]
            if not entries and time.monotonic() > deadline:
                raise TimeoutError(
                    f"no batch arrived on queue {self.address.name!r} for {self._timeout:.0f} s "
                    "(are the `drapps serve` producers running?)"
                )
            for entry_id, fields in entries:
                deadline = time.monotonic() + self._timeout
                self._accept(gen, want, held, entry_id, fields)

    def _accept(
        self, gen: str, want: int, held: dict[int, Any], entry_id: Any, fields: dict[bytes, Any]
    ) -> None:
        key = _text(fields.get(b"key", b""))
        batch_id = int(fields.get(b"batch", -1))
        if _text(fields.get(b"gen", b"")) != gen or batch_id < want or batch_id in held:
            self.release(entry_id, key)  # another generation's, or made twice
            return
        if b"error" in fields:
            held[batch_id] = (entry_id, key, SampleError(_text(fields[b"error"])))
            return
        nbytes = int(fields.get(b"nbytes", -1))
        if not 0 <= nbytes <= self._max_bytes:
            self.release(entry_id, key)
            held[batch_id] = (
                entry_id,
                "",
                ValueError(
                    f"batch {batch_id} on queue {self.address.name!r} is {nbytes} bytes, over "
                    f"max_batch_bytes={self._max_bytes}; refusing to read it"
                ),
            )
            return
        # At most one byte more than announced crosses the network, whatever the key holds
        # (or comes to hold meanwhile): one more tells a larger value apart.
        data = self._client.getrange(key, 0, nbytes) if key else b""
        if not data:
            # Expired, evicted or lost with a Redis restart: ask for it again.
            self.release(entry_id, key)
            logger.warning("batch %d's bytes are missing on Redis; asking for it again", batch_id)
            held[batch_id] = (entry_id, "", _Again())
            return
        if len(data) != nbytes:
            stored = len(data) if len(data) < nbytes else int(self._client.strlen(key))
            self.release(entry_id, key)
            held[batch_id] = (entry_id, "", self._mismatch(batch_id, stored, nbytes))
            return
        held[batch_id] = (entry_id, key, wire.decode(data))

    def _mismatch(self, batch_id: int, stored: int, nbytes: int) -> ValueError:
        """The error for a batch whose stored bytes are not the size its entry announced."""
        where = f"batch {batch_id} on queue {self.address.name!r} holds {stored} bytes in Redis"
        if stored > self._max_bytes:
            return ValueError(
                f"{where}, over max_batch_bytes={self._max_bytes} (its entry announced "
                f"{nbytes}); refusing to read it"
            )
        return ValueError(
            f"{where}, but its entry announced {nbytes}; refusing to read it (a producer of "
            "another drapps version, or something else writing the queue's keys?)"
        )

    def release(self, entry_id: Any, key: str) -> None:
        """Acknowledge and delete a ready entry and its bytes."""
        pipe = self._client.pipeline(transaction=False)
        pipe.xack(self.address.key("ready"), TRAINER, entry_id)
        pipe.xdel(self.address.key("ready"), entry_id)
        if key:
            pipe.delete(key)
        pipe.execute()

    def finish(self, gen: str, held: dict[int, Any]) -> None:
        """End a generation: release the batches still held, and tell the producers to drop
        its remaining tasks."""
        with contextlib.suppress(*redis_errors()):
            for entry_id, key, _ in held.values():
                self.release(entry_id, key)
            current = self._client.get(self.address.key("gen"))
            if current is not None and _text(current) == gen:
                self._client.delete(self.address.key("gen"))
        held.clear()

    def close(self) -> None:
        """Let go of the queue and close the connection. Idempotent."""
        self._finalizer()


def _close(owner: int, client: Any, lease: ReaderLease) -> None:
    """A reader's end (also when it is garbage-collected): the queue, then the connection; in
    the process ``owner`` only. A forked child inherits the finalizer and runs it when it
    exits or drops its copy, and the hold it would let go of is its parent's."""
    if os.getpid() != owner:
        return
    lease.release()
    with contextlib.suppress(Exception):
        client.close()


class _Again:
    """A batch whose bytes were lost: the reader posts its task again."""


_REMAKES = 3
"""Times a batch whose bytes were lost is asked for again before that is an error."""


def iterate(
    reader: QueueReader,
    plan: Any,
    start: int,
    prefetch: int,
    on_delivered: Callable[[int], None],
) -> Iterator[Any]:
    """The batches ``start..`` of ``plan`` from producers, in order, each exactly once.

    Raises:
        ConnectionError: Redis went away (the batches delivered so far stand).
        ValueError: a batch over ``max_batch_bytes``, or stored at another size than announced.
        RuntimeError: a batch's bytes were gone every time it was made.
    """
    gen = ""
    held: dict[int, Any] = {}
    posted = start
    try:
        gen = reader.begin()
        for want in range(start, len(plan)):
            while posted < min(len(plan), want + prefetch):
                reader.post(gen, plan, posted)
                posted += 1
            reader.receive(gen, want, held)
            entry_id, key, batch = held.pop(want)
            remakes = 0
            while isinstance(batch, _Again):  # its bytes were lost: ask for it again
                if remakes == _REMAKES:
                    raise RuntimeError(
                        f"batch {want} on queue {reader.address.name!r} was made "
                        f"{remakes + 1} times and its bytes were gone each time it was read: "
                        "Redis drops them first (a maxmemory-policy that evicts them, a "
                        "restart, or another client deleting them); the queue's keys must stay "
                        "until they are read"
                    )
                remakes += 1
                reader.post(gen, plan, want)
                reader.receive(gen, want, held)
                entry_id, key, batch = held.pop(want)
            reader.release(entry_id, key)  # acknowledged as it is handed over
            if isinstance(batch, BaseException):
                raise batch
            on_delivered(want)
            yield batch
    except redis_errors() as exc:
        raise ConnectionError(
            f"lost the Redis of queue {reader.address.name!r} at {redact(reader.address.url)} "
            f"({type(exc).__name__}: {exc}); the batches delivered so far stand: resume with a "
            "new loader from state_dict() once Redis is back"
        ) from None
    finally:
        if gen:
            reader.finish(gen, held)
