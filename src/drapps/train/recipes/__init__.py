"""Training recipes, one file per recipe, registered by name."""

from drapps.train.recipes._base import Recipe
from drapps.train.recipes.gpt2_wikitext2 import GPT2WikiText2
from drapps.train.recipes.resnet_cifar10 import ResNetCIFAR10

RECIPES: dict[str, Recipe] = {r.name: r for r in (ResNetCIFAR10(), GPT2WikiText2())}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; the error lists the valid names."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}") from None


__all__ = ["RECIPES", "Recipe", "get_recipe"]
