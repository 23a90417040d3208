"""How `gputui sweep` shows itself: a live progress line on a terminal, plain lines otherwise,
or JSON lines (`--json`, for scripts and tests).

Slot names, messages and parameters can come from remote workers: they are shown as Text
cleaned of control characters, never as markup.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from gputui.model import units
from gputui.model.text import clean
from gputui.model.units import plural_of

if TYPE_CHECKING:
    from gputui.sweep.scheduler import SweepView


def value_text(value: float | None, metric: str) -> str:
    """A trial's value: a test accuracy in %, a time to accuracy in s, a program's metric as it is."""
    if value is None:
        return units.NA
    if metric == "test_accuracy":
        return f"{value:.2f}%"
    return f"{value:.2f} s" if metric == "time_to_accuracy" else f"{value:.4g}"


def progress_text(p: Any, metric: str) -> str:
    best = value_text(p.best, metric)
    if p.best_trial is not None:
        best += f" (#{p.best_trial})"
    line = (f"{p.name}: {p.done}/{p.trials} done, {p.running} running, {p.pruned} pruned, {p.failed} failed, "
            f"best {best}, {units.money(p.spent_usd)} spent")
    return line + (f"; {p.note}" if p.note else "")


def _params(params: Any) -> str:
    if not isinstance(params, dict):
        return ""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def event_line(kind: str, fields: dict[str, Any], metric: str) -> str | None:
    """The plain line for a sweep happening (None: not worth a line)."""
    if kind == "trial_done":
        state = fields.get("state")
        what = value_text(fields.get("value"), metric) if state == "complete" else state
        extra = f": {fields['error']}" if fields.get("error") else ""
        return f"trial {fields.get('trial')} {what} on {fields.get('slot') or units.NA} ({_params(fields.get('params'))}){extra}"
    if kind == "requeued":
        return f"trial {fields.get('trial')} goes back to the queue (attempt {fields.get('attempt')}): {fields.get('message')}"
    if kind == "slot" and fields.get("state") in ("lost", "failed", "close_failed"):
        return f"slot {fields.get('slot')} {fields.get('state')}: {fields.get('message')}"
    if kind == "warning":
        return f"warning: {fields.get('message')}"
    if kind == "code":
        setup = "; [run] setup ran" if fields.get("setup") else ""
        return (f"code on host {fields.get('host')}: {plural_of(fields.get('sent_files'), 'file')} sent, "
                f"{fields.get('unchanged_files')} unchanged, in {fields.get('code_dir')}{setup}")
    if kind == "shutdown_failed":
        return f"shutdown: could not {fields.get('step')}: {fields.get('message')}"
    if kind == "budget":
        return f"budget: {fields.get('message')} ({units.money(fields.get('spent_usd'))} of {units.money(fields.get('budget_usd'))})"
    if kind == "start":
        return (f"sweep {fields.get('name')}: {fields.get('trials')} trials on {plural_of(fields.get('slots'), 'slot')}; "
                f"study in {fields.get('storage')}")
    return None


class JsonLines:
    """`--json`: one JSON object a line on stdout: {"sweep": KIND, ...}; run events as
    {"sweep": "run", "trial": N, "slot": S, "data": EVENT}; progress when a count changes."""

    def __init__(self) -> None:
        self._last: tuple[Any, ...] | None = None

    def _write(self, value: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(value, separators=(", ", ": "), allow_nan=False, default=str) + "\n")
        sys.stdout.flush()

    def sweep(self, kind: str, **fields: Any) -> None:
        self._write({"sweep": kind, **{k: v for k, v in fields.items() if v is not None}})

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        from gputui.model.events import typed

        self._write({"sweep": "run", "trial": trial, "slot": slot, "data": typed(event)})

    def progress(self, p: Any) -> None:
        key = (p.done, p.running, p.pruned, p.failed, p.best, p.note)
        if key != self._last:
            self._last = key
            self._write({"sweep": "progress", "done": p.done, "trials": p.trials, "running": p.running,
                         "complete": p.complete, "pruned": p.pruned, "failed": p.failed, "best": p.best,
                         "best_trial": p.best_trial, "spent_usd": round(p.spent_usd, 6), "note": p.note or None})

    def close(self) -> None:
        pass


class Lines:
    """Not a terminal: a plain line for each trial that ends (with the counts), and each fault."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self._last: tuple[Any, ...] | None = None

    def _say(self, text: str) -> None:
        print(clean(text, 4000), file=sys.stderr, flush=True)

    def sweep(self, kind: str, **fields: Any) -> None:
        line = event_line(kind, fields, self.metric)
        if line:
            self._say(line)

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        pass

    def progress(self, p: Any) -> None:
        key = (p.done, p.pruned, p.failed, p.best, p.note)
        if key != self._last:
            self._last = key
            self._say(progress_text(p, self.metric))

    def close(self) -> None:
        pass


class Live:
    """A terminal: one live progress line (rich), with the trials' ends printed above it."""

    def __init__(self, metric: str) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive
        from rich.text import Text

        self.metric = metric
        self.console = Console(stderr=True)
        self._text = Text
        self.live = RichLive(Text(""), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def sweep(self, kind: str, **fields: Any) -> None:
        line = event_line(kind, fields, self.metric)
        if line:
            self.console.print(self._text(clean(line, 4000)))

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        pass

    def progress(self, p: Any) -> None:
        self.live.update(self._text(clean(progress_text(p, self.metric), 4000), style="bold"))

    def close(self) -> None:
        self.live.stop()


def make_view(json_lines: bool, metric: str) -> SweepView:
    if json_lines:
        return JsonLines()
    return Live(metric) if sys.stderr.isatty() else Lines(metric)
