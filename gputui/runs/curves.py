"""A run's curves, without UI: train loss, test loss and test accuracy against step, epoch,
samples or time, smoothed the way TensorBoard smooths, with ticks for an axis (the CSV export is
gputui.runs.history.export_csv, the format of `gputui runs export`).

Series (each point carries all four x values, so switching the axis needs no refold):
- `train_loss`: the step events' loss;
- `epoch_loss`: each epoch event's `train_loss` (the epoch's mean, one point at its last step);
- `test_loss`, `test_acc`: the evaluations, from eval events (within an epoch) and the epoch
  events (which carry the end-of-epoch evaluation).

X axes: `step`; `epoch` (fractional: step / steps_per_epoch); `samples` (step x the global
batch); `time`, the run's own clock (`elapsed_s`: evaluations and the gaps between a stop and
its resume are not counted, so runs compare fairly).

`Curves.fold_all` takes a read of a run's events at once (one copy of each series that
grew), so a fast run's events fold as they come; each series keeps at most MAX_POINTS,
spread evenly over the run. Drawing is the widget's business (gputui.ui.curves_panel, throttled).
Everything read from a file is data: a number counts only if it is a finite int or float
(not text, not a bool, not an integer too large for a float).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TextIO

from gputui.runs import store as runs
from gputui.model import units
from gputui.model.errors import UserError
from gputui.model.outside import number as _num  # a finite float or None: an event file is data

X_AXES = ("step", "epoch", "samples", "time")
X_LABELS = {"step": "step", "epoch": "epoch", "samples": "samples", "time": "training time"}
SERIES = ("train_loss", "epoch_loss", "test_loss", "test_acc")
SERIES_LABELS = {"train_loss": "train loss", "epoch_loss": "epoch mean", "test_loss": "test loss",
                 "test_acc": "test acc"}
LOSSES = ("train_loss", "epoch_loss", "test_loss")
MAX_POINTS = 2000  # per series; past this every other point goes (evenly, over the whole run)
MAX_WEIGHT = 0.99
FOLD_BATCH = 4096  # events of a file folded at once: one copy of each series per batch, a bounded list


@dataclass(frozen=True)
class Point:
    """One value and where it was, on each x axis (None where not known)."""

    step: int | None
    epoch: float | None
    samples: int | None
    time_s: float | None
    value: float

    def x(self, axis: str) -> float | None:
        value: float | None = getattr(self, _FIELD[axis])
        return value


_FIELD = {"step": "step", "epoch": "epoch", "samples": "samples", "time": "time_s"}
_INDEX = {name: index for index, name in enumerate(SERIES)}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def thinned_append(points: list[Point], point: Point, stride: int) -> tuple[list[Point], int]:
    """`points` with `point` added, at most MAX_POINTS of them: past that every other point goes
    (the newest stays) and the series keeps one point in twice `stride` from then on. Both series
    kinds (a net's fixed curves, a program's metrics) grow this way."""
    points.append(point)
    if len(points) > MAX_POINTS:
        return points[(len(points) - 1) % 2::2], stride * 2
    return points, stride


@dataclass(frozen=True)
class Curves:
    """One run's series. `version` grows with every change (a view redraws only when it moved)."""

    run_id: str | None = None
    run_dir: str | None = None
    steps_per_epoch: int | None = None
    batch_size: int | None = None
    train_loss: tuple[Point, ...] = ()
    epoch_loss: tuple[Point, ...] = ()
    test_loss: tuple[Point, ...] = ()
    test_acc: tuple[Point, ...] = ()
    version: int = field(default=0, compare=False)
    # Per series (in SERIES' order): keep one point in `stride`, `since` points since the last
    # kept. A series past MAX_POINTS drops every other point and doubles its stride, so a long
    # run's curve keeps the same density from its first step to its last.
    every: tuple[tuple[int, int], ...] = field(default=((1, 0),) * len(SERIES), compare=False)

    def series(self, name: str) -> tuple[Point, ...]:
        points: tuple[Point, ...] = getattr(self, name)
        return points

    @property
    def empty(self) -> bool:
        return not any(self.series(name) for name in SERIES)

    def _point(self, event: Mapping[str, Any], value: float) -> Point:
        step = _int(event.get("step"))
        epoch = _num(event.get("epoch"))
        if step is not None and self.steps_per_epoch:
            epoch = step / self.steps_per_epoch
        samples = step * self.batch_size if step is not None and self.batch_size else None
        return Point(step, epoch, samples, _num(event.get("elapsed_s")), value)

    def fold(self, event: Mapping[str, Any]) -> "Curves":
        """These curves after one event of a run (events that carry no curve change nothing)."""
        return self.fold_all((event,))

    def _start(self, event: Mapping[str, Any]) -> "Curves":
        """A run's start: new curves, or for a resume of this run, its curves up to the checkpoint."""
        resumed = _int(event.get("resumed_from_step"))
        run_id = event.get("run_id")
        base = self
        if resumed is None or (run_id is not None and self.run_id is not None and run_id != self.run_id):
            base = Curves(version=self.version)
        else:  # a resume repeats the steps after its checkpoint: drop those the killed run had gone past
            cut: dict[str, Any] = {name: tuple(p for p in base.series(name) if p.step is None or p.step <= resumed)
                                   for name in SERIES}
            base = replace(base, **cut)
        spe, batch = _int(event.get("steps_per_epoch")), _int(event.get("batch_size"))
        return replace(base, run_id=run_id if isinstance(run_id, str) else base.run_id,
                       run_dir=event.get("run_dir") if isinstance(event.get("run_dir"), str) else base.run_dir,
                       steps_per_epoch=spe if spe and spe > 0 else base.steps_per_epoch,
                       batch_size=batch if batch and batch > 0 else base.batch_size,
                       version=self.version + 1)

    def fold_all(self, events: Sequence[Mapping[str, Any]]) -> "Curves":
        """These curves after some events of a run, with one copy of each series that grew, not
        one per event: a read of a fast run's file holds hundreds."""
        grown: dict[str, list[Point]] = {}
        every = list(self.every)
        changes = 0
        curves = self
        for event in events:
            kind = event.get("event")  # each value is checked where it is used (no `typed` copy: this runs per event)
            if kind == "step":
                pairs: tuple[tuple[str, Any], ...] = (("train_loss", event.get("loss")),)
            elif kind == "eval":
                pairs = (("test_loss", event.get("test_loss")), ("test_acc", event.get("test_acc")))
            elif kind == "epoch":
                pairs = (("epoch_loss", event.get("train_loss")), ("test_loss", event.get("test_loss")),
                         ("test_acc", event.get("test_acc")))
            else:
                if kind == "start":  # resets or cuts the series: what grew so far goes in first
                    curves = curves._grown(grown, every, changes)._start(event)
                    grown, every, changes = {}, list(curves.every), 0
                continue
            added = False
            for name, value in pairs:
                v = _num(value)
                if v is None:
                    continue
                index = _INDEX[name]
                stride, since = every[index]
                since += 1
                if since < stride:  # thinned out: this series keeps one point in `stride`
                    every[index] = (stride, since)
                    continue
                points = grown.get(name)
                if points is None:
                    points = grown[name] = list(curves.series(name))
                grown[name], stride = thinned_append(points, curves._point(event, v), stride)
                every[index] = (stride, 0)
                added = True
            changes += added
        return curves._grown(grown, every, changes)

    def _grown(self, grown: dict[str, list[Point]], every: list[tuple[int, int]], changes: int) -> "Curves":
        if not changes and tuple(every) == self.every:
            return self
        new = object.__new__(Curves)
        new.__dict__.update(self.__dict__, **{name: tuple(points) for name, points in grown.items()},
                            every=tuple(every), version=self.version + changes)
        return new

    def extend(self, events: Iterable[Mapping[str, Any]]) -> "Curves":
        return self.fold_all([event for event in events if isinstance(event, Mapping)])

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> "Curves":
        return cls().extend(events)

    @classmethod
    def from_points(cls, loss: Sequence[tuple[float, float]], acc: Sequence[tuple[float, float]],
                    steps_per_epoch: int | None, batch_size: int | None, run_id: str | None = None,
                    run_dir: str | None = None) -> "Curves":
        """Curves from (step, value) pairs alone (a view given only those): no time axis, no test loss."""
        base = cls(run_id=run_id, run_dir=run_dir, steps_per_epoch=steps_per_epoch, batch_size=batch_size)
        return replace(base, train_loss=tuple(base._point({"step": int(s)}, float(v)) for s, v in loss),
                       test_acc=tuple(base._point({"step": int(s)}, float(v)) for s, v in acc), version=1)


# -- smoothing -------------------------------------------------------------------------------------

def ema(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average: the running average starts at 0 and
    is divided by 1 - weight**n (n = values so far), so the first value is kept as it is and a
    constant series stays constant. `weight` 0 returns the values unchanged."""
    return ema_from(values, weight)[0]


def ema_from(values: Sequence[float], weight: float, last: float = 0.0, n: int = 0) -> tuple[list[float], float, int]:
    """`ema` of values that go on from earlier ones (`last`, the running average, and `n`, the
    values it has taken in, as this returned them): the smoothed values, and the new `last`, `n`."""
    weight = min(max(weight, 0.0), MAX_WEIGHT)
    out: list[float] = []
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight ** n))
    return out, last, n


class SeriesCache:
    """A series' (xs, raw ys, smoothed ys) on an axis, kept from one draw to the next: a series
    that only grew since is smoothed from where it was (the EMA goes on), not from its start. A
    run streaming its steps is redrawn every second with a few new points on a long series."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, float], tuple[tuple[Point, ...], list[float], list[float], list[float], float, int]] = {}

    def get(self, name: str, points: tuple[Point, ...], axis: str, weight: float) -> tuple[list[float], list[float], list[float]]:
        key = (name, axis, weight)
        old = self._kept.get(key)
        if old is not None and old[0] is points:
            return old[1], old[2], old[3]
        grew = (old is not None and len(points) >= len(old[0]) > 0 and points[0] is old[0][0]
                and points[len(old[0]) - 1] is old[0][-1])
        if grew:
            assert old is not None
            xs_new, raw_new = xy(points[len(old[0]):], axis)
            smooth_new, last, n = ema_from(raw_new, weight, old[4], old[5])
            xs, raw, smooth = old[1] + xs_new, old[2] + raw_new, old[3] + smooth_new
        else:
            xs, raw = xy(points, axis)
            smooth, last, n = ema_from(raw, weight)
        self._kept[key] = (points, xs, raw, smooth, last, n)
        return xs, raw, smooth

    def clear(self) -> None:
        self._kept.clear()


def xy(points: Sequence[Point], axis: str, weight: float = 0.0) -> tuple[list[float], list[float]]:
    """The points that have a value on `axis`, as (xs, ys), the ys smoothed with `weight`."""
    field_name = _FIELD[axis]
    kept = [(x, p.value) for p in points if (x := getattr(p, field_name)) is not None]
    xs = [float(x) for x, _ in kept]
    ys = [v for _, v in kept]
    return xs, (ema(ys, weight) if weight > 0 else ys)


def thin(xs: Sequence[float], ys: Sequence[float], buckets: int) -> tuple[list[float], list[float]]:
    """At most two points per bucket of equal x width (its lowest and its highest, in order): what
    a plot `buckets` dots wide can show of the curve, its noise band included, at a fraction of
    the points. A series that fits is returned as it is."""
    if len(xs) <= 2 * buckets or buckets < 1:
        return list(xs), list(ys)
    lo, hi = xs[0], xs[-1]
    scale = buckets / ((hi - lo) or 1.0)
    keys = [min(buckets - 1, int((x - lo) * scale)) for x in xs]
    out_x: list[float] = []
    out_y: list[float] = []
    start, n = 0, len(xs)
    while start < n:
        key, end = keys[start], start + 1
        while end < n and keys[end] == key:
            end += 1
        if end - start <= 2:
            picked: Sequence[int] = range(start, end)
        else:
            chunk = ys[start:end]
            low, high = start + chunk.index(min(chunk)), start + chunk.index(max(chunk))
            picked = (low, high) if low < high else (high, low) if high < low else (low,)
        for i in picked:
            out_x.append(xs[i])
            out_y.append(ys[i])
        start = end
    return out_x, out_y


def sample(xs: Sequence[float], ys: Sequence[float], buckets: int) -> tuple[list[float], list[float]]:
    """The first point and the last point of each bucket of equal x width: enough for a smooth
    curve (a smoothed one) drawn with lines between its points. A series that fits is returned
    as it is."""
    n = len(xs)
    if n <= buckets or buckets < 1:
        return list(xs), list(ys)
    lo, hi = xs[0], xs[-1]
    scale = buckets / ((hi - lo) or 1.0)
    keys = [min(buckets - 1, int((x - lo) * scale)) for x in xs]
    picked = [0] + [i for i in range(n - 1) if keys[i] != keys[i + 1]] + [n - 1]
    picked = sorted(set(picked))
    return [xs[i] for i in picked], [ys[i] for i in picked]


# -- ticks -----------------------------------------------------------------------------------------

def _nice_steps(span: float, count: int, steps: Sequence[float] = (1, 2, 2.5, 5)) -> Iterable[float]:
    """Round tick spacings from about half of span/count upward."""
    raw = span / max(1, count) / 2
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    while True:
        for s in steps:
            if s * mag >= raw:
                yield s * mag
        mag *= 10


def linear_ticks(lo: float, hi: float, count: int) -> list[float]:
    """Round ticks (1, 2, 2.5, 5 x 10^k apart) inside lo..hi: as many as fit in `count`."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    for step in _nice_steps(hi - lo, count):
        first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
        if last - first + 1 <= max(1, count):
            return [round(k * step, 12) for k in range(first, last + 1)]
    return []  # not reached


TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def time_ticks(lo: float, hi: float, count: int) -> list[float]:
    """Ticks on whole seconds, minutes or hours."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    step = next((float(s) for s in TIME_STEPS if s >= raw), 86400.0 * math.ceil(raw / 86400))
    first = math.ceil(lo / step - 1e-9) * step
    return [first + k * step for k in range(int((hi - first) // step) + 1)]


def log_ticks(lo: float, hi: float, count: int) -> list[float]:
    """Ticks for a log axis: 1, 2, 5 x 10^k (thinned to decades when too many)."""
    if lo <= 0 or hi <= 0 or not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        ticks = [t for e in decades for m in mantissas if lo <= (t := float(f"{m}e{e}")) <= hi]
        if len(ticks) <= max(2, count):
            break
    if len(ticks) < 2:  # less than one 1-2-5 step inside: round ticks on a linear spacing
        ticks = [t for t in linear_ticks(lo, hi, max(2, count)) if t > 0]
    return ticks


def ticks(axis: str, lo: float, hi: float, count: int) -> list[float]:
    """Round ticks for an x axis."""
    return time_ticks(lo, hi, count) if axis == "time" else linear_ticks(lo, hi, count)


def x_label(axis: str, value: float) -> str:
    """A tick label on an x axis, in its unit."""
    if axis == "time":
        return units.duration(value)
    if axis == "samples":
        return units.rate(value).removesuffix("/s") if value >= 1000 else f"{value:.0f}"
    return f"{value:g}"


def y_label(value: float, step: float | None = None, percent: bool = False) -> str:
    """A tick label on a y axis: as many decimals as the tick spacing needs."""
    digits = _decimals(step) if step else 0  # a spacing of 2.5 needs one decimal: 97.5, never 98
    text = f"{value:.{digits}f}" if step else f"{value:g}"
    return text + ("%" if percent else "")


def _decimals(value: float) -> int:
    """Decimals `value` needs to read as itself (at most 4): 0.25 -> 2, 10 -> 0."""
    text = f"{value:.4f}".rstrip("0")
    return len(text.split(".")[1]) if "." in text else 0


def axis_labels(values: Sequence[float], step: float | None = None, percent: bool = False) -> list[str]:
    """The tick labels of one axis, all with one precision: the spacing's (linear ticks), else the
    finest any tick needs (log ticks: 1.0 and 0.1, never 1 beside 0.1)."""
    if step:
        return [y_label(v, step, percent) for v in values]
    digits = max((_decimals(v) for v in values), default=0)
    return [f"{v:.{digits}f}" + ("%" if percent else "") for v in values]


def x_labels(axis: str, values: Sequence[float]) -> list[str]:
    """The tick labels of an x axis in its unit, one precision for the axis (epochs 0.5, 1.0, 1.5)."""
    if axis in ("time", "samples"):
        return [x_label(axis, v) for v in values]
    return axis_labels(values)


# -- files -----------------------------------------------------------------------------------------

def load_run(run_dir: str | Path) -> Curves:
    """An earlier run's curves, from its directory's events.jsonl (or the events file itself)."""
    path = Path(run_dir).expanduser()
    events_path = path if path.is_file() else path / runs.EVENTS
    if not events_path.is_file():
        raise UserError(f"{path}: no {runs.EVENTS} there; pick a run directory (`gputui runs` lists them)")
    curves = Curves()
    batch: list[Mapping[str, Any]] = []
    for event in runs.iter_events(events_path):  # streamed, folded a batch at a time: thinned as it grows
        batch.append(event)
        if len(batch) >= FOLD_BATCH:
            curves, batch = curves.fold_all(batch), []
    curves = curves.fold_all(batch)
    return replace(curves, run_id=curves.run_id or events_path.parent.name, run_dir=str(events_path.parent))


def read_csv(fh: TextIO) -> list[dict[str, Any]]:
    """The rows of a curves CSV as events (numbers parsed, empty cells left out): fold them
    with `Curves.extend` to get the curves back (no samples axis: the CSV has no batch size)."""
    out: list[dict[str, Any]] = []
    for row in csv.DictReader(fh):
        event: dict[str, Any] = {"event": row.get("event")}
        for key, text in row.items():
            if key == "event" or not text:
                continue
            try:
                number = float(text)
            except ValueError:
                continue
            event[key] = int(number) if key in ("step", "epoch") and number.is_integer() else number
        out.append(event)
    return out


# -- a program's own metrics (issue 31) ---------------------------------------------------------------

METRIC_AXES = ("step", "time")  # a program says its step (maybe) and the run's clock says the time
MAX_METRICS = 64  # series kept per run (a program reports at most 64 values a line; more names are left out)


def metric_kind(name: str) -> int:
    """0 for a loss-like name (containing "loss"), 1 for an accuracy-like one ("acc"), 2 for the rest."""
    low = name.lower()
    return 0 if "loss" in low else 1 if "acc" in low else 2


def metric_order(names: Iterable[str]) -> list[str]:
    """The names, loss-like first, then accuracy-like, then the rest, each group in the order given."""
    return sorted(dict.fromkeys(names), key=metric_kind)


def metric_series_name(name: str, rank: int | None) -> str:
    """The series of a metric: its name, or "name (rank N)" for a report of another rank (all_ranks)."""
    return name if not rank else f"{name} (rank {rank})"


@dataclass(frozen=True)
class MetricCurves:
    """A program run's reported metrics (its `metrics` events), one series a name, each point
    at its step, epoch and time (`elapsed_s`, the run's clock, which goes on over a resume).
    Thinned as `Curves` thins: at most MAX_POINTS a series, spread evenly over the run."""

    run_id: str | None = None
    run_dir: str | None = None
    points: Mapping[str, tuple[Point, ...]] = field(default_factory=dict)  # in the order first seen
    every: Mapping[str, tuple[int, int]] = field(default_factory=dict, compare=False)
    version: int = field(default=0, compare=False)

    def names(self) -> list[str]:
        """Every metric seen, loss-like first, then accuracy-like (metric_order)."""
        return metric_order(self.points)

    def series(self, name: str) -> tuple[Point, ...]:
        return self.points.get(name, ())

    @property
    def empty(self) -> bool:
        return not any(self.points.values())

    def fold_all(self, events: Sequence[Mapping[str, Any]]) -> "MetricCurves":
        """These curves after some events of a run: a `start` begins new curves (a resume of the
        same run keeps them), a `metrics` event adds a point to each of its values' series."""
        curves = self
        grown: dict[str, list[Point]] = {}
        every = dict(self.every)
        changes = 0
        for event in events:
            kind = event.get("event")
            if kind == "start":
                curves = curves._grown(grown, every, changes)
                grown, changes = {}, 0
                run_id = event.get("run_id")
                same = event.get("resumed") is True and run_id is not None and run_id == curves.run_id
                run_dir = event.get("run_dir")
                curves = MetricCurves(run_id=run_id if isinstance(run_id, str) else None,
                                      run_dir=run_dir if isinstance(run_dir, str) else None,
                                      points=curves.points if same else {}, every=curves.every if same else {},
                                      version=curves.version + 1)
                every = dict(curves.every)
                continue
            if kind != "metrics":
                continue
            values = event.get("values")
            if not isinstance(values, Mapping):
                continue
            rank = _int(event.get("rank"))
            point_of = (_int(event.get("step")), _num(event.get("epoch")), _num(event.get("elapsed_s")))
            added = False
            for name, value in values.items():
                v = _num(value)
                if v is None or not isinstance(name, str):
                    continue
                key = metric_series_name(name, rank)
                points = grown.get(key)
                if points is None:
                    if key not in curves.points and len(curves.points) + len(grown) >= MAX_METRICS:
                        continue
                    points = grown[key] = list(curves.points.get(key, ()))
                stride, since = every.get(key, (1, 0))
                since += 1
                if since < stride:
                    every[key] = (stride, since)
                    continue
                grown[key], stride = thinned_append(points, Point(point_of[0], point_of[1], None, point_of[2], v), stride)
                every[key] = (stride, 0)
                added = True
            changes += added
        return curves._grown(grown, every, changes)

    def _grown(self, grown: dict[str, list[Point]], every: dict[str, tuple[int, int]], changes: int) -> "MetricCurves":
        if not changes and every == self.every:
            return self
        points = dict(self.points)
        points.update((name, tuple(series)) for name, series in grown.items())
        return replace(self, points=points, every=dict(every), version=self.version + changes)


def load_metrics(run_dir: str | Path) -> MetricCurves:
    """An earlier run's reported metrics, from its directory's events.jsonl (empty for a run of a
    built-in net)."""
    path = Path(run_dir).expanduser()
    events_path = path if path.is_file() else path / runs.EVENTS
    if not events_path.is_file():
        raise UserError(f"{path}: no {runs.EVENTS} there; pick a run directory (`gputui runs` lists them)")
    curves = MetricCurves()
    batch: list[Mapping[str, Any]] = []
    for event in runs.iter_events(events_path):
        batch.append(event)
        if len(batch) >= FOLD_BATCH:
            curves, batch = curves.fold_all(batch), []
    curves = curves.fold_all(batch)
    return replace(curves, run_id=curves.run_id or events_path.parent.name, run_dir=str(events_path.parent))
