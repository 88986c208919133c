"""AdaptiveAccumulation: exact gradients for any micro-batching, k with hysteresis, AMP."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from helpers import linear_regression_batches, regression_b_noise, tiny_mlp

from drapps.train import AdaptiveAccumulation, GradientNoiseScale, MixedPrecision


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    found = []
    for p in model.parameters():
        assert p.grad is not None
        found.append(p.grad.detach().clone())
    return found


class GradRecorder(torch.optim.SGD):
    """An optimizer that records the gradients it is stepped with and changes nothing."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.seen.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])


def test_k_micro_batches_give_the_big_batch_gradient_with_an_uneven_last_one() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(21, 6, generator=g), torch.randint(0, 3, (21,), generator=g)
    big = tiny_mlp()
    torch.nn.functional.cross_entropy(big(x), y).backward()
    model = tiny_mlp()
    optimizer = GradRecorder(model.parameters())
    acc = AdaptiveAccumulation(model, micro_batch_size=8, min_k=3, max_k=3)
    micro = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 21, 8)]  # 8, 8, 5
    (group,) = list(acc.groups(micro))
    items = sum(len(t) for _, t in group)
    for xb, yb in group:
        with acc.micro_batch(len(yb)):
            loss = torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum") / items
            loss.backward()
    assert acc.step(optimizer)
    for ours, want in zip(optimizer.seen[0], grads(big), strict=True):
        torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())  # zeroed for the next step


def test_token_count_normalisation_matches_one_padded_batch() -> None:
    # Language-model micro-batches with different numbers of real (unpadded) tokens.
    torch.manual_seed(1)
    vocab, dim = 11, 8
    embed = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, vocab))
    ids = torch.randint(0, vocab, (6, 5))
    labels = torch.randint(0, vocab, (6, 5))
    labels[0, 2:] = -100  # padding, ignored
    labels[4, 1:] = -100
    reference = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, vocab))
    reference.load_state_dict(embed.state_dict())
    logits = reference(ids)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    optimizer = GradRecorder(embed.parameters())
    acc = AdaptiveAccumulation(embed, micro_batch_size=10, min_k=3, max_k=3)
    micro = [(ids[i : i + 2], labels[i : i + 2]) for i in range(0, 6, 2)]
    tokens = [int((lb != -100).sum()) for _, lb in micro]
    assert len(set(tokens)) > 1
    for (xb, lb), n in zip(micro, tokens, strict=True):
        with acc.micro_batch(n):
            out = embed(xb).flatten(0, 1)
            loss = torch.nn.functional.cross_entropy(out, lb.flatten(), reduction="sum")
            (loss / sum(tokens)).backward()
    acc.step(optimizer)
    for ours, want in zip(optimizer.seen[0], grads(reference), strict=True):
        torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)


class FixedEstimate(GradientNoiseScale):
    """An estimator whose B_noise is set by the test."""

    def __init__(self, value: float | None) -> None:
        super().__init__()
        self.value = value

    def update(self, *args: float) -> None:
        self.updates += 1

    @property
    def estimate(self) -> float | None:
        return self.value

    @property
    def relative_error(self) -> float | None:
        return None if self.value is None else self.error

    def interval(self, z: float = 1.96) -> tuple[float, float] | None:
        return None if self.value is None else self.bounds

    error = 0.0
    bounds = (0.0, math.inf)


class BatchLog:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def set_batch_size(self, batch_size: int) -> None:
        self.sizes.append(batch_size)


def run_steps(acc: AdaptiveAccumulation, model: torch.nn.Module, steps: int) -> list[int]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    g = torch.Generator().manual_seed(0)
    ks = []
    for _ in range(steps):
        for _ in range(acc.k):
            with acc.micro_batch(4):
                model(torch.randn(4, 6, generator=g)).square().mean().backward()
        acc.step(optimizer)
        ks.append(acc.k)
    return ks


def test_k_follows_the_noise_scale_only_after_patience_and_within_bounds() -> None:
    model = tiny_mlp()
    estimator = FixedEstimate(40.0)  # wants 40 / 4 = 10 micro-batches
    follower = BatchLog()
    acc = AdaptiveAccumulation(
        model, 4, max_k=8, patience=3, estimator=estimator, follower=follower, max_overhead=math.inf
    )
    assert follower.sizes == [4]
    assert run_steps(acc, model, 4) == [1, 1, 8, 8]  # clipped to max_k on the third step
    assert follower.sizes == [4, 32]
    estimator.value = 36.0  # wants 9 -> 8: within tolerance, no change
    assert run_steps(acc, model, 5) == [8] * 5
    estimator.value = 8.0  # wants 2: a 4x drop
    assert run_steps(acc, model, 3) == [8, 8, 2]
    assert acc.history == [(0, 1), (3, 8), (12, 2)]


def test_a_single_step_away_does_not_move_k() -> None:
    model = tiny_mlp()
    estimator = FixedEstimate(4.0)
    acc = AdaptiveAccumulation(
        model, 4, k=4, max_k=8, patience=3, estimator=estimator, max_overhead=math.inf
    )
    ks = []
    for value in [40.0, 40.0, 16.0, 40.0, 40.0, 16.0]:  # never 3 steps in a row away from 4
        estimator.value = value
        ks += run_steps(acc, model, 1)
    assert ks == [4] * 6


def measuring_k2(model: torch.nn.Module) -> AdaptiveAccumulation:
    """k fixed at 2 micro-batches of 4, estimating from the first step, never switched off."""
    return AdaptiveAccumulation(
        model,
        4,
        min_k=2,
        max_k=2,
        estimator=GradientNoiseScale(min_updates=1),
        max_overhead=math.inf,
    )


def test_fp16_loss_scaling_is_measured_unscaled_and_overflow_steps_are_skipped() -> None:
    def estimate(amp: MixedPrecision | None) -> tuple[float | None, list[bool]]:
        model = tiny_mlp()
        acc = measuring_k2(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        g = torch.Generator().manual_seed(0)
        stepped = []
        for step in range(4):
            for _ in range(2):
                with acc.micro_batch(4):
                    loss = model(torch.randn(4, 6, generator=g)).square().sum() / 8
                    if amp is None:
                        loss.backward()
                    else:
                        amp.backward(loss)
            if step == 2 and amp is not None:
                next(model.parameters()).grad[0, 0] = math.inf  # an fp16 overflow
            stepped.append(acc.step(optimizer, amp))
        return acc.noise_scale, stepped

    plain, plain_steps = estimate(None)
    scaled, scaled_steps = estimate(MixedPrecision("fp16", "cpu", init_scale=2.0**10))
    assert plain_steps == [True] * 4
    assert scaled_steps == [True, True, False, True]
    assert scaled is not None and plain is not None
    # The overflowed step is left out of the scaled run's average, so compare loosely; a missed
    # unscale would be off by the scale squared (2**20).
    assert scaled == pytest.approx(plain, rel=0.5)


def test_measurement_switches_itself_off_when_it_costs_too_much() -> None:
    model = tiny_mlp()
    acc = AdaptiveAccumulation(
        model, 4, min_k=2, max_k=4, patience=3, max_overhead=1e-9, overhead_window=3
    )
    run_steps(acc, model, 5)
    assert not acc.measuring
    assert acc.overhead > 1e-9
    k = acc.k
    run_steps(acc, model, 3)
    assert acc.k == k


def test_fixed_accumulation_registers_no_hooks() -> None:
    model = tiny_mlp()
    acc = AdaptiveAccumulation(model, 4, min_k=2, max_k=2, measure=False)
    assert run_steps(acc, model, 3) == [2, 2, 2]
    assert acc.noise_scale is None


def test_misuse_is_named() -> None:
    model = tiny_mlp()
    with pytest.raises(ValueError, match="micro_batch_size"):
        AdaptiveAccumulation(model, 0)
    with pytest.raises(ValueError, match="min_k"):
        AdaptiveAccumulation(model, 4, min_k=3, max_k=2)
    with pytest.raises(ValueError, match="tolerance"):
        AdaptiveAccumulation(model, 4, tolerance=1.0)
    with pytest.raises(ValueError, match="no parameters"):
        AdaptiveAccumulation(torch.nn.ReLU(), 4)
    acc = AdaptiveAccumulation(model, 4)
    with pytest.raises(RuntimeError, match="no micro_batch"):
        acc.step(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="items"), acc.micro_batch(0):
        pass
    with acc.micro_batch(4), pytest.raises(RuntimeError, match="nested"), acc.micro_batch(4):
        pass


def test_state_dict_round_trip_restores_k_and_the_estimate() -> None:
    model = tiny_mlp()
    acc = measuring_k2(model)
    run_steps(acc, model, 3)
    other = AdaptiveAccumulation(
        tiny_mlp(), 4, min_k=1, max_k=4, estimator=GradientNoiseScale(min_updates=1)
    )
    other.load_state_dict(acc.state_dict())
    assert (other.k, other.noise_scale, other.steps) == (acc.k, acc.noise_scale, acc.steps)


class NormRecorder(torch.optim.SGD):
    """An optimizer that records the norm of the gradient it is stepped with, changing nothing."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.norms: list[float] = []

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clipping_leaves_the_noise_scale_exact_and_unscales_once(precision: str) -> None:
    dim = 10
    expected = regression_b_noise(1.0, 1.0, dim)  # 21 items
    model = torch.nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = 1.0
    optimizer = NormRecorder(model.parameters())
    amp = MixedPrecision(precision, "cpu", init_scale=2.0**8)  # type: ignore[arg-type]
    acc = AdaptiveAccumulation(
        model, micro_batch_size=8, min_k=4, max_k=4, max_overhead=math.inf,
        estimator=GradientNoiseScale(beta=0.995), max_grad_norm=0.5,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    for _ in range(600):
        group = linear_regression_batches(g, [8, 8, 8, 8], dim)
        for x, y in group:
            with acc.micro_batch(len(y)):
                amp.backward(0.5 * (model(x) - y).square().sum() / 32)
        assert acc.step(optimizer, amp)
    # The measured B_noise is that of the unclipped gradients (clipping binds on every step:
    # |G_32| is about 1.3) ...
    assert acc.noise_scale == pytest.approx(expected, rel=0.2)
    assert acc.grad_norm is not None and acc.grad_norm > 1.0
    # ... and the optimizer steps with the clipped, unscaled gradient.
    assert max(optimizer.norms) == pytest.approx(0.5, rel=1e-3)


def test_max_grad_norm_is_checked() -> None:
    with pytest.raises(ValueError, match="max_grad_norm must be > 0 or None, got 0"):
        AdaptiveAccumulation(tiny_mlp(), 4, max_grad_norm=0)


def test_a_caller_that_unscaled_already_is_not_unscaled_twice() -> None:
    model = tiny_mlp()
    acc = measuring_k2(model)
    amp = MixedPrecision("fp16", "cpu", init_scale=2.0**8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(2):
        with acc.micro_batch(4):
            amp.backward(model(torch.randn(4, 6)).square().sum() / 8)
    amp.unscale(optimizer)  # e.g. to look at the gradients
    assert acc.step(optimizer, amp)  # GradScaler would refuse a second unscale_


class TickingClock:
    """A clock that moves only when read (``tick`` seconds per read) or advanced by the test:
    every timed interval inside the accumulator is then a known number of ticks."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def timed_run(
    tick: float,
    compute_s: list[float],
    max_overhead: float = 0.1,
    measured: list[bool] | None = None,
) -> AdaptiveAccumulation:
    """Steps of two micro-batches; micro-batch compute takes ``compute_s[step]`` of fake time.
    ``measured`` gets, for each step, whether the noise scale was measured on it."""
    model = tiny_mlp()
    clock = TickingClock(tick)
    acc = AdaptiveAccumulation(
        model, 4, min_k=2, max_k=2, max_overhead=max_overhead, overhead_window=20, clock=clock
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    for seconds in compute_s:
        updates = acc.estimator.updates
        for _ in range(2):
            with acc.micro_batch(4):
                clock.now += seconds / 2
                model(torch.randn(4, 6)).square().sum().backward()
        acc.step(optimizer)
        if measured is not None:
            measured.append(acc.estimator.updates > updates)
    return acc


def test_a_few_slow_steps_do_not_switch_the_measurement_off() -> None:
    # 6 parameters: 7 timed intervals of one tick per step. With 1 s of compute per step the
    # share is 0.7%; five steps where the machine stalls the measurement (compute 0.04 s: share
    # ~15%) are a minority and must not decide.
    steps = [1.0] * 30
    for i in (2, 5, 9, 13, 17):
        steps[i] = 0.04
    acc = timed_run(tick=1e-3, compute_s=steps)
    assert acc.measuring and acc.switched_off is None


def test_a_measurement_that_costs_too_much_is_made_on_fewer_steps_with_its_reason() -> None:
    # share ~26% on each of the 20 steps the guard watches: measured on one step in
    # ceil(0.26 / 0.1) = 3 from then on, so its cost is back under the limit and k still
    # follows the noise scale; later steps get 250x longer, which must not dilute the reported
    # share (it explains the decision)
    measured: list[bool] = []
    acc = timed_run(tick=1e-3, compute_s=[0.02] * 20 + [5.0] * 30, measured=measured)
    assert acc.measuring and acc.measure_every == 3
    assert all(measured[:20])
    assert [i for i, m in enumerate(measured) if m][20:] == list(range(21, 50, 3))
    assert acc.switched_off is not None and "over the 10% limit" in acc.switched_off
    assert 0.2 < acc.overhead < 0.3


def test_a_measurement_that_costs_far_too_much_is_switched_off() -> None:
    # ~26% against a 0.1% limit: one step in 260 would fit, more than MAX_MEASURE_EVERY
    measured: list[bool] = []
    acc = timed_run(tick=1e-3, compute_s=[0.02] * 30, max_overhead=0.001, measured=measured)
    assert not acc.measuring and not any(measured[20:])
    assert acc.switched_off is not None


def test_every_rank_reaches_the_same_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    from drapps.train import overhead

    # this rank's steps are cheap, but the ranks' mean is over the limit: all switch off
    monkeypatch.setattr(overhead, "_mean_over_ranks", lambda value: (value + 0.5) / 2)
    guard = overhead.OverheadGuard(limit=0.1, window=4)
    for _ in range(4):
        guard.record(0.01, 1.0)
    assert guard.verdict() and guard.decided


def test_k_holds_while_the_estimate_is_unsure() -> None:
    model = tiny_mlp()
    estimator = FixedEstimate(40.0)  # wants 8 (max_k) micro-batches
    estimator.error = 0.6
    acc = AdaptiveAccumulation(
        model, 4, max_k=8, patience=3, estimator=estimator, max_overhead=math.inf
    )
    assert run_steps(acc, model, 6) == [1] * 6  # +-60%: not evidence
    estimator.error = 0.1
    assert run_steps(acc, model, 3) == [1, 1, 8]


def test_items_in_another_unit_than_the_micro_batch_size_are_refused() -> None:
    acc = AdaptiveAccumulation(tiny_mlp(), micro_batch_size=32)  # 32 sequences ...
    with pytest.raises(ValueError, match=r"micro_batch\(items=32768\) holds more than twice "
                       r"micro_batch_size=32: count both in the same unit"):  # fmt: skip
        with acc.micro_batch(32 * 1024):  # ... but 32 x 1,024 tokens counted
            pass


def regression_run(
    b_noise: float, dim: int, micro_batch_size: int, steps: int, seed: int
) -> tuple[AdaptiveAccumulation, list[tuple[int, float | None, tuple[float, float] | None]]]:
    """Train-free steps on 0.5 (w.x - y)^2 with a known B_noise, k chosen by the accumulator.

    Returns it and, for each change of k, the new batch size with the relative error and the
    interval that moved it."""
    noise_var = (b_noise - 1.0) / dim - 1.0  # |w - w*|^2 = 1
    assert noise_var >= 0.0 and regression_b_noise(1.0, noise_var, dim) == pytest.approx(b_noise)
    model = torch.nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = 1.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # hold w: B_noise stays known
    estimator = GradientNoiseScale()
    changes: list[tuple[int, float | None, tuple[float, float] | None]] = []

    class Witness:
        def set_batch_size(self, batch_size: int) -> None:
            changes.append((batch_size, estimator.relative_error, estimator.interval()))

    acc = AdaptiveAccumulation(
        model, micro_batch_size, max_k=16, estimator=estimator, follower=Witness(),
        max_overhead=1.0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        items = micro_batch_size * acc.k
        for x, y in linear_regression_batches(g, [micro_batch_size] * acc.k, dim):
            with acc.micro_batch(len(y)):
                (0.5 * (model(x) - y * math.sqrt(noise_var)).square().sum() / items).backward()
        acc.step(optimizer)
    return acc, changes[1:]  # the first is the starting batch


@pytest.mark.parametrize("seed", [0, 1])
def test_a_large_noise_scale_grows_k_on_its_lower_bound_while_its_error_is_large(
    seed: int,
) -> None:
    # B_noise 500 at micro-batches of 8: with k = 1 the estimate pairs batches of 8 and 16,
    # where |G|^2 is lost in the noise and the relative error stays near 1.5; tr(Sigma) is
    # well measured all the same, so the interval's lower bound is far above 8.
    acc, changes = regression_run(500.0, dim=10, micro_batch_size=8, steps=600, seed=seed)
    assert acc.k > 1
    ks = [k for _, k in acc.history]
    assert ks == sorted(ks)  # it only ever grew
    _, error, bounds = changes[0]
    assert error is not None and error > acc.max_relative_error  # the old gate was shut
    assert bounds is not None and bounds[0] > 8  # the lower bound opened it


@pytest.mark.parametrize("seed", [0, 1])
def test_a_noise_scale_below_the_micro_batch_never_grows_k(seed: int) -> None:
    acc, changes = regression_run(4.0, dim=3, micro_batch_size=8, steps=600, seed=seed)
    assert acc.history == [(0, 1)] and changes == []
    bounds = acc.estimator.interval()
    assert bounds is not None and bounds[1] < 8  # sure it is below: only min_k holds k at 1


@pytest.mark.parametrize(
    ("value", "straddling", "excluding", "moved_to"),
    [
        (64.0, (10.0, 200.0), (40.0, 200.0), 10),  # wants 16: grows only to floor(40 / 4)
        (4.0, (2.0, 20.0), (2.0, 8.0), 2),  # wants 1: shrinks only to ceil(8 / 4)
    ],
    ids=["grow", "shrink"],
)
def test_a_noisy_estimate_moves_k_only_when_its_interval_leaves_the_batch(
    value: float,
    straddling: tuple[float, float],
    excluding: tuple[float, float],
    moved_to: int,
) -> None:
    model = tiny_mlp()
    estimator = FixedEstimate(value)
    estimator.error = 0.6  # over max_relative_error: not sure enough to go to the estimate
    estimator.bounds = straddling  # around the batch of 4 x 4 = 16
    acc = AdaptiveAccumulation(
        model, 4, k=4, max_k=16, patience=3, estimator=estimator, max_overhead=math.inf
    )
    assert run_steps(acc, model, 20) == [4] * 20
    estimator.bounds = excluding
    assert run_steps(acc, model, 3) == [4, 4, moved_to]
