"""The optimizers gputui builds (SGD and Adam): torch.optim's own, run without torch._dynamo.

torch.optim imports torch._dynamo (1.3-2.3 s of CPU on a 2-core VM, 4 s on an H100's host:
as long as importing torch itself) only to mark its bookkeeping "never compile" and to break
a compiled graph around `step`. A training process of gputui compiles nothing, so that
import buys it nothing. Here the same classes run with those marks as no-ops:

- `Optimizer`'s methods wrapped by `torch._disable_dynamo` (zero_grad, state_dict,
  load_state_dict, add_param_group) find their "disabled" version already cached: the
  function itself, which is what a disabled function does when nothing is compiling;
- `step` runs the class's own step (`__wrapped__`) with gradients set as torch's wrapper
  sets them, without its two graph breaks (no-ops outside a compile).

Both are checked against this torch before use (the wrappers' code must be the ones
described here); on a torch where they differ nothing is changed, `DYNAMO_FREE` is False
and the optimizers import torch._dynamo as before (`gputui.train.startup.warm_dynamo`
moves that import onto a thread). The arithmetic is torch's in every case.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

import torch

O = TypeVar("O", bound=torch.optim.Optimizer)
_CACHE = "__dynamo_disable"  # the attribute torch._disable_dynamo caches its disabled function in


def _probe() -> Any:
    return None


def _patch() -> bool:
    """Pre-fill the dynamo-disable caches of Optimizer's methods; True when this torch has the
    wrappers this module knows (else nothing is changed)."""
    if "torch._dynamo" in sys.modules:  # imported already (something compiles here): nothing to save
        return False
    try:
        from torch.optim.optimizer import Optimizer, _use_grad_for_differentiable

        disabled = torch._disable_dynamo(_probe).__code__
        use_grad = _use_grad_for_differentiable(_probe).__code__
    except (ImportError, AttributeError, TypeError):
        return False
    if _CACHE not in disabled.co_consts:
        return False
    for cls in (torch.optim.SGD, torch.optim.Adam):
        if getattr(cls.step, "__code__", None) is not use_grad or not callable(getattr(cls.step, "__wrapped__", None)):
            return False
    for name, value in vars(Optimizer).items():
        inner = getattr(value, "__wrapped__", None)
        if getattr(value, "__code__", None) is disabled and callable(inner) and not hasattr(inner, _CACHE):
            setattr(inner, _CACHE, inner)
    return True


DYNAMO_FREE = _patch()


def dynamo_free(cls: type[O]) -> type[O]:
    """A subclass of torch's optimizer class `cls` whose step runs without torch._dynamo (the
    class's own step, gradients set as torch's wrapper sets them)."""
    return type(cls.__name__, (cls,), {"step": _plain_step(cls), "__module__": __name__,
                                       "__doc__": f"torch.optim.{cls.__name__}, stepped without torch._dynamo."})


def _plain_step(cls: type[torch.optim.Optimizer]) -> Any:
    wrapped = getattr(cls.step, "__wrapped__")

    def step(self: Any, closure: Any = None) -> Any:
        previous = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return wrapped(self, closure)
        finally:
            torch.set_grad_enabled(previous)

    step.__doc__ = cls.step.__doc__
    return step


SGD: type[torch.optim.SGD] = dynamo_free(torch.optim.SGD) if DYNAMO_FREE else torch.optim.SGD
Adam: type[torch.optim.Adam] = dynamo_free(torch.optim.Adam) if DYNAMO_FREE else torch.optim.Adam


def build(name: str, params: Any, lr: float | torch.Tensor, betas: tuple[float, float] = (0.9, 0.999),
          momentum: float = 0.0, weight_decay: float = 0.0, **impl: Any) -> torch.optim.Optimizer:
    """SGD or Adam (`name`: "sgd" or "adam") over `params`; `impl`: torch's flags for how it
    runs (fused, capturable, foreach)."""
    if name == "adam":
        return Adam(params, lr=lr, betas=betas, weight_decay=weight_decay, **impl)
    return SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **impl)
