"""``image-gil``: the image pipeline plus a pure-Python step, run by the systems that can run
Python per sample and refused by those that cannot."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
import torch

from drapps.bench.systems import system_class
from drapps.bench.workloads import workload_class
from drapps.bench.workloads.image_gil import WithPythonStep, python_step
from drapps.runtime.seeding import clear_sample, seed_sample


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    data = tmp_path_factory.mktemp("data")
    image, gil = workload_class("image"), workload_class("image-gil")
    return image(image.prepare(data, "smoke", seed=0)), gil(gil.prepare(data, "smoke", seed=0))


@pytest.mark.extras  # scikit-image's photos make the JPEGs
def test_the_python_step_leaves_the_samples_as_the_image_workload_makes_them(
    workloads: tuple[object, object],
) -> None:
    image, gil = workloads
    plain, stepped = image.dataset(None), gil.dataset(None)  # type: ignore[attr-defined]
    assert isinstance(stepped, WithPythonStep) and len(stepped) == len(plain)
    for index in (0, 5, len(plain) - 1):
        # the crop is random per sample: seeded alike, as a loader seeds each sample
        seed_sample(index)
        x, y = plain[index]
        seed_sample(index)
        sx, sy = stepped[index]
        clear_sample()
        assert sx.shape == x.shape == (3, 224, 224) and sx.dtype == torch.uint8 and sy == y
        assert torch.equal(sx, x)
    clone = pickle.loads(pickle.dumps(stepped))  # worker processes receive it
    assert len(clone) == len(plain) and clone.steps == stepped.steps


def test_the_step_is_a_fixed_amount_of_cpu_work() -> None:
    start = time.thread_time()
    python_step(20_000)
    assert time.thread_time() - start > 0  # CPU work, not a sleep
    assert python_step(10) == python_step(10)  # the same work every time


@pytest.mark.parametrize("name", ["spdl", "dali-cpu", "drapps-cache", "drapps-split"])
def test_systems_with_no_place_for_python_refuse_it_by_name(name: str) -> None:
    reason = system_class(name).refuses("image-gil")
    assert reason is not None and name in reason


@pytest.mark.parametrize(
    "name", ["dataloader", "drapps-heuristic", "drapps-static", "tf-autotune", "torchdata-nodes"]
)
def test_systems_that_run_the_dataset_or_python_take_it(name: str) -> None:
    assert system_class(name).refuses("image-gil") is None


@pytest.mark.extras
def test_it_has_no_cached_or_op_pipeline_form(
    workloads: tuple[object, object], tmp_path: Path
) -> None:
    _, gil = workloads
    with pytest.raises(ValueError, match="image-gil has no cached form"):
        gil.cached_dataset(None)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="image-gil has no op pipeline"):
        gil.pipeline_dataset(None)  # type: ignore[attr-defined]
    assert gil.tf_cached_dataset(32, 0, None) is None  # type: ignore[attr-defined]
