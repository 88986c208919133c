"""Training recipes, one file per recipe, registered by name in :data:`RECIPES`."""

from drapps.reference.recipes._base import Recipe
from drapps.reference.recipes.gpt2_wikitext2 import GPT2WikiText2
from drapps.reference.recipes.resnet_cifar10 import ResNetCIFAR10
from drapps.registry import Registry

RECIPES: Registry[Recipe] = Registry("recipe")
"""Recipes by name (``drapps train --recipe``)."""
for _recipe in (ResNetCIFAR10(), GPT2WikiText2()):
    RECIPES.register(_recipe.name, _recipe)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; the error lists the valid names."""
    return RECIPES.get(name)


__all__ = ["RECIPES", "Recipe", "get_recipe"]
