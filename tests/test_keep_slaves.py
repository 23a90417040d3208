"""keep_slaves: the run stops renewing the kept slaves' lease, so a budget guard takes it over
(without one the slaves would power themselves off when the lease passes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gputui.cloud import guardian
from gputui.cluster import teardown


class _Slaves:
    def __init__(self, ids: list[str]) -> None:
        self.ids, self.released = ids, []

    def pending(self) -> list[str]:
        return [i for i in self.ids if i not in self.released]


def _ctx(keep: bool, events: list[tuple[str, dict[str, Any]]], lease: Any) -> Any:
    cloud = SimpleNamespace(provider=SimpleNamespace(name="sim", region="us-east-1"), cluster="c1",
                            settings=SimpleNamespace(source=None))
    manager = SimpleNamespace(ctx=cloud, release=lambda ids: [] if keep else list(ids))
    return SimpleNamespace(lease=lease, slaves=_Slaves(["i-1", "i-2"]), manager=manager,
                           settings=SimpleNamespace(keep_slaves=keep),
                           emit=lambda name, **fields: events.append((name, fields)))


@pytest.mark.parametrize("keep", [True, False])
def test_kept_slaves_are_handed_to_a_guard_released_ones_are_not(keep: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Any] = []
    monkeypatch.setattr(guardian, "spawn", lambda ctx, interval: spawned.append((ctx.cluster, interval)) or 4242)
    stopped: list[bool] = []
    events: list[tuple[str, dict[str, Any]]] = []
    teardown._release(_ctx(keep, events, SimpleNamespace(stop=lambda: stopped.append(True))))
    assert stopped == [True]  # the run's own renewer stops either way
    if keep:
        assert spawned == [("c1", teardown.GUARD_INTERVAL_S)]
        [(name, fields)] = events
        assert name == "warning" and fields["reason"] == "keep_slaves"
        assert "pid 4242" in fields["message"] and "i-1, i-2" in fields["message"]
        assert "gputui cloud down --all --yes --provider sim --cluster c1" in fields["message"]
    else:
        assert spawned == [] and events[0][0] == "slaves_terminated"


def test_a_guard_that_cannot_start_is_said_with_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(ctx: Any, interval: float) -> int:
        raise OSError("No space left on device")

    monkeypatch.setattr(guardian, "spawn", fail)
    events: list[tuple[str, dict[str, Any]]] = []
    teardown._release(_ctx(True, events, None))
    [(name, fields)] = events
    assert fields["reason"] == "guard" and "No space left" in fields["message"]
    assert "gputui cloud guard --provider sim --cluster c1" in fields["message"]
