"""Moved to gputui.config.recipes (the models' defaults sit beside the [run] table); kept so old imports work."""

from gputui.config.recipes import MODEL_NAMES, RECIPES, Recipe

__all__ = ["MODEL_NAMES", "RECIPES", "Recipe"]
