"""Training recipes, one file per recipe, registered by name in :data:`RECIPES`."""

from drapps.registry import Registry
from drapps.train.recipes._base import Recipe
from drapps.train.recipes.gpt2_wikitext2 import GPT2WikiText2
from drapps.train.recipes.resnet_cifar10 import ResNetCIFAR10

RECIPES: Registry[Recipe] = Registry("recipe")
"""Recipes by name (``drapps train --recipe``)."""
for _recipe in (ResNetCIFAR10(), GPT2WikiText2()):
    RECIPES.register(_recipe.name, _recipe)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; the error lists the valid names."""
    return RECIPES.get(name)


__all__ = ["RECIPES", "Recipe", "get_recipe"]
