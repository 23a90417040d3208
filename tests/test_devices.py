"""Device choice: CUDA, then MPS, then CPU; forced devices that are absent are clear errors."""

from __future__ import annotations

import pytest
import torch

from gputui.model.errors import UserError
from gputui.train.devices import resolve_device


def test_cpu_is_always_there() -> None:
    assert resolve_device("cpu")[0] == torch.device("cpu")


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    device, why = resolve_device("auto")
    assert device.type == "cpu" and "no CUDA or MPS" in why
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto")[0].type == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    device, why = resolve_device("auto")
    assert device == torch.device("cuda", 0) and "Fake GPU" in why


def test_forced_cuda_without_cuda_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA device is available"):
        resolve_device("cuda:1")


def test_cuda_index_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


def test_mps_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(UserError, match="MPS is not available"):
        resolve_device("mps")
