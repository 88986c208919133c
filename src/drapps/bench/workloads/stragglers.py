"""``stragglers``: the image pipeline where a few samples cost far more than the rest.

Most photos are ImageNet-sized (500x400); 2% are 6-megapixel (3000x2000), which take an
order of magnitude longer to read and decode. Every read also goes through storage with a
heavy-tailed latency (:class:`~drapps.bench.throttle.TailedReads`: 3% of reads wait 40 ms
times a Pareto draw). The ops are the ``image`` workload's; what differs is the spread of
per-sample costs, so one slow sample can hold a whole batch, and every batch behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drapps.bench.data import make_jpeg_folder
from drapps.bench.throttle import IoThrottle, TailedReads
from drapps.bench.workloads._base import autotuned, autotuned_cached
from drapps.bench.workloads.image import (
    SIZE,
    ImageWorkload,
    _tf_crop_box,
    _tf_finish,
    jpeg_bytes,
)
from drapps.datasets import ImageFolder
from drapps.ops import (
    Compose,
    DecodeJPEG,
    DecodeRandomResizedCrop,
    Pipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Spec,
    ToCHWTensor,
)

_IMAGES = {"smoke": 48, "quick": 1024, "default": 2400}
LARGE = (0.02, (3000, 2000))
"""Share of the photos that are large, and their size."""
TAIL_SHARE, TAIL_MS = 0.03, 40.0


class StragglersWorkload(ImageWorkload):
    name = "stragglers"
    summary = (
        "JPEGs 500x400 with 2% at 3000x2000, reads with a heavy-tailed latency (3% wait "
        "40 ms x Pareto 1.5) -> decode -> RandomResizedCrop 224 -> flip -> uint8 NCHW; batch 32"
    )
    batch_size = 32
    step_ms = 40.0

    @classmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        folder = make_jpeg_folder(data_dir, _IMAGES[size], seed=seed, large=LARGE)
        return {"folder": str(folder), "samples": _IMAGES[size]}

    def reads(self, throttle: IoThrottle | None) -> TailedReads:
        return TailedReads(TAIL_SHARE, TAIL_MS, throttle)

    def dataset(self, throttle: IoThrottle | None) -> ImageFolder:
        transform = Compose([DecodeRandomResizedCrop(SIZE), RandomHorizontalFlip(), ToCHWTensor()])
        return ImageFolder(
            self.params["folder"], transform=transform, decode=jpeg_bytes, read=self.reads(throttle)
        )

    def cached_dataset(self, throttle: IoThrottle | None) -> tuple[ImageFolder, Pipeline]:
        ops = [RandomResizedCrop(SIZE), RandomHorizontalFlip(), ToCHWTensor()]
        folder = ImageFolder(self.params["folder"], read=self.reads(throttle))
        return folder, Pipeline(ops, key=0)

    def pipeline_dataset(self, throttle: IoThrottle | None) -> tuple[ImageFolder, Pipeline]:
        folder = ImageFolder(self.params["folder"], decode=jpeg_bytes, read=self.reads(throttle))
        ops = [DecodeJPEG(), ToCHWTensor(), RandomResizedCrop(SIZE), RandomHorizontalFlip()]
        return folder, Pipeline(ops, key=0, takes=Spec("bytes"))

    def tf_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        import tensorflow as tf

        paths, labels = self.files()
        read = self.reads(throttle)

        def load(path: Any, label: Any) -> tuple[Any, Any]:
            data = _tf_read(path, read)
            box_start, box_size = _tf_crop_box(tf.image.extract_jpeg_shape(data))
            window = tf.stack([box_start[0], box_start[1], box_size[0], box_size[1]])
            image = tf.image.decode_and_crop_jpeg(data, window, channels=3)
            return _tf_finish(image), tf.cast(label, tf.int64)

        slices = tf.data.Dataset.from_tensor_slices((paths, labels))
        return autotuned(slices, load, len(paths), batch_size, seed)

    def tf_cached_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        import tensorflow as tf

        paths, labels = self.files()
        read = self.reads(throttle)

        def make(path: Any, label: Any) -> tuple[Any, Any]:
            image = tf.io.decode_jpeg(_tf_read(path, read), channels=3)
            return image, tf.cast(label, tf.int64)

        def augment(image: Any, label: Any) -> tuple[Any, Any]:
            box_start, box_size = _tf_crop_box(tf.shape(image))
            return _tf_finish(tf.slice(image, box_start, box_size)), label

        slices = tf.data.Dataset.from_tensor_slices((paths, labels))
        return autotuned_cached(slices, make, augment, len(paths), batch_size, seed)


def _tf_read(path: Any, read: TailedReads) -> Any:
    """A file's bytes in tf.data, read as the torch side reads them."""
    import tensorflow as tf

    data = tf.numpy_function(lambda p: read(p.decode()), [path], tf.string)
    return tf.ensure_shape(data, [])
