"""The sweep screen (key W): one sweep's trials (number, state, parameters, value, slot), its best
value so far against time (textual-plotext), and which slot runs which trial.

The study is read in a thread worker (gputui.dashboard.sweep.read_sweep: Optuna on the SQLite
file) and the next read is scheduled only once a read is drawn, about once a second: reads never
pile up, and a busy file never stalls the screen. Everything read is data: shown as Text.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from gputui.model import units
from gputui.dashboard.sweep import SweepData, params_text, summary, value_text
from gputui.model.errors import GputuiError
from gputui.model.text import clean
from gputui.ui.bindings import Key
from gputui.ui.tables import KeyedTable

REFRESH_S = 1.0

SWEEP_KEYS: tuple[Key, ...] = (
    Key("n", "next_sweep", "Next sweep", "Show the next sweep in the study file (they cycle, newest last)."),
    Key("escape", "close", "Back", "Back to the dashboard (W too).", "Esc"),
)

STATE_STYLE = {"running": "bold", "complete": "green", "pruned": "yellow", "fail": "red", "requeued": "dim",
               "waiting": "dim"}


def sweep_bindings() -> list[BindingType]:
    keys: list[BindingType] = [Binding(k.key, k.action, k.label, key_display=k.display) for k in SWEEP_KEYS]
    return keys + [Binding("W", "close", "Back", show=False)]


class SweepRead(Message):
    def __init__(self, data: SweepData | None, names: list[str], error: str | None = None) -> None:
        super().__init__()
        self.data, self.names, self.error = data, names, error


class BestPlot(PlotextPlot):
    DEFAULT_CSS = "BestPlot { width: 1fr; height: 1fr; min-height: 8; }"


class SweepScreen(Screen[None]):
    """Sweep `name` (None: the newest in the study file), re-read about once a second."""

    BINDINGS = sweep_bindings()
    DEFAULT_CSS = """
    SweepScreen #sweep-summary { height: auto; padding: 0 1; }
    SweepScreen #sweep-trials { height: 2fr; }
    SweepScreen #sweep-lower { height: 1fr; min-height: 10; }
    SweepScreen #sweep-slots { width: 40; }
    """

    def __init__(self, name: str | None = None, path: Any = None, interval: float = REFRESH_S) -> None:
        super().__init__()
        self.sweep_name = name
        self.path = path
        self.interval = interval
        self.data: SweepData | None = None
        self.names: list[str] = []
        self.reads = 0  # reads drawn (tests wait on it)
        self._drawn_best: tuple[Any, ...] | None = None
        self._timer: Any = None

    def compose(self) -> ComposeResult:
        with Vertical(id="sweep"):
            yield Static(Text("sweep: reading the study..."), id="sweep-summary")
            yield KeyedTable(id="sweep-trials", cursor_type="row", zebra_stripes=True)
            with Horizontal(id="sweep-lower"):
                yield BestPlot(id="sweep-best")
                yield KeyedTable(id="sweep-slots", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        trials = self.query_one("#sweep-trials", KeyedTable)
        trials.add_columns("trial", "state", "value", "slot", "time", "params")
        slots = self.query_one("#sweep-slots", KeyedTable)
        slots.add_columns("slot", "trial", "running for")
        trials.focus()
        self.read()

    # fetch -------------------------------------------------------------------------------
    def read(self) -> None:
        self.run_worker(self._read, name="sweep-read", group="sweep-read", thread=True, exclusive=True,
                        exit_on_error=False)

    def _read(self) -> None:
        from gputui.dashboard.sweep import read_sweep, sweep_names

        try:
            names = sweep_names(self.path)
            data = read_sweep(self.sweep_name, self.path) if names else None
        except GputuiError as exc:
            self.post_message(SweepRead(None, [], str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - the file may be mid-write by the master: say it, read again
            self.post_message(SweepRead(None, [], f"cannot read the sweeps: {type(exc).__name__}: {exc}"))
            return
        self.post_message(SweepRead(data, names))

    # render ------------------------------------------------------------------------------
    def on_sweep_read(self, message: SweepRead) -> None:
        self.names = message.names or self.names
        summary_widget = self.query_one("#sweep-summary", Static)
        if message.error is not None:
            summary_widget.update(Text(clean(message.error), "red"))
        elif message.data is None:
            summary_widget.update(Text("no sweep yet: `gputui sweep PROFILE` starts one (profiles/sweep.toml)"))
        else:
            self.data = message.data
            summary_widget.update(Text(clean(summary(message.data))))
            self._trials(message.data)
            self._slots(message.data)
            self._best(message.data)
        self.reads += 1
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(self.interval, self.read, name="sweep-next-read")  # once this read is drawn

    def _trials(self, data: SweepData) -> None:
        table = self.query_one("#sweep-trials", KeyedTable)
        selected = table.selected_key
        table.clear()
        for r in reversed(data.rows):  # newest first
            seconds = r.seconds
            if seconds is None and r.started is not None and r.state == "running":
                seconds = self.app_time() - r.started
            table.add_row(Text(str(r.number)), Text(r.state, STATE_STYLE.get(r.state, "")),
                          Text(value_text(r.value, data.metric) if r.state == "complete" else units.NA),
                          Text(clean(r.slot or units.NA)), Text(units.duration(seconds)),
                          Text(clean(params_text(r.params) + (f"; error: {r.error}" if r.error else ""), 400)),
                          key=str(r.number))
        if selected is not None and any(str(r.number) == selected for r in data.rows):
            table.move_cursor(row=table.get_row_index(selected))

    def _slots(self, data: SweepData) -> None:
        table = self.query_one("#sweep-slots", KeyedTable)
        table.clear()
        for r in data.running:
            since = self.app_time() - r.started if r.started is not None else None
            table.add_row(Text(clean(r.slot or units.NA)), Text(str(r.number)), Text(units.duration(since)),
                          key=f"{r.slot}-{r.number}")
        table.border_title = f"slots: {len(data.running)} running"

    def _best(self, data: SweepData) -> None:
        key = (data.name, data.best, self.size.width, self.size.height)
        if key == self._drawn_best:
            return
        self._drawn_best = key
        plot = self.query_one(BestPlot)
        plt = plot.plt
        plt.clear_figure()
        if data.best:
            xs = [t / 60 for t, _v in data.best]
            ys = [v for _t, v in data.best]
            # a step line: the best holds until the next better trial
            sx, sy = [xs[0]], [ys[0]]
            for x, y in zip(xs[1:], ys[1:]):
                sx += [x, x]
                sy += [sy[-1], y]
            plt.plot(sx, sy, marker="braille")
            plt.scatter(xs, ys, marker="dot")
            lo, hi = min(sx), max(sx)
            marks = [lo + (hi - lo) * k / 4 for k in range(5)] if hi > lo else [lo]
            plt.xticks(marks, [units.duration(m * 60) for m in marks])
            plt.xlabel("time since the first trial started")
            plt.ylabel("best " + {"test_accuracy": "test acc (%)", "time_to_accuracy": "seconds"}.get(data.metric,
                                                                                                   data.metric))
            plt.title("best so far")
        else:
            plt.title("best so far: no trial complete yet")
        plot.refresh()

    def app_time(self) -> float:
        import time

        return time.time()

    # keys --------------------------------------------------------------------------------
    def action_next_sweep(self) -> None:
        if not self.names:
            return
        current = self.data.name if self.data is not None else self.sweep_name
        index = self.names.index(current) if current in self.names else -1
        self.sweep_name = self.names[(index + 1) % len(self.names)]
        self._drawn_best = None
        self.read()

    def action_close(self) -> None:
        self.app.pop_screen()
