"""``dali-gpu-N``: NVIDIA DALI's GPU pipeline, the peer a GPU machine is judged against.

The same logical pipeline as ``dali-cpu-N`` (``docs/bench.md``), with the decode on the GPU
(``decoders.image_random_crop(device="mixed")``: nvJPEG, region decode, the A100/H100 hardware
decoder taking DALI's default share ``hw_decoder_load`` of the images where the GPU has one)
and the resize, flip and layout there too; ``N`` CPU threads read and parse. Batches come out
on the GPU, through DALI's PyTorch iterator. Needs CUDA and the ``dali`` extra.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from drapps._optional import require
from drapps.bench.systems.peers import DaliCpu


class DaliGpu(DaliCpu):
    name = "dali-gpu"
    summary = (
        "NVIDIA DALI, GPU pipeline: readers.file -> decoders.image_random_crop on the GPU "
        "(nvJPEG, device='mixed') -> resize -> crop_mirror_normalize on the GPU (extra 'dali')"
    )
    prefix = "dali-gpu"

    @classmethod
    def unavailable(cls) -> str | None:
        missing = super().unavailable()
        if missing is None and not torch.cuda.is_available():
            return "dali-gpu needs a CUDA GPU, and this machine has none"
        return missing

    def device_id(self) -> int | None:
        return torch.cuda.current_device()

    def batches(self, pipe: Any) -> Generator[Any, None, None]:
        iterator_class = require("nvidia.dali.plugin.pytorch").DALIGenericIterator
        iterator: Any = iterator_class(pipe, ["images", "labels"], auto_reset=True)
        while True:  # epochs: the iterator resets itself at the end of each
            for (out,) in iterator:
                yield out["images"], out["labels"].reshape(-1).to(torch.int64)
