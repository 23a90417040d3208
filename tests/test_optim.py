"""gputui's optimizers (gputui/train/optim.py): torch.optim's SGD and Adam stepped without
torch._dynamo, with torch's arithmetic and torch's checkpoint format."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from gputui.train import optim

from .conftest import REPO, cli_env

SETTINGS = [
    ("sgd", {"momentum": 0.9, "weight_decay": 1e-3}, {}),
    ("sgd", {}, {"foreach": False}),
    ("adam", {"betas": (0.7, 0.9), "weight_decay": 1e-4}, {}),
    ("adam", {}, {"foreach": True}),
]


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 10))


def _train(opt: torch.optim.Optimizer, model: nn.Module, steps: int, lr: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(5)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr / (step + 1)
        x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _torch_class(name: str) -> type[torch.optim.Optimizer]:
    return torch.optim.Adam if name == "adam" else torch.optim.SGD


@pytest.mark.parametrize(("name", "hyper", "impl"), SETTINGS)
def test_the_steps_are_torchs_to_the_last_bit(name: str, hyper: dict, impl: dict) -> None:
    ours_model, theirs_model = _model(), _model()
    cls = optim.dynamo_free(_torch_class(name))
    assert issubclass(cls, _torch_class(name)) and cls.step is not _torch_class(name).step
    ours = cls(ours_model.parameters(), lr=0.05, **hyper, **impl)
    theirs = _torch_class(name)(theirs_model.parameters(), lr=0.05, **hyper, **impl)
    _train(ours, ours_model, 6)
    _train(theirs, theirs_model, 6)
    for a, b in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(a, b)
    assert torch.is_grad_enabled()  # the step puts the caller's grad mode back


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_checkpoint_moves_between_ours_and_torchs_either_way(name: str) -> None:
    hyper = {"momentum": 0.9} if name == "sgd" else {}
    start = _model()
    saved_by_torch = _torch_class(name)(start.parameters(), lr=0.05, **hyper)
    _train(saved_by_torch, start, 3)
    a, b = _model(), _model()
    a.load_state_dict(start.state_dict())
    b.load_state_dict(start.state_dict())
    ours = optim.dynamo_free(_torch_class(name))(a.parameters(), lr=0.05, **hyper)
    ours.load_state_dict(copy.deepcopy(saved_by_torch.state_dict()))  # as torch.save/load would
    theirs = _torch_class(name)(b.parameters(), lr=0.05, **hyper)
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))  # ours saves what torch's loads
    _train(ours, a, 3)
    _train(theirs, b, 3)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert ours.state_dict()["state"].keys() == theirs.state_dict()["state"].keys() != set()


def test_the_step_runs_without_grad_and_raises_what_the_closure_raises() -> None:
    model = _model()
    opt = optim.dynamo_free(torch.optim.SGD)(model.parameters(), lr=0.1)
    nn.functional.cross_entropy(model(torch.randn(2, 1, 8, 8)), torch.tensor([1, 2])).backward()
    with torch.enable_grad():
        opt.step()  # an in-place update of a leaf that needs grad would raise if grad were on
    assert torch.is_grad_enabled()

    def closure() -> float:
        raise ValueError("from the closure")

    with pytest.raises(ValueError, match="from the closure"):
        opt.step(closure)
    assert torch.is_grad_enabled()


def test_build_names_the_classes_and_passes_the_flags() -> None:
    params = list(_model().parameters())
    sgd = optim.build("sgd", params, 0.1, momentum=0.5, weight_decay=0.01, foreach=False)
    adam = optim.build("adam", params, 0.01, betas=(0.8, 0.9))
    assert isinstance(sgd, torch.optim.SGD) and isinstance(adam, torch.optim.Adam)
    assert (sgd.defaults["momentum"], sgd.defaults["weight_decay"], sgd.defaults["foreach"]) == (0.5, 0.01, False)
    assert adam.defaults["betas"] == (0.8, 0.9) and adam.defaults["lr"] == 0.01


CHECK = r"""
import sys
from gputui.train import optim
import torch
from torch import nn
model = nn.Linear(4, 2)
for name in ("sgd", "adam"):
    opt = optim.build(name, model.parameters(), 0.1)
    nn.functional.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 2)).backward()
    opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())
print(optim.DYNAMO_FREE, "torch._dynamo" in sys.modules)
"""


@pytest.mark.integration
def test_a_process_that_builds_and_steps_them_never_imports_torch_dynamo() -> None:
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, cwd=REPO,
                            env=cli_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"], result.stdout + result.stderr
    # torch.optim's own classes do import it (what the module exists to avoid): the check can tell.
    plain = CHECK.replace("optim.build(name, ", "(torch.optim.Adam if name == 'adam' else torch.optim.SGD)(")
    result = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=300, cwd=REPO,
                            env=cli_env())
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr
