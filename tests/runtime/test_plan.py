import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, SubsetRandomSampler

from drapps.runtime.plan import DrawnPlan, KeyCounts, PassPlan, Plan, repeats_in
from drapps.runtime.sampling import drawn_as_needed


@pytest.mark.parametrize(
    ("n", "bs", "drop_last", "expected"),
    [(10, 3, False, 4), (10, 3, True, 3), (9, 3, True, 3), (0, 4, False, 0), (2, 4, True, 0)],
)
def test_length(n: int, bs: int, drop_last: bool, expected: int) -> None:
    assert len(Plan(n, bs, False, drop_last, 0, 0)) == expected


def test_batches_cover_every_index_once() -> None:
    plan = Plan(103, 8, True, False, 5, 2)
    seen = [i for b in range(len(plan)) for i in plan.batch(b)]
    assert sorted(seen) == list(range(103))
    assert len(plan.batch(len(plan) - 1)) == 103 % 8


def test_order_depends_on_seed_and_epoch_only() -> None:
    assert (
        Plan(50, 4, True, False, 1, 0).order.tolist()
        == Plan(50, 4, True, False, 1, 0).order.tolist()
    )
    assert (
        Plan(50, 4, True, False, 1, 0).order.tolist()
        != Plan(50, 4, True, False, 1, 1).order.tolist()
    )
    assert (
        Plan(50, 4, True, False, 1, 0).order.tolist()
        != Plan(50, 4, True, False, 2, 0).order.tolist()
    )
    assert Plan(50, 4, False, False, 1, 3).order.tolist() == list(range(50))


def test_bad_batch_id_and_fields() -> None:
    plan = Plan(10, 4, False, False, 0, 0)
    with pytest.raises(IndexError, match="batch_id must be in"):
        plan.batch(3)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        Plan(10, 0, False, False, 0, 0)


def _batches(seed: int) -> list[list[int]]:
    torch.manual_seed(seed)
    return [list(b) for b in BatchSampler(RandomSampler(range(100)), 8, False)]


def test_a_drawn_plan_draws_its_batches_as_they_are_needed_and_as_dataloader_does() -> None:
    expected = _batches(0)
    torch.manual_seed(0)
    source = iter(BatchSampler(RandomSampler(range(100)), 8, False))
    plan = DrawnPlan(source, 13, seed=1, epoch=0)
    torch.rand(7)  # the loop draws from torch's generator: the sampler drew its seed already
    assert len(plan._drawn) == 1  # only the first batch is drawn up front
    assert plan.batch(5) == expected[5] and len(plan._drawn) == 6
    assert [plan.batch(b) for b in range(13)] == expected
    with pytest.raises(IndexError, match=r"batch_id must be in \[0, 13\), got 13"):
        plan.batch(13)


def test_a_sampler_shorter_than_its_len_is_named() -> None:
    plan = DrawnPlan(iter([[0, 1], [2, 3]]), 3, seed=0, epoch=0)
    with pytest.raises(RuntimeError, match="gave 2 batches where its len\\(\\) promised 3"):
        plan.batch(2)


def test_only_torchs_own_samplers_without_a_generator_are_drawn_as_needed() -> None:
    data = range(10)
    assert drawn_as_needed(BatchSampler(RandomSampler(data), 4, False), True)
    assert drawn_as_needed(BatchSampler(SequentialSampler(data), 4, True), True)
    generator = torch.Generator()
    assert not drawn_as_needed(
        BatchSampler(RandomSampler(data, generator=generator), 4, False), True
    )
    assert not drawn_as_needed(BatchSampler(SubsetRandomSampler(list(data)), 4, False), True)
    assert not drawn_as_needed(RandomSampler(data), False)  # batch_size=None

    class Mine(BatchSampler):
        pass

    assert not drawn_as_needed(Mine(RandomSampler(data), 4, False), True)


def test_key_counts_give_a_pass_the_repeats_a_sampled_plan_counts() -> None:
    """Counted as each batch is drawn, small integer keys in an array, others (a huge or
    negative key, a string) in a dict from there on: the repeats of every batch are the ones
    counted over the whole epoch."""
    batches = [[3, 1, 3], [], [0, 5], [1, 2**40], [5, -1, 3], ["a", 5], ["a", 2**40]]
    whole = repeats_in(batches)
    assert whole is not None
    counts = KeyCounts()
    assert [counts.count(batch) for batch in batches] == list(whole)
    plan = PassPlan(iter(batches), len(batches), 0, 0)
    assert [plan.repeats_of(b) for b in range(len(batches))] == list(whole)
    assert plan.rest is None and len(plan) == len(batches)


def test_a_pass_plan_draws_each_batch_as_it_is_asked_for() -> None:
    """Nothing at first, then up to the batch asked for; a sampler that ends before its
    len() shortens the pass, and one past it goes on as an endless one."""
    given: list[int] = []

    def batches(n: int):  # type: ignore[no-untyped-def]
        for b in range(n):
            given.append(b)
            yield [b]

    plan = PassPlan(batches(3), 5, 0, 0)
    assert given == [] and plan.reaches(1) and given == [0, 1]
    assert not plan.reaches(3) and len(plan) == 3 and plan.rest is None
    longer = PassPlan(batches(4), 2, 0, 0)
    assert longer.batch(1) == [1] and longer.draw_all() is not None
    rest = longer.rest
    assert rest is not None and rest.first == 2 and rest.window(0).batches == ([2], [3])
