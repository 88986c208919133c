"""The loaders users would pick instead of drapps, each in its own idiomatic configuration.

Every peer runs the image workload's logical pipeline over the same files: decode,
random-resized crop to 224 (scale 0.08-1, ratio 3/4-4/3, 10 tries), random flip, uint8 CHW,
batch 32, reshuffled every epoch. How each reaches its speed is in ``docs/bench.md``:

- ``dali-cpu-N``: NVIDIA DALI with ``device="cpu"`` operators, a C++ pipeline on ``N`` threads;
  ``decoders.image_random_crop`` decodes only the crop's region (ROI decoding) through
  nvImageCodec's CPU backend (libjpeg-turbo). Extra ``dali``.
- ``spdl-N``: Meta's SPDL ``PipelineBuilder``, ``N`` concurrent decode tasks on threads (SPDL's
  decoders release the GIL); decoding, crop, resize and flip are one FFmpeg filter graph.
  Extra ``spdl`` (and FFmpeg's shared libraries, e.g. Debian's ``libavformat59``).
- ``torchdata-nodes-threads-N`` / ``-processes-N``: ``torchdata.nodes.ParallelMapper`` over the
  workload's own dataset (drapps' ops), per sample on ``N`` threads, or per batch (fetch and
  collate, as DataLoader's workers do) in ``N`` processes. Extra ``torchdata``.
- ``ffcv-N``: FFCV writes the files once into its ``.beton`` format (set-up time, counted in
  the first batch and end-to-end), then its Loader decodes the crop with
  ``RandomResizedCropRGBImageDecoder`` in numba-compiled code on ``N`` threads. No extra: its
  wheel pulls ``opencv-python`` beside the ``opencv-python-headless`` drapps uses, so it is
  installed by hand (``docs/bench.md``).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from typing import Any, ClassVar

import numpy as np
import torch

from drapps._optional import install_hint, installed, require
from drapps.bench.systems._base import EpochSource, Source, System, Workers
from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads import Workload
from drapps.ops import RandomResizedCrop

SIZE = 224
_RATIO = (3 / 4, 4 / 3)


def _missing(module: str, extra: str, also: str = "") -> str | None:
    """Why a peer cannot run: its package is not installed (None when it is)."""
    if not installed(module):
        return f"{module} is not installed: {install_hint(extra)}{also}"
    return None


def _image_files(system: str, workload: Workload) -> tuple[list[str], list[int]]:
    files = getattr(workload, "files", None)
    if files is None:
        raise ValueError(f"{system} runs the image workload only, got {workload.name!r}")
    paths, labels = files()
    return list(paths), list(labels)


def _count(system: str, workers: Workers, what: str = "a thread count") -> int:
    """``workers`` as the peer's int setting (threads, concurrency), or the error naming it."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{system} needs {what} >= 1, got {workers!r}")
    return workers


class _PeerSystem(System):
    module: ClassVar[str]
    extra: ClassVar[str]
    prefix: ClassVar[str]
    image_only: ClassVar[bool] = True

    @classmethod
    def refuses(cls, workload: str) -> str | None:
        if cls.image_only and workload != "image":
            return f"{cls.name} runs the image workload only"
        return None

    @classmethod
    def unavailable(cls) -> str | None:
        return _missing(cls.module, cls.extra)

    @classmethod
    def load(cls) -> None:
        require(cls.module)

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return [cores, 2 * cores]

    @classmethod
    def case_name(cls, workers: Workers) -> str:
        return f"{cls.prefix}-{workers}"


class _Batches(Source):
    """An endless generator of ``(x, y)`` torch batches, with what closes it."""

    def __init__(self, batches: Generator[Any, None, None], workers: Workers, stop: Any) -> None:
        self._it, self._workers, self._stop = batches, workers, stop

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def workers(self) -> Workers:
        return self._workers

    def close(self) -> None:
        self._it.close()
        if self._stop is not None:
            self._stop()
            self._stop = None


# -- DALI -------------------------------------------------------------------------------------


class DaliCpu(_PeerSystem):
    name = "dali-cpu"
    summary = (
        "NVIDIA DALI, CPU operators: readers.file -> decoders.image_random_crop (ROI decode) "
        "-> resize -> crop_mirror_normalize, a C++ pipeline on N threads (extra 'dali')"
    )
    module, extra, prefix = "nvidia.dali", "dali", "dali-cpu"

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        threads = _count(self.name, workers)
        paths, labels = _image_files(self.name, workload)
        pipe = _dali_pipeline(paths, labels, batch_size, threads, seed, throttle, self.device_id())
        pipe.build()
        return _Batches(self.batches(pipe), threads, None)

    def device_id(self) -> int | None:
        """The GPU the pipeline's decode runs on; None: the CPU."""
        return None

    def batches(self, pipe: Any) -> Generator[Any, None, None]:
        """The built pipeline's batches as torch tensors, endlessly."""
        while True:
            images, targets = pipe.run()
            x = torch.from_numpy(images.as_array())
            yield x, torch.from_numpy(targets.as_array().reshape(-1).astype(np.int64))


def _dali_pipeline(
    paths: list[str],
    labels: list[int],
    batch_size: int,
    threads: int,
    seed: int,
    throttle: IoThrottle | None,
    device_id: int | None = None,
) -> Any:
    """The image workload's pipeline in DALI: on the CPU (``device_id`` None), or with the
    decode on the GPU ``device_id`` (``decoders.image_random_crop(device="mixed")``: nvJPEG,
    its hardware decoder taking DALI's default share where there is one) and the resize, flip
    and layout there too."""
    dali = require("nvidia.dali")
    fn, types = dali.fn, dali.types
    decoder = "cpu" if device_id is None else "mixed"

    @dali.pipeline_def(
        batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed + 1
    )
    def pipeline() -> Any:
        if throttle is None:
            jpegs, targets = fn.readers.file(
                files=paths, labels=labels, random_shuffle=True, seed=seed + 1, name="files"
            )
        else:  # the slow disk: files read through the throttle by DALI's external source
            jpegs, targets = fn.external_source(
                source=_ThrottledFiles(paths, labels, batch_size, seed, throttle),
                num_outputs=2,
                batch=True,
            )
        images = fn.decoders.image_random_crop(
            jpegs,
            device=decoder,
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=list(_RATIO),
            num_attempts=10,
        )
        images = fn.resize(
            images, resize_x=SIZE, resize_y=SIZE, interp_type=types.INTERP_LINEAR, antialias=False
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.UINT8,
            output_layout="CHW",
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, targets

    return pipeline()


class _ThrottledFiles:
    """Batches of (file bytes, label) in a reshuffled order per epoch, read via ``throttle``."""

    def __init__(
        self,
        paths: list[str],
        labels: list[int],
        batch_size: int,
        seed: int,
        throttle: IoThrottle,
    ) -> None:
        self.paths, self.labels, self.batch_size = paths, labels, batch_size
        self.rng = np.random.default_rng(seed)
        self.throttle = throttle
        self.order: list[int] = []

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        picked: list[int] = []
        while len(picked) < self.batch_size:
            if not self.order:
                self.order = list(self.rng.permutation(len(self.paths)))
            picked.append(self.order.pop())
        data = [np.frombuffer(self.throttle.read(self.paths[i]), np.uint8) for i in picked]
        return data, [np.array([self.labels[i]], np.int32) for i in picked]


# -- SPDL -------------------------------------------------------------------------------------


class Spdl(_PeerSystem):
    name = "spdl"
    summary = (
        "Meta SPDL: PipelineBuilder, N concurrent decode tasks on threads, FFmpeg decode + "
        "crop/scale/flip filter graph (extra 'spdl'; needs FFmpeg's shared libraries)"
    )
    module, extra, prefix = "spdl.io", "spdl", "spdl"

    @classmethod
    def unavailable(cls) -> str | None:
        missing = _missing("spdl", "spdl")
        if missing is not None:
            return missing
        try:
            require("spdl.io").demux_image(_tiny_jpeg())
        except Exception as exc:  # the FFmpeg libraries are separate
            return f"SPDL cannot decode: {str(exc).splitlines()[0][:200]}"
        return None

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        concurrency = _count(self.name, workers, "a concurrency")
        paths, labels = _image_files(self.name, workload)
        spdl_io = require("spdl.io")
        builder_class = require("spdl.pipeline").PipelineBuilder
        read = throttle.read if throttle is not None else _read_file
        crop = RandomResizedCrop(SIZE, ratio=_RATIO)

        def epochs() -> Generator[tuple[int, int], None, None]:
            rng = np.random.default_rng(seed)
            epoch = 0
            while True:
                for index in rng.permutation(len(paths)):
                    yield epoch, int(index)
                epoch += 1

        def load(key: tuple[int, int]) -> tuple[np.ndarray, int]:
            epoch, index = key
            rng = np.random.default_rng((seed, epoch, index))
            packets = spdl_io.demux_image(read(paths[index]))
            top, left, h, w = crop.crop_box(packets.height, packets.width, rng)
            flip = ",hflip" if rng.random() < 0.5 else ""
            graph = (
                f"crop={w}:{h}:{left}:{top},scale={SIZE}:{SIZE}:flags=bilinear{flip},format=rgb24"
            )
            frames = spdl_io.decode_packets(packets, filter_desc=graph)
            image = spdl_io.to_numpy(spdl_io.convert_frames(frames))
            return image.reshape(SIZE, SIZE, 3), labels[index]

        def collate(samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
            images = np.stack([image for image, _ in samples]).transpose(0, 3, 1, 2)
            x = torch.from_numpy(np.ascontiguousarray(images))
            return x, torch.tensor([label for _, label in samples], dtype=torch.int64)

        pipeline = (
            builder_class()
            .add_source(epochs())
            .pipe(load, concurrency=concurrency, output_order="input")
            .aggregate(batch_size, drop_last=True)
            .pipe(collate)
            .add_sink(3)
            .build(num_threads=concurrency)
        )
        pipeline.start()

        def batches() -> Generator[Any, None, None]:
            yield from pipeline.get_iterator(timeout=120)

        return _Batches(batches(), concurrency, pipeline.stop)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _tiny_jpeg() -> bytes:
    """An 8x8 JPEG, to ask SPDL whether it can decode at all."""
    simplejpeg = require("simplejpeg")
    return bytes(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8), colorspace="RGB"))


# -- torchdata.nodes --------------------------------------------------------------------------


class TorchdataNodes(_PeerSystem):
    name = "torchdata-nodes"
    summary = (
        "torchdata.nodes: ParallelMapper over the workload's dataset, per sample on N threads "
        "or per batch in N processes, then Batcher/Prefetcher (extra 'torchdata')"
    )
    module, extra, prefix = "torchdata.nodes", "torchdata", "torchdata-nodes"
    image_only = False  # it maps the workload's own dataset

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return [f"threads-{cores}", f"threads-{2 * cores}", f"processes-{cores}"]

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        nodes = require("torchdata.nodes")
        method, _, count = str(workers).partition("-")
        if method not in ("threads", "processes") or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"torchdata-nodes needs 'threads-N' or 'processes-N' (N >= 1), got {workers!r}"
            )
        dataset = workload.dataset(throttle)
        generator = torch.Generator().manual_seed(seed)
        sampler = torch.utils.data.RandomSampler(dataset, generator=generator)
        node: Any = nodes.SamplerWrapper(sampler)
        collate = torch.utils.data.default_collate
        if method == "threads":
            node = nodes.ParallelMapper(node, dataset.__getitem__, int(count), method="thread")
            node = nodes.Mapper(nodes.Batcher(node, batch_size, drop_last=True), collate)
        else:
            node = nodes.Batcher(node, batch_size, drop_last=True)
            fetch = _FetchBatch(dataset, collate)
            node = nodes.ParallelMapper(node, fetch, int(count), method="process")
        loader = nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2))
        return _NodesSource(loader, lambda: workers)


class _NodesSource(EpochSource):
    """torchdata.nodes stops its threads only when its nodes are garbage-collected; the nodes
    sit in reference cycles, so without a collection here their threads outlive the
    interpreter and abort it at exit."""

    def close(self) -> None:
        super().close()
        gc.collect()


class _FetchBatch:
    """Fetch and collate one batch of indices (picklable, for worker processes)."""

    def __init__(self, dataset: Any, collate: Any) -> None:
        self.dataset, self.collate = dataset, collate

    def __call__(self, indices: list[int]) -> Any:
        return self.collate([self.dataset[i] for i in indices])


# -- FFCV -------------------------------------------------------------------------------------


class Ffcv(_PeerSystem):
    name = "ffcv"
    summary = (
        "FFCV: the files written once to a .beton (set-up, counted in first batch and "
        "end-to-end), then its Loader with RandomResizedCropRGBImageDecoder on N threads "
        "(numba-compiled pipeline; see docs/bench.md to install)"
    )
    module, extra, prefix = "ffcv", "ffcv", "ffcv"

    @classmethod
    def unavailable(cls) -> str | None:
        if not installed("ffcv"):
            return (
                "ffcv is not installed: it builds against the OS's OpenCV and libjpeg-turbo "
                "(Debian: libopencv-dev libturbojpeg0-dev pkg-config), see docs/bench.md"
            )
        return None

    @classmethod
    def variants(cls, cores: int) -> list[Workers]:
        return [cores]

    def open(
        self,
        workload: Workload,
        workers: Workers,
        batch_size: int,
        seed: int,
        throttle: IoThrottle | None,
    ) -> Source:
        threads = _count(self.name, workers)
        paths, labels = _image_files(self.name, workload)
        loader_module, fields = require("ffcv.loader"), require("ffcv.fields")
        decoders, transforms = require("ffcv.fields.decoders"), require("ffcv.transforms")
        folder = tempfile.mkdtemp(prefix="drapps-ffcv-")
        beton = os.path.join(folder, "data.beton")
        # FFCV's set-up: every file read (through the throttle, if any), decoded and written
        # once, as quality-90 JPEGs, into its own format.
        writer = require("ffcv.writer").DatasetWriter(
            beton,
            {
                "image": fields.RGBImageField(write_mode="jpg", jpeg_quality=90),
                "label": fields.IntField(),
            },
            num_workers=threads,
        )
        writer.from_indexed_dataset(_Decoded(paths, labels, throttle))
        loader = loader_module.Loader(
            beton,
            batch_size=batch_size,
            num_workers=threads,
            order=loader_module.OrderOption.RANDOM,
            drop_last=True,
            os_cache=True,
            seed=seed,
            pipelines={
                "image": [
                    decoders.RandomResizedCropRGBImageDecoder((SIZE, SIZE), ratio=_RATIO),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    transforms.ToTorchImage(channels_last=False),
                ],
                "label": [decoders.IntDecoder(), transforms.ToTensor(), transforms.Squeeze()],
            },
        )

        def batches() -> Generator[Any, None, None]:
            while True:
                for x, y in loader:
                    yield x, y.to(torch.int64)

        return _Batches(batches(), threads, lambda: shutil.rmtree(folder, ignore_errors=True))


class _Decoded:
    """The image files as (HWC uint8 array, label) pairs, what FFCV's writer takes."""

    def __init__(self, paths: list[str], labels: list[int], throttle: IoThrottle | None) -> None:
        self.paths, self.labels = paths, labels
        self.read = throttle.read if throttle is not None else _read_file

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        simplejpeg = require("simplejpeg")
        return simplejpeg.decode_jpeg(self.read(self.paths[index]), colorspace="RGB"), self.labels[
            index
        ]


PEER_SYSTEMS: tuple[type[System], ...] = (DaliCpu, Spdl, TorchdataNodes, Ffcv)
