"""The simulator's sample cache: what fits is hit after the first epoch, codecs trade size for
decode time, and the heuristic's codec rule picks a good one."""

from __future__ import annotations

import pytest

from drapps.sim import PipelineModel, Scenario, Simulator
from drapps.sim.cache import CacheModel, CodecModel
from drapps.sim.run import simulate

# Per-sample sizes and costs as the real cache profiled them on the image workload's photos.
CODECS = (
    CodecModel("none", 600e3, 0.0004, 0.0002),
    CodecModel("zstd", 429e3, 0.0035, 0.0008),
    CodecModel("jpeg", 57e3, 0.0045, 0.0010),
)


def pipeline(budget_samples: int | None, codec: str | None = None) -> PipelineModel:
    cache = None
    if budget_samples is not None:
        budget = int(budget_samples * 600e3)
        cache = CacheModel(samples=4000, budget_bytes=budget, codecs=CODECS, codec=codec)
    # 4 ms of cacheable work per sample (fetch + decode), 1 ms after the cache (crop, flip).
    return PipelineModel(cores=2, batch_size=32, cpu_s=32 * 0.005, step_s=0.001, cache=cache)


def rate(budget_samples: int | None, codec: str | None = None, move: bool = False) -> float:
    run = simulate(
        Scenario(pipeline(budget_samples, codec)), "heuristic", duration=90, move_codec=move
    )
    return run.throughput


def test_epochs_after_the_first_run_from_the_cache() -> None:
    sim = Simulator(Scenario(pipeline(4000)), workers=2)
    sim.run_until(5)
    first = sim.observe()
    assert first.codec == "none" and first.cache_hit_rate == 0 and first.cache_make_ms > 0
    sim.run_until(60)
    sim.observe()
    sim.run_until(70)
    later = sim.observe()
    assert later.cache_hit_rate == pytest.approx(1.0)
    assert later.throughput > 2.5 * first.throughput
    assert later.cache_held_bytes == pytest.approx(4000 * 600e3, rel=1e-6)
    assert set(later.cache_profile) == {"none", "zstd", "jpeg"}


def test_a_quarter_of_the_dataset_fits_and_is_hit_a_quarter_of_the_time() -> None:
    sim = Simulator(Scenario(pipeline(1000)), workers=2)
    sim.run_until(60)
    sim.observe()
    sim.run_until(70)
    state = sim.observe()
    assert state.cache_hit_rate == pytest.approx(0.25, abs=0.01)
    assert state.cache_not_admitted == pytest.approx(1.0)


def test_the_codec_rule_beats_every_fixed_codec_but_the_one_it_picks() -> None:
    fixed = {codec: rate(1000, codec) for codec in ("none", "zstd", "jpeg")}
    chosen = rate(1000, move=True)
    assert fixed["jpeg"] > fixed["none"]  # the small entries fit the whole dataset
    assert chosen > 1.3 * fixed["none"] and chosen >= 0.9 * fixed["jpeg"]


def test_a_codec_change_re_encodes_entries_as_they_are_read() -> None:
    sim = Simulator(Scenario(pipeline(4000)), workers=2)
    sim.run_until(30)
    assert sim._cache is not None and sim._cache.entries["none"] == pytest.approx(4000)
    sim.set_codec("zstd")
    sim.run_until(60)
    assert sim._cache.entries.get("zstd", 0) > 3900 and sim.codec == "zstd"
    with pytest.raises(ValueError, match=r"codec must be one of \['none', 'zstd', 'jpeg'\]"):
        sim.set_codec("lz4")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"samples": 0}, "samples >= 1"),
        ({"codecs": ()}, "at least one codec"),
        ({"make_share": 1.5}, "make_share must be in"),
        ({"codec": "brotli"}, "codec must be one of"),
    ],
)
def test_bad_cache_models_are_named(kwargs: dict, match: str) -> None:
    base = {"samples": 10, "budget_bytes": 100, "codecs": CODECS}
    with pytest.raises(ValueError, match=match):
        CacheModel(**{**base, **kwargs})
