"""The tf.data adapter with real TensorFlow: a drapps loader inside ``model.fit``, and drapps'
report over a tf.data pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import drapps

tf = pytest.importorskip("tensorflow", reason="needs the tf extra: pip install 'drapps-loader[tf]'")

from drapps.tf import as_dataset, watch  # noqa: E402

pytestmark = pytest.mark.integration  # starts real engines or interpreters


class Points:
    """y = 1 when x's coordinates sum above zero: a problem a small model learns fast."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = (self.x.sum(1) > 0).to(torch.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def test_elements_are_the_loaders_batches_every_epoch() -> None:
    data = Points(50)
    loader = drapps.Loader(data, batch_size=16, shuffle=True, seed=3, workers=2, cache=None)
    reference = drapps.Loader(data, batch_size=16, shuffle=True, seed=3, workers=0, cache=None)
    dataset = as_dataset(loader)
    assert dataset.cardinality().numpy() == 4
    spec_x, spec_y = dataset.element_spec
    assert spec_x.shape.as_list() == [None, 4] and spec_x.dtype == tf.float32
    assert spec_y.shape.as_list() == [None] and spec_y.dtype == tf.float32
    for _ in range(2):  # each pass is the loader's next epoch
        got = [(x.numpy(), y.numpy()) for x, y in dataset]
        want = [(x.numpy(), y.numpy()) for x, y in reference]
        assert len(got) == 4 and got[-1][0].shape == (2, 4)  # the short last batch
        assert all(
            np.array_equal(a, c) and np.array_equal(b, d)
            for (a, b), (c, d) in zip(got, want, strict=True)
        )
    loader.close()


def test_a_keras_model_fits_on_a_drapps_loader() -> None:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.05),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    with drapps.Loader(
        Points(512), batch_size=64, shuffle=True, seed=0, workers=2, cache=None
    ) as loader:
        history = model.fit(as_dataset(loader), epochs=4, verbose=0)
        assert loader.stats().batches == 4 * 8
    assert history.history["accuracy"][-1] > 0.9


def test_dict_batches_and_uint8_images_keep_their_dtypes() -> None:
    data = [{"image": torch.full((3, 2, 2), i, dtype=torch.uint8), "label": i} for i in range(6)]
    # TensorFlow keeps the generator (and the loader) past the dataset: close it when done.
    with drapps.Loader(data, batch_size=3, workers=0) as loader:
        element = next(iter(as_dataset(loader)))
    assert element["image"].dtype == tf.uint8 and element["label"].dtype == tf.int64
    assert element["image"].numpy()[2, 0, 0, 0] == 2


def test_watch_reports_on_a_tf_data_pipeline(tmp_path: Path) -> None:
    def slow(x: tf.Tensor) -> tf.Tensor:
        return tf.py_function(lambda v: (__import__("time").sleep(0.01), v)[1], [x], tf.float32)

    pipeline = tf.data.Dataset.range(400).map(lambda i: tf.cast(i, tf.float32)).map(slow).batch(8)
    trace = tmp_path / "watch.jsonl"
    with watch(pipeline, interval=0.2, trace=str(trace)) as watched:
        assert sum(int(b.shape[0]) for b in watched) == 400
        report = watched.report()
    assert watched.samples == 400 and watched.batches == 50
    assert "waited" in report  # the loop waited on the slow map: the report says so
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert any(r.get("type") == "tick" for r in rows)


def test_a_watched_pipeline_left_unclosed_stops_sampling_when_collected() -> None:
    import gc
    import threading

    watched = watch([[1, 2]] * 3, interval=0.05)
    assert sum(len(b) for b in watched) == 6
    del watched
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("drapps")]


def test_an_empty_loader_is_refused() -> None:
    with pytest.raises(ValueError, match="the loader gave no batch"):
        as_dataset(drapps.Loader([], batch_size=2, workers=0))
