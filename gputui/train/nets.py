"""The networks, built by name for any image size and number of classes."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class TwoConvNet(nn.Module):
    """conv + 2x2 max-pool, conv + 2x2 max-pool (pool before ReLU), one hidden ReLU layer, logits.

    The softmax is folded into the cross-entropy loss. The hidden layer's width adapts
    to the image size, checked by a dry run.
    """

    def __init__(
        self, image_shape: tuple[int, int], num_classes: int, conv1: int, conv2: int, kernel2: int, hidden: int
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, conv1, 5)
        self.conv2 = nn.Conv2d(conv1, conv2, kernel2)
        self.fc1 = nn.Linear(_flat_size(self._features, image_shape, self), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return x.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self._features(x))))


class SeedNet(TwoConvNet):
    """The paper's network.

    conv 5x5 (8 channels) + 2x2 max-pool, conv 3x3 + 2x2 max-pool leaving 4 channels of
    5x5 = 100 values (on 28x28 input), a 25-unit fully connected ReLU layer and a
    softmax output.
    """

    def __init__(self, image_shape: tuple[int, int], num_classes: int, width: int = 8) -> None:
        super().__init__(image_shape, num_classes, conv1=width, conv2=4, kernel2=3, hidden=25)


class FastNet(TwoConvNet):
    """A small two-conv net sized for speed to 99% on a CPU: 8 and 32 channels, 128 hidden."""

    def __init__(self, image_shape: tuple[int, int], num_classes: int) -> None:
        super().__init__(image_shape, num_classes, conv1=8, conv2=32, kernel2=3, hidden=128)


def _flat_size(
    features: Callable[[torch.Tensor], torch.Tensor], image_shape: tuple[int, int], module: nn.Module
) -> int:
    """Width of the flattened features for this image size (checked by a dry run)."""
    with torch.no_grad():
        try:
            out = features(torch.zeros(1, 1, *image_shape))
        except RuntimeError as exc:
            from gputui.model.errors import UserError

            raise UserError(
                f"images of {image_shape[0]}x{image_shape[1]} are too small for {type(module).__name__}: {exc}"
            ) from None
    return int(out.shape[1])


BUILDERS: dict[str, Callable[[tuple[int, int], int], nn.Module]] = {
    "seed": SeedNet,
    "fast": FastNet,
}


def build(name: str, image_shape: tuple[int, int], num_classes: int) -> nn.Module:
    """A fresh network by name (see gputui.config.recipes for the names)."""
    return BUILDERS[name](image_shape, num_classes)


def l1_penalty(model: nn.Module) -> torch.Tensor:
    """Sum of |w| over the weight matrices and kernels (biases are not penalised)."""
    weights = [p for n, p in model.named_parameters() if p.dim() > 1]
    return torch.stack([w.abs().sum() for w in weights]).sum()
