"""The contract between the sweep's scheduler and its slots.

A `Slot` is a place for one long-lived worker (a GPU, a share of a GPU, or the CPU); `spawn`
starts its worker and hands back a `WorkerHandle`. The scheduler only sees these two Protocols,
so this machine's slots (gputui.sweep.slots), SSH hosts (gputui.sweep.remote) and cloud slaves
(gputui.sweep.cloudslots) are Slot classes side by side, each importing this module only.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class WorkerGone(Exception):
    """A message could not reach a worker: its process or connection is gone."""


class WorkerHandle(Protocol):
    """A running worker. `lines` is read by one scheduler thread; the rest is called by the master loop."""

    pid: int | None  # a local process id, else None (what `kill` ends is the slot's business)

    def send(self, message: dict[str, Any]) -> None:
        """Write one protocol message to the worker's stdin; WorkerGone when it cannot."""
        ...

    def lines(self) -> Iterator[str]:
        """The worker's stdout lines, until it ends (then the iterator ends)."""
        ...

    def kill(self) -> None:
        """End the worker now (SIGKILL or the remote equivalent); safe to call twice."""
        ...

    def alive(self) -> bool:
        ...

    def exit_code(self) -> int | None:
        """The worker's exit status once it ended (None while it runs, or when unknown)."""
        ...

    def last_words(self) -> str:
        """The tail of what the worker wrote on stderr (for an error message), or ''."""
        ...


class Slot(Protocol):
    """A place for one worker. `usd_per_hour` is what the slot costs while held (0 for local ones)."""

    name: str
    device: str
    usd_per_hour: float

    def spawn(self) -> WorkerHandle:
        """Start this slot's worker (a raised GputuiError: the slot cannot start one)."""
        ...

    def close(self) -> None:
        """The sweep is over: release what the slot holds (a cloud slot its slave, unless kept)."""
        ...
