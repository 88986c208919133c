"""Transform ops drapps ships (no torchvision needed); any picklable callable also works."""

from drapps.ops.image import (
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHWTensor,
    decode_jpeg,
)

__all__ = ["Compose", "RandomHorizontalFlip", "RandomResizedCrop", "ToCHWTensor", "decode_jpeg"]
