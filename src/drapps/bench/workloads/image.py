"""``image``: the ImageNet-style pipeline on generated JPEGs.

Read a ~500x400 quality-90 JPEG, decode, random-resized-crop to 224, random flip; batches
cross to the training side as uint8 NCHW, where they are normalised (ImageNet mean and std).
DataLoader and drapps run drapps' ops (simplejpeg + OpenCV: ``DecodeRandomResizedCrop``, which
decodes at a reduced DCT scale when the crop allows; at 500x400 and 224 it never does, so this
is the full decode); tf.data runs TensorFlow's own
(``decode_and_crop_jpeg`` with ``sample_distorted_bounding_box``, ``resize``,
``random_flip_left_right``), the idiomatic tf.data recipe for the same augmentation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drapps.bench.data import make_jpeg_folder
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads._base import SgdStep, Workload, autotuned, autotuned_cached
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
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
SIZE = 224


class ImageWorkload(Workload):
    name = "image"
    summary = (
        "JPEG 500x400 q90 from disk -> decode -> RandomResizedCrop 224 -> flip -> uint8 NCHW "
        "-> normalise on the training side; batch 32"
    )
    batch_size = 32
    step_ms = 40.0

    @classmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        folder = make_jpeg_folder(data_dir, _IMAGES[size], seed=seed)
        return {"folder": str(folder), "samples": _IMAGES[size]}

    def reads(self, throttle: IoThrottle | None) -> Callable[[str], bytes] | None:
        """How a file is read: through ``throttle`` when given, else plainly (None)."""
        return throttle.read if throttle is not None else None

    def dataset(self, throttle: IoThrottle | None) -> ImageFolder:
        transform = Compose([DecodeRandomResizedCrop(SIZE), RandomHorizontalFlip(), ToCHWTensor()])
        read = self.reads(throttle)
        return ImageFolder(self.params["folder"], transform=transform, decode=jpeg_bytes, read=read)

    def cached_dataset(self, throttle: IoThrottle | None) -> tuple[ImageFolder, Pipeline]:
        """Decoded photos (what a sample cache keeps) and the augmentation after them, the
        same OpenCV ops :meth:`dataset` runs."""
        read = self.reads(throttle)
        ops = [RandomResizedCrop(SIZE), RandomHorizontalFlip(), ToCHWTensor()]
        return ImageFolder(self.params["folder"], read=read), Pipeline(ops, key=0)

    def pipeline_dataset(self, throttle: IoThrottle | None) -> tuple[ImageFolder, Pipeline]:
        """The JPEG bytes, and the same augmentation as a :class:`Pipeline` whose every op may
        run in the device stage (the crop on tensors: antialiased, not OpenCV's)."""
        read = self.reads(throttle)
        folder = ImageFolder(self.params["folder"], decode=jpeg_bytes, read=read)
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
            return self.tf_after(_tf_finish(image)), tf.cast(label, tf.int64)

        slices = tf.data.Dataset.from_tensor_slices((paths, labels))
        return autotuned(slices, load, len(paths), batch_size, seed)

    def tf_after(self, image: Any) -> Any:
        """What tf.data does to a finished sample (uint8 CHW) after the image ops: nothing
        here; a variant adds its own step."""
        return image

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

    def files(self) -> tuple[list[str], list[int]]:
        """The JPEG paths and their class indices, in ImageFolder's order."""
        samples = ImageFolder(self.params["folder"]).samples
        return [path for path, _ in samples], [target for _, target in samples]

    def expected(self, batch_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [((batch_size, 3, SIZE, SIZE), torch.uint8), ((batch_size,), torch.int64)]

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - _MEAN) / _STD

    def cpu_model(self) -> Callable[[torch.Tensor, torch.Tensor], None]:
        return SgdStep(small_cnn)

    def cuda_model(self, device: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """ResNet-50, bfloat16 autocast, on ``device``; the batch is normalised there."""
        from drapps.bench.models import DeviceStep, resnet50

        mean, std = _MEAN.to(device), _STD.to(device)
        return DeviceStep(lambda: resnet50(), device, lambda x: (x.float() - mean) / std)

    def warm(self) -> None:
        for path, _ in ImageFolder(self.params["folder"]).samples:
            with open(path, "rb") as file:
                file.read()


def jpeg_bytes(data: bytes) -> bytes:
    """The file's bytes as they are (decoding is left to the pipeline)."""
    return data


def small_cnn(classes: int = 9) -> nn.Module:
    """A small CNN for the cpu-model consumer: conv -> pool -> linear."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=7, stride=4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(8),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, classes),
    )


def _tf_read(path: Any, read: Callable[[str], bytes] | None) -> Any:
    """A file's bytes in tf.data, through ``read`` when given (as the torch side reads it)."""
    import tensorflow as tf

    if read is None:
        return tf.io.read_file(path)
    data = tf.numpy_function(lambda p: read(p.decode()), [path], tf.string)
    return tf.ensure_shape(data, [])


def _tf_crop_box(shape: Any) -> tuple[Any, Any]:
    """RandomResizedCrop's box (scale 0.08-1, ratio 3/4-4/3) for an image of ``shape``."""
    import tensorflow as tf

    box_start, box_size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([1, 0, 4]),
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return box_start, box_size


def _tf_finish(crop: Any) -> Any:
    """The crop resized to 224, maybe flipped, as uint8 CHW."""
    import tensorflow as tf

    image = tf.image.random_flip_left_right(tf.image.resize(crop, [SIZE, SIZE]))
    return tf.transpose(tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8), [2, 0, 1])
