"""Map-style datasets over real file formats."""

from drapps.datasets.cifar10 import CIFAR10, write_cifar10
from drapps.datasets.image_folder import ImageFolder
from drapps.datasets.packed_text import PackedText, write_corpus
from drapps.datasets.read_ahead import ReadAhead
from drapps.datasets.wikitext import WikiText, write_wikitext

__all__ = [
    "CIFAR10",
    "ImageFolder",
    "PackedText",
    "ReadAhead",
    "WikiText",
    "write_cifar10",
    "write_corpus",
    "write_wikitext",
]
