"""How `gputui run` shows its events on a terminal: JSON lines, or a rich progress bar.

Events may be relayed from slaves: their values are data. The progress view shows them as
`Text` cleaned of control characters, never as markup, and a value of the wrong type as "n/a".
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol

from gputui.model import units
from gputui.model.events import typed
from gputui.model.text import clean
from gputui.runs.store import encode


def table_width(pipe_width: int) -> int | None:
    """The width of a table printed on stdout: the terminal's (None: rich measures it); off a
    terminal, $COLUMNS when it is set, else `pipe_width` (wide enough that a file keeps every column)."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else pipe_width


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
    """`--json`: exactly one JSON line per event on stdout, nothing else there. Events are
    written as they came (relayed text included, escaped); a relayed number that is not
    finite is written as null (gputui.model.events.typed), never as a line that is not JSON."""

    program_stdin = True  # a program reads the command's stdin (gputui.jobs.program)

    def __init__(self) -> None:
        self.said_error = False  # an `error` event went out (bad input before the run says its own)

    def show(self, event: dict[str, Any]) -> None:
        self.said_error = self.said_error or event.get("event") == "error"
        try:
            line = encode(event)
        except ValueError:
            line = encode(typed(event))
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


def _num(value: Any, spec: str, unit: str = "") -> str:
    """A number from an event, formatted; "n/a" for None or anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    try:
        return f"{value:{spec}}{unit}"
    except ValueError:  # a float where an integer belongs
        return "n/a"


def _fmt_acc(value: Any) -> str:
    return _num(value, ".2f", "%")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(*parts: str | tuple[Any, str]) -> Any:
    """A line of plain strings (ours) and (value, style) pairs (the event's, cleaned): no markup."""
    from rich.text import Text

    line = Text()
    for part in parts:
        if isinstance(part, tuple):
            line.append(clean(str(part[0])), part[1])
        else:
            line.append(part)
    return line


class ProgressView:
    """A rich progress bar on stderr with loss, accuracy, samples/s and ETA; a line per epoch."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        # Not a terminal (CI logs, `| cat`, a file): a line is a line, never folded at 80 columns.
        self.console.soft_wrap = not self.console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            # fixed widths: the bar does not jump as "n/a" becomes "0.1234" or 9.9k/s becomes 10k/s
            TextColumn("loss {task.fields[loss]:>6}", markup=False),
            TextColumn("acc {task.fields[acc]:>6}", markup=False),
            TextColumn("{task.fields[rate]:>5} samples/s", markup=False),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task: Any = None
        self.epochs = 0
        self.steps_per_epoch = 0
        self._stopped = False

    def _epoch(self, epoch: Any) -> str:
        """'epoch 3/12', the number padded to the total's width (the bar does not move at 10)."""
        total = str(self.epochs)
        return f"epoch {_num(epoch, 'd'):>{len(total)}}/{total}"

    def show(self, event: dict[str, Any]) -> None:
        event = typed(event)
        kind = event.get("event")
        if kind == "start":
            self.epochs = _int(event.get("epochs")) or 0
            self.steps_per_epoch = _int(event.get("steps_per_epoch")) or 0
            resumed = _int(event.get("resumed_from_step"))
            note = f", resumed at step {resumed}" if resumed is not None else ""
            world = _int(event.get("world_size", 1))
            self.console.print(_text(
                "run ", (event.get("run_id"), "bold"), ": model ", (event.get("model"), ""), " on ",
                (event.get("device"), ""), " (", (event.get("strategy"), ""), ", ",
                (units.plural_of(world, "process"), ""), f"){note}",
            ))
            epoch = 1
            if resumed and self.steps_per_epoch:  # resumed in the epoch that step belongs to
                epoch = min(resumed // self.steps_per_epoch + 1, max(self.epochs, 1))
            self.progress.start()
            self.task = self.progress.add_task(
                self._epoch(epoch),
                total=_int(event.get("total_steps")),
                completed=resumed or 0,
                loss="n/a",
                acc=_fmt_acc(event.get("last_acc")),  # a resumed run keeps its last accuracy
                rate="n/a",
            )
        elif self.task is None:
            return
        elif kind == "step":
            self.progress.update(
                self.task,
                completed=_int(event.get("step")),
                description=self._epoch(event.get("epoch")),
                loss=_num(event.get("loss"), ".4f"),
                rate=units.rate(event.get("samples_per_s")).removesuffix("/s"),  # "140k samples/s"; n/a: not a number
            )
        elif kind in ("eval", "epoch"):
            self.progress.update(self.task, completed=_int(event.get("step")), acc=_fmt_acc(event.get("test_acc")))
            if kind == "epoch":
                self.progress.console.print(_text(
                    f"epoch {_num(event.get('epoch'), 'd')}/{self.epochs}: train loss {_num(event.get('train_loss'), '.4f')}, "
                    f"test loss {_num(event.get('test_loss'), '.4f')}, test acc {_fmt_acc(event.get('test_acc'))} "
                    f"({_num(event.get('elapsed_s'), '.1f')} s training)"
                ))
        elif kind == "error":
            self.close()  # the command prints the error's one line itself
        elif kind == "interrupted":
            self.close()
            self.console.print(_text(("interrupted", "yellow"), " (", (event.get("reason", ""), ""),
                                     f") at step {_num(event.get('step'), 'd')}"))
        elif kind == "done":
            self.close()
            self.console.print(_text(
                ("done", "green"),
                f": test acc {_fmt_acc(event.get('test_acc'))} after {units.plural_of(event.get('epochs'), 'epoch')}, "
                f"{_num(event.get('elapsed_s'), '.1f')} s training (+{_num(event.get('eval_s'), '.1f')} s evaluation)",
            ))

    def close(self) -> None:
        if self.task is not None and not self._stopped:
            self._stopped = True  # rich adds an empty line on each stop off a terminal
            self.progress.stop()
