"""Transform ops drapps ships (no torchvision needed); any picklable callable also works."""

from drapps.ops.image import (
    Compose,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHWTensor,
    decode_jpeg,
)

__all__ = [
    "Compose",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "ToCHWTensor",
    "decode_jpeg",
]
