"""GradientNoiseScale: the two-batch estimator, alone and fed by AdaptiveAccumulation's hooks."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import linear_regression_batches, regression_b_noise

from drapps.train import AdaptiveAccumulation, GradientNoiseScale


def bounds_of(gns: GradientNoiseScale) -> tuple[float, float]:
    bounds = gns.interval()
    assert bounds is not None
    return bounds


def test_one_exact_pair_recovers_both_terms() -> None:
    gns = GradientNoiseScale(min_updates=1)
    # |G|^2 = 1, tr(Sigma) = 2: E|G_b|^2 = 1 + 2/b gives 3.0 at b=1 and 1.5 at B=4.
    gns.update(small_sq_norm=3.0, small_batch=1, big_sq_norm=1.5, big_batch=4)
    assert gns.gradient_sq_norm == pytest.approx(1.0)
    assert gns.trace == pytest.approx(2.0)
    assert gns.estimate == pytest.approx(2.0)


def test_no_estimate_before_min_updates_and_inf_when_noise_swamps_signal() -> None:
    gns = GradientNoiseScale(min_updates=2)
    gns.update(3.0, 1, 1.5, 4)
    assert gns.estimate is None
    gns.update(1.0, 1, 2.0, 4)  # the big batch's norm exceeds the small: |G|^2 estimate > 0
    assert gns.estimate is not None
    swamped = GradientNoiseScale(min_updates=1)
    swamped.update(small_sq_norm=1.0, small_batch=1, big_sq_norm=0.1, big_batch=2)
    assert swamped.estimate == math.inf


def test_ratio_of_averages_not_average_of_ratios() -> None:
    gns = GradientNoiseScale(beta=0.5, min_updates=1)
    gns.update(3.0, 1, 1.5, 4)  # |G|^2 1, trace 2: ratio 2
    gns.update(5.0, 1, 3.5, 4)  # |G|^2 3, trace 2: ratio 2/3
    # EMA weights 1/3 and 2/3: |G|^2 averages 7/3, the trace 2, so the estimate is 6/7; the
    # average of the two ratios would be 10/9.
    assert gns.estimate == pytest.approx(6 / 7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"small_sq_norm": 1.0, "small_batch": 4, "big_sq_norm": 1.0, "big_batch": 4},
            "small_batch",
        ),
        (
            {"small_sq_norm": math.nan, "small_batch": 1, "big_sq_norm": 1.0, "big_batch": 4},
            "finite",
        ),
    ],
)
def test_bad_updates_are_named(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GradientNoiseScale().update(**kwargs)


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="beta"):
        GradientNoiseScale(beta=1.0)
    with pytest.raises(ValueError, match="min_updates"):
        GradientNoiseScale(min_updates=0)


def test_state_dict_round_trip() -> None:
    gns = GradientNoiseScale(min_updates=1)
    gns.update(3.0, 1, 1.5, 4)
    other = GradientNoiseScale(min_updates=1)
    other.load_state_dict(gns.state_dict())
    assert other.estimate == gns.estimate


@pytest.mark.parametrize(
    "sizes",
    [[8, 8, 8, 8], [8, 8, 5], [8]],
    ids=["k4", "uneven-last", "k1-paired-steps"],
)
def test_estimate_lands_within_20_percent_of_analytic_b_noise(sizes: list[int]) -> None:
    dim, distance_sq, noise_var = 10, 1.0, 1.0
    expected = regression_b_noise(distance_sq, noise_var, dim)  # 21 items
    model = torch.nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = math.sqrt(distance_sq)  # w* = 0, so d = w
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # hold w: the true B_noise is fixed
    acc = AdaptiveAccumulation(
        model,
        micro_batch_size=8,
        min_k=len(sizes),
        max_k=len(sizes),
        estimator=GradientNoiseScale(beta=0.995),
        max_overhead=math.inf,
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(1000):
        group = linear_regression_batches(g, sizes, dim)
        items = sum(len(y) for _, y in group)
        for x, y in group:
            with acc.micro_batch(len(y)):
                (0.5 * (model(x) - y).square().sum() / items).backward()
        acc.step(optimizer)
    assert acc.noise_scale == pytest.approx(expected, rel=0.2)


def test_the_reported_error_covers_the_true_b_noise_as_often_as_it_says() -> None:
    # B_noise 500, 4 micro-batches of 32: readings after 300 steps, three seeds.
    dim = 10
    noise_var = 499 / dim - 1.0
    expected = regression_b_noise(1.0, noise_var, dim)
    covered, errors = [], []
    for seed in range(3):
        model = torch.nn.Linear(dim, 1, bias=False)
        with torch.no_grad():
            model.weight.zero_()
            model.weight[0, 0] = 1.0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        acc = AdaptiveAccumulation(model, 32, min_k=4, max_k=4, max_overhead=math.inf)
        g = torch.Generator().manual_seed(seed)
        for step in range(600):
            for x, y in linear_regression_batches(g, [32] * 4, dim):
                with acc.micro_batch(32):
                    (0.5 * (model(x) - y * math.sqrt(noise_var)).square().sum() / 128).backward()
            acc.step(optimizer)
            if step >= 300:
                low, high = bounds_of(acc.estimator)
                covered.append(low <= expected <= high)
                error = acc.noise_scale_error
                assert error is not None
                errors.append(error)
    assert sum(covered) / len(covered) >= 0.8  # a 95% interval; 99% measured over 1,500 steps
    assert 0.05 < sorted(errors)[len(errors) // 2] < 0.3  # +-17% typical at the default beta


def test_the_error_is_none_before_min_updates_and_inf_without_signal() -> None:
    gns = GradientNoiseScale(min_updates=2)
    assert gns.relative_error is None and gns.interval() is None
    gns.update(small_sq_norm=1.0, small_batch=1, big_sq_norm=1.0, big_batch=4)  # |G|^2 = 1
    gns.update(small_sq_norm=1.0, small_batch=1, big_sq_norm=2.0, big_batch=4)  # |G|^2 = 2.33
    assert gns.relative_error == math.inf
    # tr(Sigma) averages 0 and -1.33: zero within its noise, so B_noise is near 0. The ratio's
    # relative error cannot say so, but the interval can.
    low, high = bounds_of(gns)
    assert low == 0.0 and 0.0 < high < 1.0
    # |G|^2 averaged below zero with no spread: no B_noise in [0, inf] fits, so no claim.
    swamped = GradientNoiseScale(min_updates=1)
    swamped.update(small_sq_norm=1.0, small_batch=1, big_sq_norm=0.1, big_batch=2)
    assert swamped.interval() == (0.0, math.inf)


def linear_test(gns: GradientNoiseScale, b_noise: float) -> float:
    """|tr(Sigma) - B |G|^2| over its standard error: B is in the interval where this <= z."""
    spread = gns._spread()
    assert spread is not None
    s, t, var_s, var_t, cov = spread
    variance = var_t - 2.0 * b_noise * cov + b_noise * b_noise * var_s
    return abs(t - b_noise * s) / math.sqrt(variance)


@pytest.mark.parametrize(
    ("signal", "trace", "noise"),
    [(1.0, 8.0, 0.2), (0.05, 8.0, 1.0), (0.0, 8.0, 1.0), (1.0, 8.0, 3.0), (0.0, 0.5, 3.0),
     (1.0, 0.2, 0.5)],
    ids=["resolved", "lost-in-noise", "no-signal", "noisier", "nothing", "trace-near-zero"],
)  # fmt: skip
def test_the_interval_is_where_the_linear_test_accepts_b_noise(
    signal: float, trace: float, noise: float
) -> None:
    # Readings from E|G_b|^2 = signal + trace / b, with noise: the interval is Fieller's, the B
    # in [0, inf] whose |trace - B sq_norm| is within z = 1.96 of its standard error (the
    # convex hull of them, where those are two pieces).
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        gns = GradientNoiseScale(beta=0.9)
        for _ in range(30):
            small, big = (float(v) for v in noise * torch.randn(2, generator=g))
            gns.update(signal + trace + small, 1, signal + trace / 4 + 0.5 * big, 4)
        low, high = bounds_of(gns)
        for end in (low, high):
            if 0.0 < end < math.inf:
                assert linear_test(gns, end) == pytest.approx(1.96, rel=1e-6), trial
        for b_noise in [0.0] + [10.0 ** (e / 4.0) for e in range(-8, 17)]:
            if linear_test(gns, b_noise) <= 1.96:
                assert low <= b_noise <= high, (trial, b_noise, low, high)


def test_the_interval_bounds_a_large_b_noise_from_below_when_the_error_is_large() -> None:
    # B_noise 500 from one micro-batch of 8 a step, consecutive steps paired (8 against 16):
    # |G|^2 is lost in the noise, so the ratio's relative error is about 1.5 and the
    # estimate swings by hundreds, yet tr(Sigma) is well measured and bounds it from below.
    dim = 10
    noise_var = 499 / dim - 1.0
    expected = regression_b_noise(1.0, noise_var, dim)
    model = torch.nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = 1.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    acc = AdaptiveAccumulation(model, 8, max_k=1, max_overhead=math.inf)
    g = torch.Generator().manual_seed(0)
    covered, above_batch, errors = [], [], []
    for step in range(1000):
        for x, y in linear_regression_batches(g, [8], dim):
            with acc.micro_batch(8):
                (0.5 * (model(x) - y * math.sqrt(noise_var)).square().sum() / 8).backward()
        acc.step(optimizer)
        if step >= 300:
            low, high = bounds_of(acc.estimator)
            covered.append(low <= expected <= high)
            above_batch.append(low > 16)
            error = acc.noise_scale_error
            assert error is not None
            errors.append(error)
    # Over the 0.25 that makes AdaptiveAccumulation go to the estimate: no use to that gate.
    assert sorted(errors)[len(errors) // 2] > 0.25
    assert sum(covered) / len(covered) >= 0.8  # 93% measured over 2,700 steps, three seeds
    assert sum(above_batch) / len(above_batch) >= 0.9
