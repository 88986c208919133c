"""Map-style datasets over real file formats."""

from drapps.datasets.image_folder import ImageFolder

__all__ = ["ImageFolder"]
