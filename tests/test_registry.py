"""The registry seam: one table per family, one error wording, members added from outside."""

from __future__ import annotations

import pytest
import torch

import drapps
from drapps.bench.scenarios import SCENARIOS
from drapps.bench.systems import SYSTEMS
from drapps.bench.workloads import WORKLOADS
from drapps.control import NOOP, POLICIES, Action, State
from drapps.reference.recipes import RECIPES
from drapps.registry import Registry
from drapps.sim.families import FAMILIES


def test_register_get_names_and_tags() -> None:
    colours: Registry[int] = Registry("colour")
    colours.register("red", 1, warm=True)

    @colours.register("blue", cold=True)
    def blue() -> int:
        return 2

    assert colours.names() == ["red", "blue"]
    assert colours.names(warm=True) == ["red"]
    assert colours.get("blue") is blue and colours["red"] == 1
    assert "red" in colours and "green" not in colours and len(colours) == 2
    assert colours.items() == [("red", 1), ("blue", blue)]
    colours.unregister("red")
    assert list(colours) == ["blue"]


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_name_must_be_a_string(name: object) -> None:
    with pytest.raises(ValueError, match="a colour name must be a non-empty string"):
        Registry[int]("colour").register(name, 1)  # type: ignore[arg-type]


def test_a_name_is_taken_once() -> None:
    colours: Registry[int] = Registry("colour")
    colours.register("red", 1)
    with pytest.raises(ValueError, match="a colour named 'red' is already registered"):
        colours.register("red", 2)


@pytest.mark.parametrize(
    ("registry", "kind"),
    [
        (POLICIES, "policy"),
        (FAMILIES, "scenario family"),
        (WORKLOADS, "workload"),
        (SYSTEMS, "system"),
        (SCENARIOS, "scenario"),
        (RECIPES, "recipe"),
    ],
)
def test_every_family_words_an_unknown_name_the_same(registry: Registry, kind: str) -> None:
    expected = f"{kind} must be one of {registry.names()}, got 'nope'"
    with pytest.raises(ValueError) as caught:
        registry.get("nope")
    assert str(caught.value) == expected


def test_learners_use_the_same_wording() -> None:
    pytest.importorskip("gymnasium")
    from drapps.sim.learners import LEARNERS

    with pytest.raises(
        ValueError, match=r"^learner must be one of \['ddqn', 'ppo', 'rollout', 'sac'\], got 'x'$"
    ):
        LEARNERS.get("x")


class _OneMore:
    """A policy that always asks for one more worker."""

    def decide(self, state: State) -> Action:
        return Action(workers=1, reason="one more") if state.workers < 2 else NOOP


def test_a_policy_registered_from_outside_drives_a_loader() -> None:
    POLICIES.register("test-one-more", _OneMore)
    try:
        assert "test-one-more" in drapps.control.policy_names()
        data = [torch.tensor([i]) for i in range(64)]
        loader = drapps.Loader(
            data, batch_size=4, workers="auto", policy="test-one-more", control_interval=0.05,
            seed=0, max_workers=2,
        )  # fmt: skip
        with loader:
            assert isinstance(loader._parts.tuner.controller.policy, _OneMore)  # type: ignore[union-attr]
            batches = [b for b in loader]
        assert torch.cat(batches).flatten().tolist() == list(range(64))
    finally:
        POLICIES.unregister("test-one-more")
    with pytest.raises(ValueError, match="policy must be one of"):
        drapps.Loader([1, 2], policy="test-one-more", workers="auto")


def test_the_old_name_of_the_simulated_pipeline_still_works() -> None:
    import drapps.sim

    with pytest.warns(DeprecationWarning, match="now drapps.sim.PipelineModel"):
        assert drapps.sim.Pipeline is drapps.sim.PipelineModel
