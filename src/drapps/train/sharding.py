"""ZeRO-2 through PyTorch's own FSDP2, ZeRO-1 through ZeroRedundancyOptimizer, and plain DDP.

ZeRO stage 2 shards the optimizer state and the gradients across data-parallel ranks, so each
rank holds 1/N of each. FSDP2's ``fully_shard(..., reshard_after_forward=False)`` is exactly
that plus parameter sharding between steps: parameters are gathered for the forward and stay
gathered through the backward (no second all-gather, ZeRO-2's communication volume), gradients
are reduce-scattered, and each rank's optimizer steps only its shard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ZERO_STAGES: tuple[int, ...] = (0, 1, 2)

logger = logging.getLogger(__name__)


def shard(model: nn.Module, zero: int = 2, blocks: Iterable[nn.Module] | None = None) -> nn.Module:
    """Wrap ``model`` for data-parallel training at ZeRO stage ``zero``.

    Needs an initialised process group (:func:`spawn` makes one locally; ``torchrun`` does too).

    Args:
        model: the model, already on its device.
        zero: 0 for DDP, 1 for DDP whose optimizer is sharded (build it with
            :func:`make_optimizer`), 2 for FSDP2 sharding of gradients and optimizer state.
        blocks: for ``zero=2``, the submodules to shard as units (e.g. transformer blocks), so
            that only one unit's parameters are gathered at a time; the whole model otherwise.

    Returns:
        The wrapped model: a ``DistributedDataParallel`` for stages 0 and 1, the model itself
        (now holding DTensor shards) for stage 2.
    """
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of {ZERO_STAGES}, got {zero!r}")
    if not dist.is_initialized():
        raise RuntimeError(
            "shard() needs torch.distributed initialised: run under torchrun or drapps.train.spawn"
        )
    if zero < 2:
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in blocks or ():
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    return model


def make_optimizer(
    model: nn.Module, zero: int, optimizer_class: type[torch.optim.Optimizer], **kwargs: Any
) -> torch.optim.Optimizer:
    """The optimizer for a model wrapped by :func:`shard` at the same stage.

    Stage 1 wraps ``optimizer_class`` in ``ZeroRedundancyOptimizer`` so each rank keeps the state
    of 1/N of the parameters; stage 2's state is sharded already because its parameters are.
    """
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of {ZERO_STAGES}, got {zero!r}")
    if zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=optimizer_class, **kwargs
        )
    return optimizer_class(model.parameters(), **kwargs)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's unsharded state dict on every rank (DTensor shards gathered, DDP unwrapped)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    state = {}
    for name, value in model.state_dict().items():
        full = getattr(value, "full_tensor", None)
        state[name] = (full() if callable(full) else value).detach().clone()
    return state


_PORT_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(
    rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple[Any, ...]
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    with process_group(backend, rank, world):
        fn(rank, world, *args)
    # The rank's work is done and its group destroyed. Leave without running C++ static
    # destructors: gloo's can abort a finished rank at exit ("terminate called without an
    # active exception"), which spawn would report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def process_group(backend: str, rank: int, world: int) -> Iterator[None]:
    """Initialise the default process group from the environment and always destroy it."""
    if torch.cuda.is_available() and backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _join(context: mp.ProcessContext) -> None:
    """Wait for ``context``'s ranks, raising a failed one's error, and remove the files the
    ranks wrote their errors to (torch leaves them in the temporary directory)."""
    try:
        while not context.join():
            pass
    finally:
        for name in context.error_files:
            with contextlib.suppress(OSError):
                os.unlink(name)


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` local processes joined in a process group.

    Uses NCCL where CUDA is available and gloo otherwise, on a free loopback port. An exception
    in any rank is raised here once all ranks have ended. ``fn`` must be importable (a module
    level function), as processes are started by spawn.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs!r}")
    for attempt in range(_PORT_ATTEMPTS):
        try:
            args_ = (fn, nprocs, _free_port(), args)
            _join(mp.spawn(_worker, args=args_, nprocs=nprocs, join=False))
            return
        except mp.ProcessRaisedException as exc:
            # The free port can be taken by another process between our probe and rank 0's
            # bind; the ranks fail in init_process_group, before running fn, so try another.
            taken = "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower()
            if not taken or attempt == _PORT_ATTEMPTS - 1:
                raise
            logger.info("port taken before rank 0 could bind it; retrying on another")
