"""The reference trainer (``drapps train``), its recipes and models, the ablation, and the
stand-in dataset writers: a worked example built on the toolkit of small pieces in
:mod:`drapps.train`, kept beside it rather than inside it.

:func:`train` with a :class:`TrainConfig` runs the ResNet/CIFAR-10 and GPT-2/WikiText-2 recipes
with any combination of the pieces.
"""

from drapps.reference.config import TrainConfig, TrainReport
from drapps.reference.recipes import RECIPES, Recipe, get_recipe
from drapps.reference.trainer import Trainer, train

__all__ = ["RECIPES", "Recipe", "TrainConfig", "TrainReport", "Trainer", "get_recipe", "train"]
