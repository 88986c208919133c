"""One epoch's iterator over any engine: what it delivers, and what superseding it does."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import drapps


class Slow:
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        time.sleep(0.01)
        return i


class SlowStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 40, step):
            time.sleep(0.01)
            yield i


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset", [Slow, SlowStream])
def test_a_new_iterator_never_loses_a_batch_to_the_one_it_superseded(
    workers: int, dataset: type
) -> None:
    """The old iterator, inside next() in another thread, took the new epoch's first batch
    before it saw that it had been superseded (4 trials of 4)."""
    with drapps.Loader(dataset(), batch_size=4, num_workers=workers, seed=0) as loader:
        old = iter(loader)
        next(old)
        ended: list[BaseException] = []

        def pull() -> None:
            try:
                while True:
                    next(old)
            except (StopIteration, RuntimeError) as exc:
                ended.append(exc)

        puller = threading.Thread(target=pull)
        puller.start()
        time.sleep(0.02)  # the puller is inside next()
        got = [x for batch in iter(loader) for x in batch.tolist()]
        puller.join(timeout=30)
    assert sorted(got) == list(range(40))
    assert isinstance(ended[0], StopIteration) or "superseded" in str(ended[0])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset", [Slow, SlowStream])
def test_a_checkpoint_after_the_last_batch_resumes_at_the_end_of_its_epoch(
    workers: int, dataset: type
) -> None:
    """Taken once the loop holds every batch of an epoch but before its end, a checkpoint
    pointed at the next epoch: the resumed ``for batch in loader`` ran that one as the rest
    of this one, and the loop made an epoch more than it was told."""
    with drapps.Loader(dataset(), batch_size=8, num_workers=workers, seed=0) as first:
        it = iter(first)
        epoch0: list[int] = []
        while len(epoch0) < 40:  # every batch, but not the epoch's end
            epoch0 += next(it).tolist()
        state = first.state_dict()
        expected_epoch1 = [x for batch in first for x in batch.tolist()]
    assert sorted(epoch0) == list(range(40))
    with drapps.Loader(dataset(), batch_size=8, num_workers=workers, seed=0) as again:
        again.load_state_dict(state)
        assert list(again) == []  # the rest of epoch 0
        assert [x for batch in again for x in batch.tolist()] == expected_epoch1


class _Drawing(torch.utils.data.Sampler[int]):
    """Draws its order from torch's generator as its first key is asked for (as torch's
    RandomSampler does), or fails then."""

    def __init__(self, n: int, fail: bool = False) -> None:
        self.n, self.fail = n, fail

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self.fail:
            raise LookupError("the sampler has nothing to draw from")
        yield from torch.randperm(self.n).tolist()


@pytest.mark.parametrize("workers", [0, "auto"])
def test_a_checkpoint_before_the_first_batch_holds_the_order_then_drawn(
    workers: int | str,
) -> None:
    """Without workers the order is drawn at the first next(); a checkpoint taken before it
    draws it, so the resumed run's epoch is the one the loop then gets, whatever torch's
    generator does in between."""
    kwargs = {"batch_size": 4, "sampler": _Drawing(12), "num_workers": workers}
    with drapps.Loader(list(range(12)), **kwargs) as loader:
        torch.manual_seed(0)
        it = iter(loader)
        state = loader.state_dict()
        torch.rand(5)  # after the checkpoint: the order is drawn already
        expected = [b.tolist() for b in it]
    assert sorted(key for batch in expected for key in batch) == list(range(12))
    with drapps.Loader(list(range(12)), **kwargs) as resumed:
        resumed.load_state_dict(state)
        torch.manual_seed(1)
        assert [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize("workers", [0, "auto"])
def test_an_iterator_let_go_of_before_its_first_batch_is_checkpointed_with_its_order(
    workers: int | str,
) -> None:
    """A loop that breaks out before its first batch, then saves: the checkpoint draws the
    epoch's order then, as it would with the iterator held, so the run resumed in another
    process (another torch RNG) has that epoch, not one it draws anew."""
    import gc

    kwargs = {"batch_size": 4, "sampler": _Drawing(12), "num_workers": workers}
    with drapps.Loader(list(range(12)), **kwargs) as loader:
        torch.manual_seed(0)
        expected = [b.tolist() for b in loader]
        torch.manual_seed(0)
        it = iter(loader)
        del it
        gc.collect()
        state = loader.state_dict()
        assert loader.state_dict() == state  # drawn once
    assert state["batches"] == expected
    with drapps.Loader(list(range(12)), **kwargs) as resumed:
        resumed.load_state_dict(state)
        torch.manual_seed(1)
        assert [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize("workers", [0, "auto"])
def test_a_failing_sampler_raises_from_next_not_from_a_checkpoint_before_it(
    workers: int | str,
) -> None:
    """A checkpoint that draws a failing sampler's order saves the epoch at its start (with
    ``workers=0``, with the batches the sampler gave before it failed: none); the loop's
    next() raises the sampler's error, then the epoch is over."""
    with drapps.Loader(list(range(3)), sampler=_Drawing(3, fail=True), workers=workers) as loader:
        it = iter(loader)
        state = loader.state_dict()
        assert (state["epoch"], state["next_batch"]) == (0, 0)
        assert state.get("batches", []) == []
        with pytest.raises(LookupError, match="nothing to draw from"):
            next(it)
        assert list(it) == []
