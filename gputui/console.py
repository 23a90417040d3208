"""How `gputui run` shows its events on a terminal: JSON lines, or a rich progress bar."""

from __future__ import annotations

import sys
from typing import Any, Protocol

from gputui.runs import encode


class View(Protocol):
    """Receives every event of a run, in order."""

    def show(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class CollectView:
    """Keeps every event in `events` and shows nothing (benchmarks, tests, scripts)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def show(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


class JsonView:
    """`--json`: exactly one JSON line per event on stdout, nothing else there."""

    def show(self, event: dict[str, Any]) -> None:
        sys.stdout.write(encode(event) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


def _fmt_acc(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


class ProgressView:
    """A rich progress bar on stderr with loss, accuracy, samples/s and ETA; a line per epoch."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("acc {task.fields[acc]}"),
            TextColumn("{task.fields[rate]} samples/s"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task: Any = None
        self.epochs = 0

    def show(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "start":
            self.epochs = event["epochs"]
            resumed = event.get("resumed_from_step")
            note = f", resumed at step {resumed}" if resumed is not None else ""
            self.console.print(
                f"run [bold]{event['run_id']}[/]: model {event['model']} on {event['device']} "
                f"({event['strategy']}, {event.get('world_size', 1)} process(es)){note}"
            )
            self.progress.start()
            self.task = self.progress.add_task(
                f"epoch 1/{self.epochs}",
                total=event["total_steps"],
                completed=resumed or 0,
                loss="n/a",
                acc="n/a",
                rate="n/a",
            )
        elif self.task is None:
            return
        elif kind == "step":
            self.progress.update(
                self.task,
                completed=event["step"],
                description=f"epoch {event['epoch']}/{self.epochs}",
                loss=f"{event['loss']:.4f}",
                rate=f"{event['samples_per_s']:,.0f}",
            )
        elif kind in ("eval", "epoch"):
            self.progress.update(self.task, completed=event["step"], acc=_fmt_acc(event["test_acc"]))
            if kind == "epoch":
                self.progress.console.print(
                    f"epoch {event['epoch']}/{self.epochs}: train loss {event['train_loss']:.4f}, "
                    f"test loss {event['test_loss']:.4f}, test acc {_fmt_acc(event['test_acc'])} "
                    f"({event['elapsed_s']:.1f} s training)"
                )
        elif kind == "interrupted":
            self.close()
            self.console.print(f"[yellow]interrupted[/] ({event.get('reason', '')}) at step {event['step']}")
        elif kind == "done":
            self.close()
            self.console.print(
                f"[green]done[/]: test acc {_fmt_acc(event['test_acc'])} after {event['epochs']} epoch(s), "
                f"{event['elapsed_s']:.1f} s training (+{event['eval_s']:.1f} s evaluation)"
            )

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()
