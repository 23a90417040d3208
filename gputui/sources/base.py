"""The contract every telemetry source meets."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gputui.model.telemetry import HostSnapshot


@runtime_checkable
class Source(Protocol):
    """Something that can be polled for host snapshots.

    `poll()` returns one snapshot per host it knows, in a stable order, and never raises
    for a host's trouble: that is the host's state. A poll is never started while the
    previous one runs. `close()` releases connections and libraries; it is idempotent.
    """

    def poll(self) -> list[HostSnapshot]: ...

    def close(self) -> None: ...
