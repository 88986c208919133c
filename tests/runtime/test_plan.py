import pytest

from drapps.runtime.plan import Plan


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
