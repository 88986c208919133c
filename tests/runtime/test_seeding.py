import gc
import random

import numpy as np
import pytest
import torch

from drapps.runtime.seeding import (
    active_rng,
    clear_sample,
    op_stream,
    preserved_global_rngs,
    restore_states,
    sample_rng,
    sample_seed,
    sample_seed_for,
    saved_states,
    seed_sample,
    seed_sample_later,
)


def test_sample_seeds_differ_by_every_part() -> None:
    base = sample_seed_for(0, 0, 0)
    assert (
        len({base, sample_seed_for(1, 0, 0), sample_seed_for(0, 1, 0), sample_seed_for(0, 0, 1)})
        == 4
    )
    assert 0 <= base < 2**64


def test_seed_sample_makes_global_draws_repeatable() -> None:
    def draws() -> tuple[float, float, float, float]:
        seed_sample(sample_seed_for(3, 1, 7))
        out = (
            random.random(),
            float(np.random.rand()),
            float(torch.rand(1)),
            sample_rng().random(),
        )
        clear_sample()
        return out

    assert draws() == draws()


def test_sample_rng_is_one_stream_per_sample() -> None:
    seed_sample(42)
    first, second = sample_rng().random(), sample_rng().random()
    clear_sample()
    assert first != second


def test_a_seed_left_for_later_is_the_one_mixed_at_once() -> None:
    """A sample entered without reseeding has its seed mixed only when asked for: the same
    seed, generator and op streams, and the global RNGs untouched."""

    def inside(enter: object) -> tuple[int, float, float, float, float]:
        random.seed(5)
        enter()
        seed, draw, active = sample_seed(), sample_rng().random(), active_rng().random()
        with op_stream(2):
            op = sample_rng().random()
        clear_sample()
        return seed, draw, active, op, random.random()

    at_once = inside(lambda: seed_sample(sample_seed_for(3, 1, 7), reseed=False))
    later = inside(lambda: seed_sample_later(3, 1, 7))
    assert later == at_once
    assert later[0] == sample_seed_for(3, 1, 7)
    with pytest.raises(RuntimeError, match="only defined while"):
        sample_seed()  # left: nothing is owed to the next sample


def _numpy_draws() -> tuple[float, ...]:
    return (*np.random.standard_normal(3).tolist(), float(np.random.rand()))


@pytest.mark.parametrize("normals", [0, 1, 2, 3])
def test_preserved_rngs_keep_numpys_words_and_its_cached_gaussian(normals: int) -> None:
    # An odd count of legacy normal draws leaves one cached, which the raw words do not hold.
    def start() -> None:
        np.random.seed(5)
        np.random.standard_normal(normals)

    start()
    expected = _numpy_draws()
    start()
    with preserved_global_rngs():
        seed_sample(99)
        np.random.standard_normal()  # the sample leaves a cache of its own
        np.random.rand(7)
    assert _numpy_draws() == expected


def test_a_saved_numpy_state_goes_to_the_generator_in_place_after_another_replaced_it() -> None:
    # The raw bytes were copied from the first generator's memory: they are not written
    # there once it is gone, but set on the generator the program uses now.
    mt = np.random.get_bit_generator()
    np.random.seed(8)
    expected = float(np.random.rand())
    np.random.seed(8)
    saved = saved_states()
    try:
        np.random.set_bit_generator(np.random.MT19937(1))
        gc.collect()
        restore_states(saved)
        assert float(np.random.rand()) == expected
    finally:
        np.random.set_bit_generator(mt)


def test_preserved_rngs_keep_another_numpy_bit_generator() -> None:
    mt = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(3))
    try:
        expected = float(np.random.rand())
        np.random.set_bit_generator(np.random.PCG64(3))
        with preserved_global_rngs():
            np.random.rand(5)
        assert float(np.random.rand()) == expected
    finally:
        np.random.set_bit_generator(mt)


def test_outside_a_sample_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=r"only defined while a drapps\.Loader makes a sample"):
        sample_seed()
    with pytest.raises(RuntimeError):
        sample_rng()


def test_preserved_global_rngs_restores_the_callers_streams() -> None:
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with preserved_global_rngs():
        seed_sample(99)
        random.random(), np.random.rand(), torch.rand(1)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
