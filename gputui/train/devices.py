"""Device choice, like the paper's Theano: CUDA, then Apple MPS, then the CPU."""

from __future__ import annotations

import torch

from gputui.model.errors import UserError
from gputui.model.units import plural


def resolve_device(spec: str) -> tuple[torch.device, str]:
    """The torch device for `spec` ('auto', 'cpu', 'mps', 'cuda', 'cuda:N') and why it was picked."""
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if spec == "auto":
        if cuda:
            return torch.device("cuda", 0), f"auto: CUDA ({torch.cuda.get_device_name(0)})"
        if mps:
            return torch.device("mps"), "auto: Apple MPS"
        return torch.device("cpu"), "auto: no CUDA or MPS device, using the CPU"
    if spec == "cpu":
        return torch.device("cpu"), "forced"
    if spec == "mps":
        if not mps:
            raise UserError("--device mps: Apple MPS is not available here; use --device auto or cpu")
        return torch.device("mps"), "forced"
    if spec.startswith("cuda"):
        if not cuda:
            raise UserError(
                f"--device {spec}: no CUDA device is available (torch {torch.__version__}, "
                f"built {'with' if torch.version.cuda else 'without'} CUDA); use --device auto or cpu"
            )
        index = int(spec.split(":", 1)[1]) if ":" in spec else 0
        count = torch.cuda.device_count()
        if index >= count:
            raise UserError(f"--device {spec}: only {plural(count, 'CUDA device')} visible (cuda:0..cuda:{count - 1})")
        return torch.device("cuda", index), f"forced ({torch.cuda.get_device_name(index)})"
    raise UserError(f"--device {spec}: expected auto, cpu, mps, cuda or cuda:N")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on `device`, so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
