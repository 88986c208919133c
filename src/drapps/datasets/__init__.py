"""Map-style datasets over real file formats."""

from drapps.datasets.cifar10 import CIFAR10, write_cifar10
from drapps.datasets.image_folder import ImageFolder
from drapps.datasets.wikitext import WikiText, write_wikitext

__all__ = ["CIFAR10", "ImageFolder", "WikiText", "write_cifar10", "write_wikitext"]
