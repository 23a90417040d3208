"""The sweep tests' view: a sweep view (gputui.sweep.scheduler.SweepView) that keeps what it was shown."""

from __future__ import annotations

from typing import Any


class Seen:
    """A sweep view that keeps what it was shown."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def sweep(self, kind: str, **fields: Any) -> None:
        self.lines.append((kind, fields))

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        pass

    def progress(self, p: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for k, f in self.lines if k == kind]

    def warnings(self) -> list[dict[str, Any]]:
        return self.of("warning")
