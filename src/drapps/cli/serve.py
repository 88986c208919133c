"""``drapps serve``: producers that fill a Redis batch queue for ``Loader(source=...)``."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import time
from typing import Any

from drapps.cli._args import Commands, UsageError, check_positive, load_object
from drapps.cli.profile import load_dataset


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The dataset, transform and collate_fn the options name (factories are called).

    Raises:
        UsageError: an option names nothing, or not what it should.
    """
    try:
        dataset = load_dataset(args.dataset)
        transform = load_object(args.transform, "--transform") if args.transform else None
        collate = load_object(args.collate, "--collate") if args.collate else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if transform is not None and args.transform_factory:
        transform = transform()
    for option, value in (("--transform", transform), ("--collate", collate)):
        if value is not None and not callable(value):
            raise UsageError(f"{option} must name a callable, got a {type(value).__name__}")
    return dataset, transform, collate


def _produce(args: argparse.Namespace, password: str | None, index: int) -> int:
    """One producer process: make batches until told to stop."""
    from drapps.integrations.redis_queue import Producer, QueueAddress

    dataset, transform, collate = _build(args)
    address = QueueAddress(args.redis_url, args.queue)
    producer = Producer(
        address,
        dataset,
        transform=transform,
        collate_fn=collate,
        max_ready=args.max_ready,
        claim_after_s=args.claim_after,
        username=args.username,
        password=password,
    )
    signal.signal(signal.SIGTERM, lambda *_: producer.stop())
    if index > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
    else:
        signal.signal(signal.SIGINT, lambda *_: producer.stop())
    return producer.run(max_batches=args.max_batches, idle_exit_s=args.idle_exit)


def _child(args: argparse.Namespace, password: str | None, index: int) -> None:
    import torch

    torch.set_num_threads(1)  # one core per producer
    _produce(args, password, index)


def serve_command(args: argparse.Namespace) -> int:
    from drapps.integrations.redis_queue import QueueAddress

    check_positive(args, "workers", "max_ready", minimum=1)
    check_positive(args, "claim_after")
    try:
        address = QueueAddress.parse(args.redis, "--redis")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.redis_url = address.url
    args.queue = args.queue or address.name
    password = os.environ.get(args.password_env) if args.password_env else None
    if args.password_env and password is None:
        raise UsageError(f"--password-env {args.password_env}: that variable is not set")
    _build(args)  # fail here, once, on a bad --dataset/--transform
    if args.workers == 1:
        made = _produce(args, password, 0)
        print(f"drapps serve: made {made} batches for queue {args.queue!r}")
        return 0
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_child, args=(args, password, i), name=f"drapps-serve-{i}")
        for i in range(args.workers)
    ]
    for child in children:
        child.start()

    def stop(*_: Any) -> None:
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        while any(c.is_alive() for c in children):
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop()
    for child in children:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    print(f"drapps serve: {args.workers} producers stopped (queue {args.queue!r})")
    return 0


def add_commands(commands: Commands) -> None:
    """Add ``serve``."""
    serve = commands.add_parser(
        "serve",
        help="make batches on this machine for a training host that reads a Redis queue",
        description="Runs --workers producer processes that take the batch tasks a "
        "drapps.Loader(source='redis://...') posts, make each batch from --dataset (and "
        "--transform) exactly as a local loader would, and push it back through Redis. Start "
        "as many as you like, on any machine that reaches the Redis server; a producer that "
        "dies has its tasks taken over by the others after --claim-after seconds.",
    )
    serve.add_argument(
        "--redis",
        required=True,
        help="redis://[user:password@]host:port/db[?queue=NAME], rediss://..., or unix://...",
    )
    serve.add_argument(
        "--queue", default="", help="queue name (default: from the URL, else drapps)"
    )
    serve.add_argument(
        "--dataset", required=True, help="module:factory giving the map-style dataset"
    )
    serve.add_argument("--transform", default="", help="module:callable applied to each sample")
    serve.add_argument(
        "--transform-factory",
        action="store_true",
        help="--transform names a factory: call it once to get the transform",
    )
    serve.add_argument("--collate", default="", help="module:callable, the collate_fn")
    serve.add_argument("--workers", type=int, default=1, help="producer processes (1)")
    serve.add_argument(
        "--max-ready", type=int, default=32, help="wait while this many batches are unread (32)"
    )
    serve.add_argument(
        "--claim-after",
        type=float,
        default=30.0,
        help="take over a task another producer has held this many seconds (30)",
    )
    serve.add_argument("--username", default=None, help="Redis ACL user")
    serve.add_argument(
        "--password-env", default="", help="read the Redis password from this variable"
    )
    serve.add_argument(
        "--max-batches", type=int, default=None, help="stop after this many batches each"
    )
    serve.add_argument(
        "--idle-exit", type=float, default=None, help="stop after this many idle seconds"
    )
    serve.set_defaults(run=serve_command)
