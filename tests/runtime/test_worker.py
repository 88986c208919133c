"""make_batch and collate as a worker runs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils import worker as torch_worker

from drapps.runtime.seeding import set_worker_info
from drapps.runtime.worker import BatchRecipe, collate


@pytest.fixture
def in_a_worker() -> Iterator[None]:
    set_worker_info(1, 2, 7, dataset=[])
    try:
        yield
    finally:
        torch_worker._worker_info = None


def test_default_collate_does_not_allocate_shared_memory_in_a_worker(in_a_worker: None) -> None:
    samples = [torch.zeros(3, 4, dtype=torch.uint8) for _ in range(5)]
    assert default_collate(samples).is_shared()  # what torch does in a DataLoader worker
    batch = collate(BatchRecipe([], None, default_collate, "raise"), samples)
    assert batch.shape == (5, 3, 4) and not batch.is_shared()  # drapps copies it into a slab
    assert get_worker_info() is not None and get_worker_info().id == 1  # restored


def test_a_users_collate_fn_sees_the_worker(in_a_worker: None) -> None:
    def ids(samples: list[int]) -> list[int | None]:
        info = get_worker_info()
        return [s + (info.id if info is not None else 100) for s in samples]

    assert collate(BatchRecipe([], None, ids, "raise"), [1, 2]) == [2, 3]
    assert collate(BatchRecipe([], None, ids, "raise", auto_collation=False), [[5]]) == [6]


def test_a_worker_answers_with_its_batch_collated_in_the_slab(in_a_worker: None) -> None:
    from drapps.runtime.transport import SlabArena, SlabWriter, unpack
    from drapps.runtime.worker import answer, pack_batch

    dataset = [(torch.full((3, 8, 8), i, dtype=torch.uint8), i) for i in range(6)]
    recipe = BatchRecipe(dataset, None, default_collate, "raise")
    writer = SlabWriter()
    arena = SlabArena(writer)
    seen: list[int | None] = []

    def pack(batch: object) -> object:
        seen.append(arena.offset_of(batch[0]))  # type: ignore[index]
        return pack_batch(batch, writer, arena)

    try:
        task = (0, 5, 0, 3, [4, 1, 2], 2, None, None)
        reply = answer(recipe, task, pack, None, arena)  # type: ignore[arg-type]
        assert reply[0] == "ok" and seen == [0]
        images, labels = unpack(reply[3])
        assert labels.tolist() == [4, 1, 2] and images[:, 0, 0, 0].tolist() == [4, 1, 2]
        # A user collate_fn keeps its own output, copied into a slab as before.
        mine = BatchRecipe(dataset, None, lambda s: [torch.stack([x for x, _ in s])], "raise")
        seen.clear()
        reply = answer(mine, task, pack, None, arena)  # type: ignore[arg-type]
        assert reply[0] == "ok" and seen == [None]
        assert unpack(reply[3])[0][:, 0, 0, 0].tolist() == [4, 1, 2]
    finally:
        writer.close()
