"""The simulated cloud keeps a bounded record of the operations it served."""

from __future__ import annotations

import pytest

from gputui.cloud import sim


def test_the_record_of_operations_keeps_the_newest_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo left open lists its instances every 2 s: the record keeps the last CALLS_KEPT."""
    monkeypatch.setattr(sim, "CALLS_KEPT", 3)
    provider = sim.SimProvider("us-east-1")
    for _ in range(5):
        provider.list_tagged({"gputui": "1"})
    assert list(provider.calls) == ["list_tagged"] * 3
