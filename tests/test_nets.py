"""Each model's shapes, the L1 term in the loss, the LR schedule and evaluation points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gputui.config.run import RunSettings
from gputui.train import nets
from gputui.train.loop import eval_points, lr_at
from gputui.config.recipes import RECIPES


def test_seed_network_matches_the_paper() -> None:
    model = nets.build("seed", (28, 28), 10)
    x = torch.zeros(5, 1, 28, 28)
    features = model._features(x)
    assert features.shape == (5, 100)  # two conv + 2x2 pool blocks leave 100 values
    assert model.conv2.out_channels == 4
    assert model.fc1.in_features == 100 and model.fc1.out_features == 25
    assert model(x).shape == (5, 10)


def test_fast_network_shapes() -> None:
    model = nets.build("fast", (28, 28), 10)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


@pytest.mark.parametrize("name", sorted(nets.BUILDERS))
def test_models_adapt_to_size_and_classes(name: str) -> None:
    model = nets.build(name, (32, 32), 3)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 3)


def test_every_recipe_has_a_network() -> None:
    assert set(RECIPES) == set(nets.BUILDERS)


def test_l1_penalty_sums_absolute_weights_not_biases() -> None:
    model = nets.build("seed", (28, 28), 10)
    expected = sum(p.abs().sum() for n, p in model.named_parameters() if not n.endswith("bias"))
    assert torch.allclose(nets.l1_penalty(model), expected)


def test_l1_term_adds_its_subgradient() -> None:
    torch.manual_seed(0)
    model = nets.build("seed", (28, 28), 10)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(model(x), y).backward()
    plain = model.fc1.weight.grad.clone()
    model.zero_grad()
    l1 = 0.01
    (F.cross_entropy(model(x), y) + l1 * nets.l1_penalty(model)).backward()
    assert torch.allclose(model.fc1.weight.grad - plain, l1 * model.fc1.weight.sign(), atol=1e-6)
    assert RECIPES["seed"].l1 > 0  # the seed recipe trains with the penalty on


def test_onecycle_schedule() -> None:
    cfg = RunSettings(model="seed", lr=0.1, warmup=0.25, schedule="onecycle").resolve()
    total = 101
    assert lr_at(cfg, 0, total) == pytest.approx(0.1 / 25)
    assert lr_at(cfg, 25, total) == pytest.approx(0.1)
    assert lr_at(cfg, 100, total) == pytest.approx(0.1 / 25 / 1e4)
    values = [lr_at(cfg, s, total) for s in range(total)]
    assert max(values) == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[25:], values[26:]))


def test_constant_and_cosine() -> None:
    const = RunSettings(lr=0.05, schedule="constant").resolve()
    assert lr_at(const, 7, 10) == 0.05
    cos = RunSettings(lr=0.05, schedule="cosine").resolve()
    assert lr_at(cos, 0, 11) == pytest.approx(0.05)
    assert lr_at(cos, 10, 11) == pytest.approx(0.0, abs=1e-12)


def test_eval_points() -> None:
    assert eval_points(100, 1) == [100]
    points = eval_points(100, 4)
    assert points[-1] == 100 and len(points) == 4 and points[0] > 50
    assert eval_points(3, 10) == [2, 3]
