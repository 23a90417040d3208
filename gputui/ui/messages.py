"""What the workers tell the app. Workers only post these; the app updates the panels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from textual.message import Message

from gputui.dashboard.hosts import HostsFrame
from gputui.dashboard.cost import CostFrame
from gputui.dashboard.training import TrainingState
from gputui.model.cloud import CloudEvent

if TYPE_CHECKING:  # gputui.monitor.alerts loads in the poll worker, with a profile that has [alerts]
    from gputui.monitor.alerts import Alert
    from gputui.runs.store import RunDir


class HostsPolled(Message):
    """One telemetry round finished (the next is scheduled only now: polls never overlap)."""

    def __init__(self, frame: HostsFrame | None, error: str | None = None, alerts: Sequence[Alert] = ()) -> None:
        super().__init__()
        self.frame = frame
        self.error = error
        self.alerts = tuple(alerts)  # what the profile's [alerts] raised on this round (evaluated in the worker)


class CostPolled(Message):
    """One cloud poll finished; `frame` None with `error` when it failed or there is no cloud."""

    def __init__(self, frame: CostFrame | None, error: str | None = None, disabled: str | None = None) -> None:
        super().__init__()
        self.frame = frame
        self.error = error
        self.disabled = disabled  # why there is no cloud (no [cloud] table): polls stop


class TrainingUpdate(Message):
    """The run's state after its latest event. Queued updates merge: the newest holds every
    point of the curves, so merging loses nothing however fast the events come."""

    def __init__(self, state: TrainingState, generation: int) -> None:
        super().__init__()
        self.state = state
        self.generation = generation

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TrainingUpdate) and message.generation == self.generation


class TrainingLine(Message):
    """A line for the events log about the run (started, epoch, interrupted, done)."""

    def __init__(self, text: str, severity: str, generation: int) -> None:
        super().__init__()
        self.text = text
        self.severity = severity
        self.generation = generation


class TrainingExited(Message):
    """The training child ended (or could not start)."""

    def __init__(self, code: int, error: str | None, generation: int) -> None:
        super().__init__()
        self.code = code
        self.error = error
        self.generation = generation


class RunStopping(Message):
    """What a stopping training child waits for ("" once it has ended); `log`: a line for the
    events log (the run's own `stopping` message, or the SIGKILL at the bound) rather than the status line."""

    def __init__(self, child: object, text: str, log: bool) -> None:
        super().__init__()
        self.child = child
        self.text = text
        self.log = log


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


class StopRunsFirst(Message):
    """`d` picked a slave that live runs are training on: stop them (each as s would) before it goes."""

    def __init__(self, runs: tuple[RunDir, ...], text: str) -> None:
        super().__init__()
        self.runs = runs
        self.text = text


class SlavesChanged(Message):
    """A launch or termination finished: poll the cloud again soon."""


class EventLine(Message):
    """A line for the events log from any worker or background thread (a kill's outcome, an
    alert that could not be delivered)."""

    def __init__(self, text: str, severity: str = "information", notify: bool = False) -> None:
        super().__init__()
        self.text = text
        self.severity = severity
        self.notify = notify


class ProcessSignalled(Message):
    """A signal sent from the process table: sent, or refused with the reason, as one line."""

    def __init__(self, line: str, ok: bool) -> None:
        super().__init__()
        self.line = line
        self.ok = ok
