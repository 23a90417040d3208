"""The models gputui trains, by name, with their default hyper-parameters.

This module does not import torch: profiles and the command line use it to
validate names and fill defaults before any heavy import. A recipe holds values, not keys:
each of its fields (but `summary`) is a `[run]` key declared in gputui.config.run, whose
`RunSettings.resolve` takes a key the profile leaves out from the model's recipe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """A model's default training schedule; a profile or a flag overrides any field."""

    model: str
    summary: str
    epochs: int
    batch_size: int
    optimizer: str  # "sgd" | "adam"
    lr: float  # peak learning rate
    momentum: float  # SGD momentum (ignored by Adam)
    betas: tuple[float, float]  # Adam betas (ignored by SGD)
    weight_decay: float
    l1: float  # coefficient of the L1 penalty on the weights
    schedule: str  # "onecycle" | "cosine" | "constant"
    warmup: float  # fraction of training spent warming up (onecycle)
    evals_per_epoch: int  # test-set evaluations per epoch (the last one ends the epoch)


RECIPES: dict[str, Recipe] = {
    "seed": Recipe(
        model="seed",
        summary="the paper's network: conv+pool, conv+pool to 100 values, 25 ReLU, softmax; L1",
        epochs=12,
        batch_size=512,
        optimizer="adam",
        lr=0.02,
        momentum=0.9,
        betas=(0.9, 0.999),
        weight_decay=0.0,
        l1=1e-5,
        schedule="onecycle",
        warmup=0.2,
        evals_per_epoch=1,
    ),
    "fast": Recipe(
        model="fast",
        summary="a small two-conv net tuned to reach 99% test accuracy quickest on a CPU",
        epochs=2,
        batch_size=128,
        optimizer="adam",
        lr=0.01,
        momentum=0.9,
        betas=(0.7, 0.9),
        weight_decay=0.0,
        l1=0.0,
        schedule="onecycle",
        warmup=0.3,
        evals_per_epoch=4,
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(RECIPES)
