"""The training curves panel: loss (left axis, log scale by default) and test accuracy (right
axis, %) against step, epoch, samples or training time, drawn by textual-plotext.

Cheap to feed, throttled to draw: setting `curves` (or `state`) only keeps the new value; a
timer rebuilds the plot at most every REDRAW_S and only when something it shows changed (the
data, the axis, the smoothing, the scale, the overlays, the size), so a run streaming a
thousand events a second costs one plot build per tick. Smoothing is TensorBoard's debiased
EMA: each series' raw curve is drawn faint under its smoothed one, which is bold. Earlier runs
(`app.overlay_runs`, run directories) are laid over in muted colours, named in the legend.

A run of the user's own program (its state has `program`) has its own metrics instead: one
at a time (`metric`, m picks the next; loss-like names first, then accuracy-like), against
its step or time, with the same smoothing, overlays (the same metric of the runs laid over)
and log scale (for a loss-like metric).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.color import Color
from textual.containers import Vertical
from textual.events import Resize
from textual.timer import Timer
from textual.widgets import Static

from gputui.runs.curves import (METRIC_AXES, SERIES, SERIES_LABELS, X_AXES, X_LABELS, Curves, MetricCurves, SeriesCache,
                                axis_labels, linear_ticks, load_metrics, load_run, log_ticks, metric_kind, sample, thin,
                                ticks, x_labels, xy)
from gputui.model.errors import GputuiError
from gputui.runs.history import export_csv
from gputui.model.text import clean

REDRAW_S = 0.85  # at most 1.2 plot builds a second: above the 1 Hz the curves promise, at a bounded cost
IDLE_TICKS = 3  # ticks in a row with nothing to draw before the redraw timer pauses (new data wakes it)
SMOOTHING = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
DEFAULT_SMOOTHING = 0.6  # TensorBoard's default
COLOURS: dict[str, tuple[int, int, int]] = {"train_loss": (64, 156, 255), "epoch_loss": (176, 124, 255),
                                            "test_loss": (255, 150, 40), "test_acc": (60, 200, 100)}
OVERLAY_COLOURS: tuple[tuple[int, int, int], ...] = ((150, 150, 150), (176, 146, 112), (112, 150, 176),
                                                     (164, 128, 164), (140, 166, 120), (176, 120, 120))
MIN_SIZE = (30, 7)  # columns, rows: below this the panel says so rather than draw a plot of axes alone
FAINT = 0.6  # how far a raw curve's colour goes toward the background
DENSE_STEPS = 4  # step losses per epoch mean from which the epoch means are left out of the plot (not the CSV)
# A program's metric: loss-like, accuracy-like, other (gputui.runs.curves.metric_kind).
METRIC_COLOURS = (COLOURS["train_loss"], COLOURS["test_acc"], COLOURS["epoch_loss"])


def curves_of(state: Any) -> Curves:
    """The curves in a TrainingState: its `curves` field, or else built from its (step, value)
    points (then there is no test loss and no time axis)."""
    curves = getattr(state, "curves", None)
    if isinstance(curves, Curves):
        return curves
    return Curves.from_points(state.loss_points, state.acc_points, state.steps_per_epoch, state.batch_size,
                              state.run_id, state.run_dir)


def _data_of(state: Any) -> tuple[Any, ...]:
    """What of a state the curves depend on, compared by identity (the state's tuples are new when they changed)."""
    curves = getattr(state, "curves", None)
    if getattr(state, "program", None) is not None:
        return (curves, state.metric_curves)
    return (curves,) if curves is not None else (state.loss_points, state.acc_points, state.run_id)


def _program_metrics(state: Any) -> MetricCurves | None:
    """A program run's metric curves (None for a run of a built-in net, or no run)."""
    if getattr(state, "program", None) is None:
        return None
    curves = getattr(state, "metric_curves", None)
    return curves if isinstance(curves, MetricCurves) else MetricCurves()


def _span(series: Any) -> tuple[float, float] | None:
    """The lowest and the highest value of some lists of numbers (None when all are empty)."""
    spans = [(min(values), max(values)) for values in series if values]
    return (min(lo for lo, _ in spans), max(hi for _, hi in spans)) if spans else None


Line = tuple[list[float], list[float], tuple[int, int, int], str, "str | None"]  # xs, ys, colour, y side, style


def _rgb(colour: tuple[int, int, int]) -> str:
    return "rgb({},{},{})".format(*colour)


_PLOT_CLASS: Any = None


def _plot_class() -> Any:
    """CurvePlot, the plot widget: built on first use, so that plotext (a few hundred ms to
    import) loads after the dashboard's first frame, not before it."""
    global _PLOT_CLASS
    if _PLOT_CLASS is None:
        from textual_plotext import PlotextPlot

        class CurvePlot(PlotextPlot):
            """The plot; its panel sets it up and refreshes it (it never rebuilds on its own).

            plotext draws into a matrix of characters and colours and then writes it out as one
            ANSI string, which textual-plotext parses back into rich Text: a third of a paint.
            This widget reads plotext's matrix into the same Text directly (same characters,
            same styles, one span a run of colour). Should a later plotext differ from what this
            expects, the paint goes the ANSI way, and says so once."""

            DEFAULT_CSS = "CurvePlot { width: 1fr; height: 1fr; }"
            builds = 0  # plotext builds (one per paint of this widget)
            direct = True  # False once the direct path failed: the ANSI one from then on

            def render(self) -> RenderResult:
                self.builds += 1
                if self.direct:
                    try:
                        return self.render_direct()
                    except Exception as exc:  # noqa: BLE001 - plotext's internals are not its API
                        self.direct = False
                        self.log.warning(f"curves: plotext's matrix could not be read ({exc!r}); drawing "
                                         "through its ANSI output")
                        say = getattr(self.app, "say", None)
                        if callable(say):
                            say("curves: drawn the slower way (plotext's matrix could not be read)", "warning")
                return super().render()

            def render_direct(self) -> Text:
                """What `PlotextPlot.render` returns, from plotext's matrix without the ANSI round trip."""
                # plotext's internals (_set_sizes, _build_matrix, monitor) are not in textual-plotext's types
                plot: Any = self._plot
                plot.plotsize(self.size.width, self.size.height)
                plot._set_size(self.size.width, self.size.height)  # as PlotextPlot.render does
                plot.theme(self._get_plotext_theme_name(self.app.theme))
                plot._set_sizes()  # plotext's build(), less its writing the matrix out as ANSI text
                plot._build_matrix()
                return matrix_text(plot.monitor.matrix)

        _PLOT_CLASS = CurvePlot
    return _PLOT_CLASS


_STYLES: dict[tuple[Any, Any, Any], Any] = {}


def _run_style(fullground: Any, style: Any, background: Any) -> Any:
    """The rich Style that Text.from_ansi gives a run of these plotext colours (cached: a plot
    uses a few)."""
    key = (fullground, style, background)
    found = _STYLES.get(key, _STYLES)
    if found is _STYLES:
        from rich.ansi import AnsiDecoder
        from plotext import _utility as ut

        line = next(iter(AnsiDecoder().decode(ut.colors_to_ansi(fullground, style, background) + "x" + ut.ansi_end)))
        found = _STYLES[key] = line.spans[0].style if line.spans else None
    return found


def matrix_text(matrix: Any) -> Text:
    """plotext's matrix (rows of characters and of colours, bottom row first) as the Text that
    Text.from_ansi makes of the ANSI string plotext would write for it."""
    rows = []
    for row in reversed(range(matrix.rows)):
        markers, fulls, styles, backs = matrix.marker[row], matrix.fullground[row], matrix.style[row], matrix.background[row]
        line = Text()
        start = 0
        for col in range(1, matrix.cols + 1):
            if col == matrix.cols or fulls[col] != fulls[start] or styles[col] != styles[start] or backs[col] != backs[start]:
                line.append("".join(markers[start:col]), _run_style(fulls[start], styles[start], backs[start]))
                start = col
        rows.append(line)
    rows.append(Text())  # plotext ends its last row with a newline too: the decoder makes it a line
    return Text("\n", end="\n", tab_size=8).join(rows)


def __getattr__(name: str) -> Any:  # `from gputui.ui.curves_panel import CurvePlot` loads plotext then
    if name == "CurvePlot":
        return _plot_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CurvesPanel(Vertical):
    DEFAULT_CSS = """
    CurvesPanel { height: 1fr; }
    CurvesPanel > #curves-legend { height: auto; max-height: 2; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None, interval: float = REDRAW_S) -> None:
        super().__init__(id=id, classes=classes)
        self.interval = interval
        self.axis = "step"
        self.weight = DEFAULT_SMOOTHING
        self.log_scale = True
        self.rebuilds = 0  # plot set-ups so far (the throttle's test counts them)
        self.ticks = 0  # throttle checks so far
        self.overlays: tuple[tuple[str, Curves], ...] = ()
        self.overlay_metrics: tuple[MetricCurves, ...] = ()  # the same runs' reported metrics (a program's)
        self.metric: str | None = None  # the program's metric picked with m (None: the first, loss-like first)
        self._curves = Curves()
        self._changes = 0
        self._pending: Any = None  # a state whose curves are built at the next redraw (only if drawn)
        self._state_data: tuple[Any, ...] = ()
        self._drawn: tuple[Any, ...] | None = None
        self._overlay_key: tuple[str, ...] = ()
        self._overlay_changes = 0
        self._overlay_xy: dict[tuple[int, str, str, float], tuple[list[float], list[float]]] = {}
        self._series = SeriesCache()  # the current run's series, smoothed as they grow
        self._state: Any = None
        self._timer: Timer | None = None
        self._idle = 0  # ticks in a row that found nothing to draw

    def compose(self) -> ComposeResult:
        yield Static(id="curves-legend")  # the plot is mounted after the first frame (plotext loads then)

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.interval, self._tick, name="curves-redraw")
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())  # faint colours follow the background
        self.call_after_refresh(self._mount_plot)

    def _mount_plot(self) -> None:
        if not self.is_attached or self.query("#curves-plot"):
            return
        self.mount(_plot_class()(id="curves-plot"))
        self.call_after_refresh(self._tick)

    # data in: cheap -------------------------------------------------------------------------------
    @property
    def curves(self) -> Curves:
        if self._pending is not None:
            self._curves, self._pending = curves_of(self._pending), None
        return self._curves

    @curves.setter
    def curves(self, curves: Curves) -> None:
        self._pending = None
        if curves is not self._curves:
            self._curves = curves
            self._changes += 1
            self._wake()

    @property
    def state(self) -> Any:
        return self._state

    @state.setter
    def state(self, state: Any) -> None:
        """A TrainingState (what the training panel hands on): its curves are shown."""
        self._state = state
        data = _data_of(state)
        if len(data) != len(self._state_data) or any(a is not b for a, b in zip(data, self._state_data)):
            self._state_data = data
            self._pending = state
            self._changes += 1
            self._wake()
        elif self._overlays_wanted() != self._overlay_key:  # the runs screen picked runs to lay over
            self._wake()

    @property
    def run_dir(self) -> str | None:
        return self.curves.run_dir or getattr(self._state, "run_dir", None)

    # drawing: throttled ----------------------------------------------------------------------------
    def _tick(self) -> None:
        self.ticks += 1
        self._check_overlays()
        if self._key() != self._drawn:
            self.redraw()
            self._idle = 0
            return
        self._idle += 1
        if self._idle >= IDLE_TICKS and self._timer is not None:
            self._timer.pause()  # nothing to draw (no run, or one that stopped): no wake-ups until data comes

    def _wake(self) -> None:
        """New data: the redraw timer runs again (it draws at most once an interval)."""
        self._idle = 0
        if self._timer is not None:
            self._timer.resume()

    def _key(self) -> tuple[Any, ...]:
        return (self._changes, self.axis, self.weight, self.log_scale, self._overlay_changes, self.size.width,
                self.size.height, self.metric)

    def on_resize(self, _event: Resize) -> None:
        self.call_after_refresh(self._tick)

    def redraw(self) -> None:
        """Set the plot up from the current data and settings (one plot build follows)."""
        found = self.query("#curves-plot")
        if not found:  # not mounted yet (the first frame comes first): drawn once it is
            return
        plot = found.first(_plot_class())
        self._drawn = self._key()
        self.rebuilds += 1
        plt = plot.plt
        plt.clear_figure()
        small = self.size.width < MIN_SIZE[0] or self.size.height < MIN_SIZE[1]
        plot.display = not small
        if small:  # axes and ticks would eat every cell: say so instead
            self._set_legend(Text("curves: too small here (a taller or wider terminal shows them)", "dim"))
            return
        width, height = plot.size.width or self.size.width, plot.size.height or self.size.height - 2
        background = Color.parse(self.app.theme_variables.get("surface", "#000000"))
        metrics = _program_metrics(self._state)
        if metrics is not None:
            self._redraw_metric(plot, metrics, width, height, background)
            return
        lines: list[Line] = []
        for index, (_run_id, other) in enumerate(self.overlays):
            colour = OVERLAY_COLOURS[index % len(OVERLAY_COLOURS)]
            for name in SERIES:
                key = (index, name, self.axis, self.weight)
                if key not in self._overlay_xy:  # earlier runs do not change: smoothed once a setting
                    self._overlay_xy[key] = xy(other.series(name), self.axis, self.weight)
                xs, ys = self._overlay_xy[key]
                lines.append((xs, ys, colour, "right" if name == "test_acc" else "left", None))
        shown: list[str] = []
        for name in SERIES:
            points = self.curves.series(name)
            if not points or (name == "epoch_loss" and len(self.curves.train_loss) >= DENSE_STEPS * len(points)):
                continue  # each epoch's mean lies on the smoothed step losses when they are dense: not drawn then
            shown.append(name)
            side = "right" if name == "test_acc" else "left"
            colour = COLOURS[name]
            xs, raw, smooth = self._series.get(name, points, self.axis, self.weight)
            lines += self._raw_and_smooth(xs, raw, smooth, colour, side, background)
        x_span = self._plot(plot.plt, lines, self.axis, width, height, self.log_scale, "loss", "test acc (%)")
        self._set_legend(self._legend(shown, x_span is not None))
        plot.display = bool(lines)  # no empty frame before the first point
        plot.refresh()

    def _raw_and_smooth(self, xs: list[float], raw: list[float], smooth: list[float], colour: tuple[int, int, int],
                        side: str, background: Color) -> list[Line]:
        """A series' lines: its raw curve faint under its smoothed one (bold), or the raw one alone."""
        if self.weight > 0:
            faint = Color(*colour).blend(background, FAINT).rgb
            return [(xs, raw, faint, side, None), (xs, smooth, colour, side, "bold")]
        return [(xs, raw, colour, side, "bold")]

    def _plot(self, plt: Any, lines: Sequence[Line], axis: str, width: int, height: int, log_wanted: bool,
              left_name: str, right_name: str) -> tuple[float, float] | None:
        """Plot the lines (left: `left_name`, on a log scale when wanted and every value is above 0;
        right: `right_name`, in %), their ticks and labels; the x span (None: no point has an x)."""
        left = _span(ys for _xs, ys, _c, side, _s in lines if side == "left")  # (lowest, highest) or None
        right = _span(ys for _xs, ys, _c, side, _s in lines if side == "right")
        x_span = _span(xs for xs, *_ in lines)
        log = log_wanted and left is not None and left[0] > 0
        cells = max(1, width - 12)  # the plot's columns, less the axes' labels
        for xs, ys, colour, side, style in lines:
            if xs:
                # A raw curve keeps each column's lowest and highest point (its noise band), a
                # smoothed one a point a column (the lines between them fill the braille dots):
                # plotext's cost grows with the points, and the picture would not change.
                xs, ys = thin(xs, ys, cells) if style is None or self.weight == 0 else sample(xs, ys, cells)
                if log and side == "left":  # plotted as log10 here: plotext's own log scale breaks on a second build
                    ys = [math.log10(y) for y in ys]
                plt.plot(xs, ys, color=colour, style=style, yside=side, marker="braille")
        if x_span is not None:
            lo, hi = x_span
            xt = ticks(axis, lo, hi, max(2, width // 10))
            plt.xticks(xt, x_labels(axis, xt))
        y_count = max(2, (height - 3) // 2)
        if left is not None:
            lo, hi = left
            if log:
                yt = log_ticks(lo, hi, y_count)
                plt.yticks([math.log10(y) for y in yt], axis_labels(yt), yside="left")
            else:
                yt = linear_ticks(lo, hi, y_count)
                step = yt[1] - yt[0] if len(yt) > 1 else None
                plt.yticks(yt, axis_labels(yt, step), yside="left")
            plt.ylabel(f"{left_name} (log)" if log else left_name, yside="left")
        if right is not None:
            yt = linear_ticks(right[0], right[1], y_count)
            step = yt[1] - yt[0] if len(yt) > 1 else None
            plt.yticks(yt, axis_labels(yt, step, percent=True), yside="right")
            plt.ylabel(right_name, yside="right")
        plt.xlabel(X_LABELS[axis])
        return x_span

    # a program's metrics -------------------------------------------------------------------------------
    def shown_metric(self) -> str | None:
        """The program's metric drawn: the one picked with m while it exists, else the first
        (loss-like names first); None for no program run or no metric yet."""
        metrics = _program_metrics(self._state)
        names = metrics.names() if metrics is not None else []
        if self.metric in names:
            return self.metric
        return names[0] if names else None

    def _redraw_metric(self, plot: Any, metrics: MetricCurves, width: int, height: int, background: Color) -> None:
        name = self.shown_metric()
        axis = self.axis if self.axis in METRIC_AXES else METRIC_AXES[0]
        lines: list[Line] = []
        if name is not None:
            for index, other in enumerate(self.overlay_metrics):
                key = (index, "metric:" + name, axis, self.weight)
                if key not in self._overlay_xy:  # earlier runs do not change: smoothed once a setting
                    self._overlay_xy[key] = xy(other.series(name), axis, self.weight)
                xs, ys = self._overlay_xy[key]
                lines.append((xs, ys, OVERLAY_COLOURS[index % len(OVERLAY_COLOURS)], "left", None))
            points = metrics.series(name)
            if points:
                xs, raw, smooth = self._series.get("metric:" + name, points, axis, self.weight)
                lines += self._raw_and_smooth(xs, raw, smooth, METRIC_COLOURS[metric_kind(name)], "left", background)
        label = clean(name, 30) if name is not None else ""
        x_span = self._plot(plot.plt, lines, axis, width, height, self.log_scale and name is not None
                            and metric_kind(name) == 0, label, "")
        self._set_legend(self._metric_legend(metrics, name, axis, x_span is not None))
        plot.display = bool(lines)
        plot.refresh()

    def _metric_legend(self, metrics: MetricCurves, name: str | None, axis: str, any_points: bool) -> Text:
        names = metrics.names()
        if name is None:
            return Text("no curves yet: they start with the program's first report (gputui.report.log, or "
                        "[run] metrics_regex)", "dim")
        text = Text(no_wrap=False)
        text.append("━ ", _rgb(METRIC_COLOURS[metric_kind(name)]))
        text.append(clean(name, 40) + "  ")
        if len(names) > 1:
            text.append(f"metric {names.index(name) + 1}/{len(names)} (m: next)  ", "dim")
        if not any_points:
            text.append(f"(none has a {X_LABELS[axis]}: x)  ", "dim")
        text.append(f"smoothing {self.weight:g}", "dim")
        for index, (run_id, _other) in enumerate(self.overlays):
            text.append("  ━ ", _rgb(OVERLAY_COLOURS[index % len(OVERLAY_COLOURS)]))
            text.append(clean(run_id, 40))
        return text

    def cycle_metric(self) -> str | None:
        """m: the program's next metric (in metric_order, round); None when it has reported none."""
        metrics = _program_metrics(self._state)
        names = metrics.names() if metrics is not None else []
        if not names:
            return None
        shown = self.shown_metric()
        self.metric = names[(names.index(shown) + 1) % len(names)] if shown in names else names[0]
        self._tick()
        return self.metric

    _legend_shown: Text | None = None

    def _set_legend(self, legend: Text) -> None:
        """A new legend only when it says something new: an update lays the screen out again."""
        if legend != self._legend_shown:
            self._legend_shown = legend
            self.query_one("#curves-legend", Static).update(legend)

    def _legend(self, shown: Sequence[str], any_points: bool) -> Text:
        text = Text(no_wrap=False)
        if not shown and not self.overlays:
            return Text("no curves yet: they start with the run's first step", "dim")
        for name in shown:
            text.append("━ ", _rgb(COLOURS[name]))
            text.append(SERIES_LABELS[name] + "  ")
        if shown and not any_points:
            text.append(f"(none has a {X_LABELS[self.axis]})  ", "dim")
        text.append(f"smoothing {self.weight:g}", "dim")  # the axes' labels say the x axis and the log scale
        for index, (run_id, _other) in enumerate(self.overlays):
            text.append("  ━ ", _rgb(OVERLAY_COLOURS[index % len(OVERLAY_COLOURS)]))
            text.append(clean(run_id, 40))
        return text

    # overlays ----------------------------------------------------------------------------------------
    def _overlays_wanted(self) -> tuple[str, ...]:
        return tuple(str(p) for p in (getattr(self.app, "overlay_runs", None) or ()))

    def _check_overlays(self) -> None:
        wanted = self._overlays_wanted()
        if wanted == self._overlay_key:
            return
        self._overlay_key = wanted
        if not wanted:
            self._set_overlays(wanted, (), [], ())
            return
        self.run_worker(lambda: self._load_overlays(wanted), name="curves-overlays", group="curves-overlays",
                        thread=True, exclusive=True, exit_on_error=False)

    def _load_overlays(self, wanted: tuple[str, ...]) -> None:
        """Worker: read the earlier runs' events files."""
        loaded, metrics, errors = [], [], []
        for path in wanted:
            try:
                curves = load_run(path)
                reported = load_metrics(path)  # a program's run: its metrics (empty for a built-in net's)
            except (GputuiError, OSError) as exc:
                errors.append(str(exc))
                continue
            loaded.append((curves.run_id or Path(path).name, curves))
            metrics.append(reported)
        self.app.call_from_thread(self._set_overlays, wanted, tuple(loaded), errors, tuple(metrics))

    def _set_overlays(self, wanted: tuple[str, ...], loaded: tuple[tuple[str, Curves], ...], errors: list[str],
                      metrics: tuple[MetricCurves, ...] = ()) -> None:
        if wanted != self._overlay_key:
            return  # a newer choice is loading
        self.overlays = loaded
        self.overlay_metrics = metrics
        self._overlay_xy.clear()
        self._overlay_changes += 1
        for error in errors:
            self._say(f"overlay: {error}", "warning")
        self._tick()

    # the keys' actions -------------------------------------------------------------------------------
    def cycle_axis(self) -> str:
        axes = METRIC_AXES if _program_metrics(self._state) is not None else X_AXES  # a program: step, time
        self.axis = axes[(axes.index(self.axis) + 1) % len(axes)] if self.axis in axes else axes[0]
        self._tick()
        return self.axis

    def smoothing(self, direction: int) -> float:
        """One notch more (1) or less (-1) smoothing."""
        index = min(range(len(SMOOTHING)), key=lambda i: abs(SMOOTHING[i] - self.weight))
        self.weight = SMOOTHING[max(0, min(len(SMOOTHING) - 1, index + direction))]
        self._tick()
        return self.weight

    def toggle_log(self) -> bool:
        self.log_scale = not self.log_scale
        self._tick()
        return self.log_scale

    def export(self) -> None:
        """Write the run's curves to curves.csv in its run directory (in a worker), and say where."""
        run_dir = self.run_dir
        if not run_dir:
            self._say("no run to export yet: start or attach one first", "warning")
            return

        def work() -> None:
            try:
                path, rows = export_csv(run_dir)
            except GputuiError as exc:
                self.app.call_from_thread(self._say, f"export: {exc}", "error")
                return
            self.app.call_from_thread(self._say, f"curves: {rows} rows written to {path}", "information")

        self.run_worker(work, name="curves-export", group="curves-export", thread=True, exclusive=True,
                        exit_on_error=False)

    def _say(self, text: str, severity: str) -> None:
        say = getattr(self.app, "say", None)
        if callable(say):
            say(text, severity, notify=True)
        else:
            self.app.notify(clean(text), severity=severity, markup=False)  # type: ignore[arg-type]
