"""Gradient accumulation whose factor k follows the gradient noise scale.

The optimal batch size to train at is about B_noise (McCandlish et al. 2018): smaller batches
waste steps on noise, bigger ones waste samples. :class:`AdaptiveAccumulation` measures B_noise
from the micro-batches it already runs (each micro-batch's own gradient, read by a hook as
autograd produces it, against the accumulated gradient of the whole step) and picks the number of
micro-batches per optimizer step so that the effective batch tracks it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from drapps.train.noise_scale import GradientNoiseScale
from drapps.train.overhead import OverheadGuard
from drapps.train.precision import MixedPrecision, step_scaler

logger = logging.getLogger(__name__)


class BatchSizeFollower(Protocol):
    """Anything told the effective batch size when it changes (e.g. :class:`WarmupCosine`)."""

    def set_batch_size(self, batch_size: int) -> None: ...


MAX_MEASURE_EVERY = 50
"""A measurement that would have to skip more steps than this to fit its limit is switched off:
one estimate in 50 steps follows the noise scale too slowly to be worth its cost."""


class AdaptiveAccumulation:
    """Owns the accumulation factor ``k`` and sets it from a live estimate of B_noise.

    Loss normalisation is the caller's, and it must make the accumulated gradient the mean over
    every item of the step: sum the per-item losses of each micro-batch and divide by the items of
    the whole step (see the example). Then micro-batches of unequal sizes (a short last one, or
    variable token counts) weigh exactly as in one big batch.

    With k = 1 there is only one micro-batch per step, so consecutive steps are paired instead:
    the two steps' gradients are the small batches and their mean the big one (biased only by the
    one parameter update between them).

    Choosing k: each measured step names the k it is evidence for, if any.

    - A sure estimate (relative error at most ``max_relative_error``) wants
      ``round(B_noise / micro_batch_size)``.
    - A less sure one still counts when its confidence interval
      (:meth:`GradientNoiseScale.interval`, about 95%) lies wholly on one side of the effective
      batch: a lower bound above the batch wants ``floor(low / micro_batch_size)``, an upper
      bound below it ``ceil(high / micro_batch_size)``. So a large B_noise whose ``|G|^2`` is
      still lost in the noise of small batches grows k as far as the evidence goes, and the
      bigger batch then measures it better.
    - An interval that straddles the batch is evidence for no move, so k holds.

    The wanted k is clipped to ``[min_k, max_k]``; k takes it once it has differed from k by at
    least ``tolerance`` on ``patience`` steps in a row.

    Args:
        model: the module whose parameters' gradients are measured.
        micro_batch_size: items (samples or tokens) in a full micro-batch; ``k * micro_batch_size``
            is the effective batch the noise scale is compared with.
        min_k: fewest micro-batches per step.
        max_k: most micro-batches per step.
        k: the starting factor (``min_k`` by default).
        tolerance: hysteresis; k changes only when the wanted factor differs from the current one
            by at least this ratio ...
        patience: ... for this many consecutive steps (see "Choosing k" above).
        max_relative_error: an estimate whose standard error
            (:attr:`GradientNoiseScale.relative_error`) is at most this share of it is sure:
            k goes to it. A less sure one moves k only as far as its confidence bound.
        estimator: the :class:`GradientNoiseScale` to feed (a fresh one by default).
        follower: told the new effective batch size whenever k changes, e.g. a
            :class:`~drapps.train.WarmupCosine` that scales the learning rate with it.
        max_overhead: the measurement's share of step time it may take. Decided once, after
            ``overhead_window`` steps, by an :class:`~drapps.train.overhead.OverheadGuard`
            (robust to a few slow steps, the same verdict on every rank): a measurement that
            costs more is then made on one step in ``ceil(share / max_overhead)`` (every rank
            on the same steps), so its cost comes back under the limit and k still follows the
            noise scale, on fewer steps; one that would need fewer than one step in
            :data:`MAX_MEASURE_EVERY` is switched off, and k stays where it is.
        overhead_window: steps timed before that decision.
        distributed: measure across the ranks of ``torch.distributed`` (None: whenever a
            process group of more than one rank is running). Each rank's micro-batch gradients
            are the small batches and the gradient averaged over the ranks at ``step()`` (as
            DDP, ZeRO-1 and FSDP2 leave it; FSDP2's shards are summed across the ranks) the big
            one, so every rank computes the same estimate, the one a single process would on
            the same micro-batches. Under FSDP2 the hooks go on the unsharded parameters that
            ``fully_shard`` makes at the first forward (its private ``FSDPParam`` objects).
        clock: the time source for that decision (a test injects one).
        measure: False for plain fixed-k accumulation: no hooks, no estimate, k never changes.
        max_grad_norm: clip the accumulated gradient to this norm in :meth:`step`, after it is
            measured and unscaled (once). Clip here rather than before ``step()``: clipping
            first would shrink only the big-batch half of the measurement and unscale twice.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> acc = AdaptiveAccumulation(model, micro_batch_size=8, max_k=4)
        >>> data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(6)]
        >>> for group in acc.groups(data):
        ...     items = sum(len(y) for _, y in group)
        ...     for x, y in group:
        ...         with acc.micro_batch(len(y)):
        ...             loss = ((model(x) - y) ** 2).sum() / items
        ...             loss.backward()
        ...     stepped = acc.step(opt)
        >>> acc.k
        1
    """

    def __init__(
        self,
        model: nn.Module,
        micro_batch_size: int,
        *,
        min_k: int = 1,
        max_k: int = 16,
        k: int | None = None,
        tolerance: float = 1.5,
        patience: int = 10,
        max_relative_error: float = 0.25,
        estimator: GradientNoiseScale | None = None,
        follower: BatchSizeFollower | None = None,
        max_overhead: float = 0.1,
        measure: bool = True,
        max_grad_norm: float | None = None,
        overhead_window: int = 20,
        clock: Callable[[], float] = time.perf_counter,
        distributed: bool | None = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size!r}")
        if not 1 <= min_k <= max_k:
            raise ValueError(f"need 1 <= min_k <= max_k, got min_k={min_k!r}, max_k={max_k!r}")
        k = min_k if k is None else k
        if not min_k <= k <= max_k:
            raise ValueError(f"k must be in [{min_k}, {max_k}], got {k!r}")
        if tolerance <= 1.0:
            raise ValueError(f"tolerance must be > 1, got {tolerance!r}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience!r}")
        if not max_relative_error > 0.0:
            raise ValueError(f"max_relative_error must be > 0, got {max_relative_error!r}")
        if not max_overhead > 0.0:
            raise ValueError(f"max_overhead must be > 0, got {max_overhead!r}")
        if max_grad_norm is not None and not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no parameters that require gradients")
        self.micro_batch_size = micro_batch_size
        self.min_k, self.max_k, self._k = min_k, max_k, k
        self.tolerance, self.patience = tolerance, patience
        self.max_relative_error = max_relative_error
        self.estimator = estimator if estimator is not None else GradientNoiseScale()
        self.follower = follower
        self.max_overhead = max_overhead
        self.max_grad_norm = max_grad_norm
        self.grad_norm: float | None = None
        """Norm of the last step's accumulated gradient before clipping (None before one)."""
        self.measuring = measure
        self.measure_every = 1
        """Measure on one step in this many (more than 1 once measuring cost too much)."""
        self._this_step = measure  # whether the step under way is measured
        self.steps = 0
        self.history: list[tuple[int, int]] = [(0, k)]  # (step, k) at each change
        self._want_streak = 0
        self._items: list[int] = []  # item count of each micro-batch this step
        self._sq_norms: list[torch.Tensor] = []  # raw squared norm of each micro-batch gradient
        self._current: torch.Tensor | None = None
        self._previous: tuple[torch.Tensor, float, int] | None = None  # for k == 1 pairing
        self.guard = OverheadGuard(max_overhead, overhead_window)
        self.distributed = distributed
        self._clock = clock
        self._measure_seconds = 0.0  # this step's
        self._step_started: float | None = None
        self._handles: list[Any] = []
        # FSDP2 (ZeRO-2) computes each gradient on an unsharded copy of the parameter and
        # reduce-scatters it at once: the micro-batch's whole local gradient exists only on that
        # copy, which FSDP2 makes at the first forward and reuses. Its hooks go there.
        self._fsdp_params = _fsdp_params(model) if measure else []
        self._hooked: set[int] = set()
        if self._fsdp_params:
            self._handles.append(model.register_forward_hook(self._hook_unsharded))
        elif measure:
            self._handles = [p.register_hook(self._on_grad) for p in self.params]
        if follower is not None:
            follower.set_batch_size(self.batch_size)

    @property
    def k(self) -> int:
        """Micro-batches per optimizer step."""
        return self._k

    @property
    def noise_scale(self) -> float | None:
        """The current B_noise estimate in items, or None before enough steps."""
        return self.estimator.estimate

    @property
    def noise_scale_error(self) -> float | None:
        """The estimate's standard error relative to it (see
        :attr:`GradientNoiseScale.relative_error`)."""
        return self.estimator.relative_error

    @property
    def batch_size(self) -> int:
        """The effective batch size in items: ``k * micro_batch_size``."""
        return self._k * self.micro_batch_size

    def groups(self, micro_batches: Iterable[Any]) -> Iterator[list[Any]]:
        """Group an iterable of micro-batches into lists of ``k`` (the last may be shorter).

        ``k`` is read again before each group, so a change made by :meth:`step` applies to the
        next group.
        """
        group: list[Any] = []
        for item in micro_batches:
            group.append(item)
            if len(group) >= self._k:
                yield group
                group = []
        if group:
            yield group

    @contextlib.contextmanager
    def micro_batch(self, items: int) -> Iterator[None]:
        """Wrap one micro-batch's forward and backward; ``items`` is its sample or token count."""
        if items < 1:
            raise ValueError(f"items must be >= 1, got {items!r}")
        if items > 2 * self.micro_batch_size:
            # B_noise comes out in the unit of `items`, and k divides it by micro_batch_size:
            # tokens against samples would set k wrong by the tokens per sample.
            raise ValueError(
                f"micro_batch(items={items}) holds more than twice micro_batch_size="
                f"{self.micro_batch_size}: count both in the same unit (samples or tokens)"
            )
        if self._current is not None:
            raise RuntimeError("micro_batch() contexts cannot be nested")
        if self._step_started is None:
            self._step_started = self._clock()
            self._this_step = self.measuring and self.steps % self.measure_every == 0
        self._current = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        try:
            yield
        finally:
            sq_norm, self._current = self._current, None
        self._items.append(items)
        self._sq_norms.append(sq_norm)

    def _on_grad(self, grad: torch.Tensor) -> None:
        # Autograd hands the hook this backward's gradient for one parameter, before it is added
        # into .grad: exactly the micro-batch's contribution.
        if self._current is not None and self._this_step:
            start = self._clock()
            norm = torch.linalg.vector_norm(grad.detach(), dtype=torch.float32)
            self._current += norm.double() ** 2
            self._measure_seconds += self._clock() - start

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> bool:
        """Finish the step: unscale, measure, clip, step the optimizer, zero the gradients, maybe
        change k.

        Args:
            optimizer: the optimizer to step.
            scaler: for fp16, a :class:`~drapps.train.MixedPrecision` or a
                ``torch.amp.GradScaler``. The gradients are unscaled before they are measured,
                and a step whose gradients overflowed is skipped (by the scaler), not measured.

        Returns:
            Whether the optimizer stepped (False for an overflowed fp16 step).
        """
        if not self._items:
            raise RuntimeError("step() called with no micro_batch() since the last step")
        amp = scaler if isinstance(scaler, MixedPrecision) else None
        grad_scaler = amp.scaler if amp is not None else scaler
        scaled = grad_scaler is not None and grad_scaler.is_enabled()
        scale = float(grad_scaler.get_scale()) if scaled else 1.0
        if scaled:
            _unscale_once(grad_scaler, optimizer)
        start = self._clock()
        finite = self._measure(scale) if self._this_step else True
        self._measure_seconds += self._clock() - start
        if self.max_grad_norm is not None and finite:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.grad_norm = float(norm)
        if amp is not None:
            stepped = amp.step(optimizer)
        elif scaled:
            stepped = step_scaler(grad_scaler, optimizer)
        else:
            # Unscaled non-finite gradients would corrupt the weights: skip, like GradScaler.
            stepped = finite
            if finite:
                optimizer.step()
            else:
                logger.warning(
                    "accumulation: non-finite gradients at step %d; step skipped", self.steps
                )
        optimizer.zero_grad(set_to_none=True)
        self._items, self._sq_norms = [], []
        self.steps += 1
        if self._step_started is not None and self._this_step:
            self.guard.record(self._measure_seconds, self._clock() - self._step_started)
        self._step_started, self._measure_seconds = None, 0.0
        self._check_overhead()
        if self._this_step:
            self._adapt()
        return stepped

    def _hook_unsharded(self, *_: Any) -> None:
        for fsdp_param in self._fsdp_params:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None and id(unsharded) not in self._hooked:
                self._hooked.add(id(unsharded))
                self._handles.append(unsharded.register_hook(self._on_grad))

    def _grad_sq_norm(self) -> torch.Tensor:
        """Squared norm of ``.grad``; of this rank's shards only where they are sharded."""
        total = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for p in self.params:
            if p.grad is not None:
                grad = _local(p.grad.detach())
                total += torch.linalg.vector_norm(grad, dtype=torch.float32).double() ** 2
        return total

    def _ranks(self) -> int:
        if self.distributed is False or not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size()

    def _measure(self, scale: float) -> bool:
        items = self._items
        total = sum(items)
        big = float(self._grad_sq_norm())
        # The hooks saw gradients of sum(losses) / total, scaled by the loss scale: micro-batch
        # i's mean gradient is its raw gradient times total / n_i, divided by the scale.
        raw = torch.stack(self._sq_norms).tolist()
        means = [r * (total / n) ** 2 / scale**2 for r, n in zip(raw, items, strict=True)]
        world = self._ranks()
        if world > 1:
            return self._measure_across_ranks(big, means, items, world)
        if not math.isfinite(big):
            self._previous = None
            return False
        if not all(math.isfinite(m) for m in means):
            self._previous = None
            return False
        if len(items) >= 2:
            small_batch = len(items) / sum(1.0 / n for n in items)
            self.estimator.update(sum(means) / len(means), small_batch, big, total)
        else:
            self._pair_with_previous(big, total)
        return True

    def _measure_across_ranks(
        self, big: float, means: list[float], items: list[int], world: int
    ) -> bool:
        """Every rank's micro-batches are the small batches, the rank-averaged gradient the
        big one; one all-reduce gives each rank the same pair (or the same skip)."""
        finite = math.isfinite(big) and all(math.isfinite(m) for m in means)
        # Sharded gradients (FSDP2): each rank holds a part of the big norm; replicated ones
        # (DDP): each holds all of it.
        big_part = big if self._fsdp_params else big / world
        totals = torch.tensor(
            [
                big_part if finite else 0.0,
                sum(means) if finite else 0.0,
                sum(1.0 / n for n in items),
                float(len(items)),
                1.0 / sum(items),
                0.0 if finite else 1.0,
            ],
            dtype=torch.float64,
            device=self.params[0].device,
        )
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        big, small_sum, inverse_sizes, count, inverse_totals, skipped = totals.tolist()
        if skipped > 0:
            return False
        # The big gradient is the equal-weight mean of the ranks' means: its noise is that of
        # a batch of world^2 / sum(1 / N_r) items (world * N with equal shares).
        self.estimator.update(
            small_sum / count, count / inverse_sizes, big, world * world / inverse_totals
        )
        return True

    def _pair_with_previous(self, sq_norm: float, items: int) -> None:
        flat = torch.cat(
            [p.grad.detach().float().flatten() for p in self.params if p.grad is not None]
        )
        if self._previous is None:
            self._previous = (flat, sq_norm, items)
            return
        prev_flat, prev_sq_norm, prev_items = self._previous
        self._previous = None
        if prev_flat.shape != flat.shape:
            return
        both = prev_items + items
        mean = (prev_flat * prev_items + flat * items).double() / both
        small_batch = 2.0 / (1.0 / prev_items + 1.0 / items)
        self.estimator.update(
            (prev_sq_norm + sq_norm) / 2.0, small_batch, float(mean.pow(2).sum()), both
        )

    def _adapt(self) -> None:
        wanted = self._wanted()
        if wanted is None:
            self._want_streak = 0  # not sure enough to count as evidence either way
            return
        ratio = wanted / self._k
        if ratio >= self.tolerance or ratio <= 1.0 / self.tolerance:
            self._want_streak += 1
        else:
            self._want_streak = 0
        if self._want_streak >= self.patience:
            low, high = self.estimator.interval() or (0.0, math.inf)
            logger.info(
                "accumulation: k %d -> %d (B_noise ~ %.0f items, %.0f..%.0f, micro-batch %d)",
                self._k,
                wanted,
                self.estimator.estimate,
                low,
                high,
                self.micro_batch_size,
            )
            self._k, self._want_streak = wanted, 0
            self._previous = None
            self.history.append((self.steps, wanted))
            if self.follower is not None:
                self.follower.set_batch_size(self.batch_size)

    def _wanted(self) -> int | None:
        """The k this step's estimate is evidence for (clipped to the bounds), or None."""
        estimate = self.estimator.estimate
        error = self.estimator.relative_error
        if estimate is None or error is None:
            return None
        if error <= self.max_relative_error:
            wanted = self.max_k if math.isinf(estimate) else round(estimate / self.micro_batch_size)
        else:
            bounds = self.estimator.interval()
            if bounds is None:
                return None
            low, high = bounds
            if low > self.batch_size:
                wanted = self.max_k if math.isinf(low) else math.floor(low / self.micro_batch_size)
            elif high < self.batch_size:
                wanted = math.ceil(high / self.micro_batch_size)
            else:
                return None
        return min(self.max_k, max(self.min_k, wanted))

    def _check_overhead(self) -> None:
        if not (self.measuring and self.measure_every == 1 and self.guard.verdict()):
            return
        every = math.ceil((self.guard.typical or math.inf) / self.guard.limit)
        if every <= MAX_MEASURE_EVERY:
            self.measure_every = every
            logger.warning(
                "accumulation: noise-scale measured on one step in %d from now on: %s",
                every,
                self.guard.reason,
            )
            return
        logger.warning(
            "accumulation: noise-scale measurement switched off, k stays %d: %s",
            self._k,
            self.guard.reason,
        )
        self.measuring = False

    @property
    def overhead(self) -> float:
        """Share of step time spent measuring the noise scale, over the steps it was measured
        (it stops changing once the measurement is switched off)."""
        return self.guard.share

    @property
    def switched_off(self) -> str | None:
        """Why the measurement was thinned (:attr:`measure_every`) or switched off, in words;
        None while it runs on every step."""
        return self.guard.reason

    def close(self) -> None:
        """Remove the gradient hooks; the object then only groups and steps."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.measuring = self._this_step = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "k": self._k,
            "steps": self.steps,
            "measuring": self.measuring,
            "measure_every": self.measure_every,
            "estimator": self.estimator.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._k = int(state["k"])
        self.steps = int(state["steps"])
        self.measuring = bool(state["measuring"])
        self.measure_every = int(state.get("measure_every", 1))
        self.estimator.load_state_dict(state["estimator"])
        if self.follower is not None:
            self.follower.set_batch_size(self.batch_size)


def _unscale_once(grad_scaler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Unscale the gradients unless the caller already did (GradScaler refuses a second time)."""
    try:
        grad_scaler.unscale_(optimizer)
    except RuntimeError as exc:
        if "already been called" not in str(exc):
            raise
        logger.debug("gradients were already unscaled for this step")


def _fsdp_params(model: nn.Module) -> list[Any]:
    """The FSDP2 parameters of ``model`` (empty when it is not sharded by ``fully_shard``)."""
    found: list[Any] = []
    for module in model.modules():
        state_of = getattr(module, "_get_fsdp_state", None)
        if state_of is None:
            continue
        group = getattr(state_of(), "_fsdp_param_group", None)
        found += list(getattr(group, "fsdp_params", ()) or ())
    return found


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local part of a DTensor (a sharded gradient), else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor
