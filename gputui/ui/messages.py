"""What the workers tell the app. Workers only post these; the app updates the panels."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from gputui.dashboard.hosts import HostsFrame
from gputui.dashboard.slaves import CostFrame
from gputui.model.cloud import CloudEvent


class HostsPolled(Message):
    """One telemetry round finished (the next is scheduled only now: polls never overlap)."""

    def __init__(self, frame: HostsFrame | None, error: str | None = None) -> None:
        super().__init__()
        self.frame = frame
        self.error = error


class CostPolled(Message):
    """One cloud poll finished; `frame` None with `error` when it failed or there is no cloud."""

    def __init__(self, frame: CostFrame | None, error: str | None = None, disabled: str | None = None) -> None:
        super().__init__()
        self.frame = frame
        self.error = error
        self.disabled = disabled  # why there is no cloud (no [cloud] table): polls stop


class TrainingEvent(Message):
    """One event of the training child. Queued step events merge: only the newest is drawn."""

    def __init__(self, event: dict[str, Any], generation: int) -> None:
        super().__init__()
        self.event = event
        self.generation = generation

    def can_replace(self, message: Message) -> bool:
        return (isinstance(message, TrainingEvent) and message.generation == self.generation
                and message.event.get("event") == "step" and self.event.get("event") == "step")


class TrainingHistory(Message):
    """Earlier events of a resumed run (from its events.jsonl), drawn before the new ones."""

    def __init__(self, events: list[dict[str, Any]], generation: int) -> None:
        super().__init__()
        self.events = events
        self.generation = generation


class TrainingExited(Message):
    """The training child ended (or could not start)."""

    def __init__(self, code: int, error: str | None, generation: int) -> None:
        super().__init__()
        self.code = code
        self.error = error
        self.generation = generation


class CloudNote(Message):
    """A line for the events log from a cloud worker (price, budget effect, refusal)."""

    def __init__(self, text: str, severity: str = "information", notify: bool = False) -> None:
        super().__init__()
        self.text = text
        self.severity = severity
        self.notify = notify


class CloudEventPosted(Message):
    """A cloud event as the ledger records it (launched, running, interrupted, terminated ...)."""

    def __init__(self, event: CloudEvent) -> None:
        super().__init__()
        self.event = event


class SlavesChanged(Message):
    """A launch or termination finished: poll the cloud again soon."""
