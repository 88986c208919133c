"""Transform ops that know where they may run, and the Pipeline that cuts them in two.

drapps needs no torchvision; any picklable callable also works as an (opaque, per-sample) op.
"""

from drapps.ops.color import ColorJitter
from drapps.ops.decode_crop import DecodeRandomResizedCrop
from drapps.ops.device_stage import DeviceStage
from drapps.ops.geometry import CenterCrop, Resize, resize_image
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
from drapps.ops.text import RandomTokenMask

__all__ = [
    "ANY",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "DecodeJPEG",
    "DecodeRandomResizedCrop",
    "DeviceStage",
    "Normalize",
    "Op",
    "Opaque",
    "Pipeline",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomTokenMask",
    "Resize",
    "Spec",
    "ToCHWTensor",
    "as_op",
    "decode_jpeg",
    "resize_image",
]
