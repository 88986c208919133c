"""Transform ops that know where they may run, and the Pipeline that cuts them in two.

drapps needs no torchvision; any picklable callable also works as an (opaque, per-sample) op.
"""

from drapps.ops.image import (
    Compose,
    DecodeJPEG,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHWTensor,
    decode_jpeg,
)
from drapps.ops.op import ANY, Op, Opaque, Spec, as_op
from drapps.ops.pipeline import Pipeline

__all__ = [
    "ANY",
    "Compose",
    "DecodeJPEG",
    "Normalize",
    "Op",
    "Opaque",
    "Pipeline",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Spec",
    "ToCHWTensor",
    "as_op",
    "decode_jpeg",
]
