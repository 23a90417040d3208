"""Run history: what each past run was and how it ended, and its curves, read from its directory.

No UI and no torch: `gputui runs` prints these records and the dashboard's runs screen can show
the same ones. Everything read from a run directory (events, profile) is data: numbers go through
`gputui.model.events.typed`, text is kept as it is (the views clean it and never treat it as markup).

States: `done`, `interrupted` and `failed` come from the run's last word (its done, interrupted
or error event, or the cost ledger's record of a failure); a run that has not ended is `running`
while a process on this machine holds its event log open for writing, and `stopped` otherwise
(killed without a last word: resume it from its last checkpoint).
"""

from __future__ import annotations

import csv
import math
import sqlite3
import sys
import time
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from gputui.runs import summaries
from gputui.runs import store as runs
from gputui.model.errors import GputuiError, UserError
from gputui.model.events import typed
from gputui.model.outside import finite as _num  # the one helper for a number read from a file
from gputui.model.paths import runs_home, user_opener

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (pyproject's tomli dependency)
    import tomli as tomllib

STATES = ("done", "interrupted", "failed", "running", "stopped")
CURVE_EVENTS = ("step", "eval", "epoch")
CSV_NAME = "curves.csv"  # a run's curves exported beside its events (the dashboard's curves panel)
# The CSV columns: which event the row is, where the run was, and the values (empty where the event has none).
CSV_COLUMNS = ("event", "step", "epoch", "elapsed_s", "time", "loss", "l1", "samples_per_s", "lr",
               "train_loss", "test_loss", "test_acc")


@dataclass(frozen=True)
class RunSummary:
    """One past (or running) run, as `gputui runs` lists it. None is "not known"."""

    run_id: str
    path: str
    started: float | None  # the first start event's time (epoch seconds)
    model: str | None
    device: str | None  # the latest start's (a resume may change it)
    strategy: str | None
    world_size: int | None
    epochs_done: int  # whole epochs finished
    epochs: int | None  # the target
    best_acc: float | None  # percent
    final_acc: float | None  # the last evaluation's, percent
    train_s: float | None  # training time (the clock stops for evaluations), summed across resumes
    cost_usd: float | None  # from the cost ledger; None where the run is not recorded there
    state: str
    detail: str | None  # why it ended that way: the error's line, the interruption's reason
    last_event: float | None  # the time of its last event

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(run: runs.RunDir, events: Iterable[dict[str, Any]] | None = None, writing: bool | None = False,
              ledger_status: str | None = None, cost_usd: float | None = None,
              digest: summaries.Digest | None = None) -> RunSummary:
    """A run's summary from its events: given, or its digest (gputui.runs.summaries: streamed from its
    events file once, then cached beside it).

    `writing`: whether a process holds its event log open for writing (None: cannot be known
    here, then the ledger's 'running' is believed); `ledger_status`: the cost ledger's status.
    """
    if digest is None:
        digest = summaries.read(run) if events is None else summaries.of_events(events)
    needs_profile = not all((digest.model, digest.device, digest.strategy, digest.epochs))
    profile = _profile(run.profile) if needs_profile else {}  # a start event says it all: no file read
    state, detail = _state(digest, writing, ledger_status)
    return RunSummary(
        run_id=run.run_id,
        path=str(run.path),
        started=digest.started,
        model=digest.model or _str(profile.get("model")),
        device=digest.device or _str(profile.get("device")),
        strategy=digest.strategy or _str(profile.get("strategy")),
        world_size=digest.world_size,
        epochs_done=digest.epochs_done,
        epochs=digest.epochs or _int(profile.get("epochs")),
        best_acc=digest.best,
        final_acc=digest.final_acc,
        train_s=digest.train_s,
        cost_usd=cost_usd,
        state=state,
        detail=detail,
        last_event=digest.last_time,
    )


def _state(digest: summaries.Digest, writing: bool | None, ledger_status: str | None) -> tuple[str, str | None]:
    kind = digest.last_kind
    if kind == "done":
        return "done", None
    if kind == "interrupted":
        return "interrupted", digest.last_text or None
    if kind == "error":
        return "failed", digest.last_text or None
    if writing or (writing is None and ledger_status == "running"):
        return "running", None
    if ledger_status == "failed":
        return "failed", "ended without a last event"
    if not digest.events:
        return "stopped", "no events: it stopped before training began"
    return "stopped", "ended without a last event (killed?)"


def completed_epochs(run: runs.RunDir) -> int | None:
    """The epochs a run finished if its last word is `done`, else None (it can go on as it is)."""
    digest = summaries.read(run)
    return digest.done_epochs if digest.last_kind == "done" else None


def list_runs(home: Path | None = None, ledger_path: Path | None = None, now: float | None = None) -> list[RunSummary]:
    """Every run under `home` (default: the runs' default location), oldest first. Each run's
    events are read through its cached digest: a run that has not changed since the last
    listing costs a read of its summary.json, not of its events."""
    home = runs_home() if home is None else home
    found = [runs.RunDir(p) for p in runs.run_dirs(home)]
    digests = {run.run_id: summaries.read(run) for run in found}
    unfinished = [run for run in found if digests[run.run_id].unfinished]
    writing = runs.written_files(run.events for run in unfinished) if unfinished else set()
    statuses, costs = ledger_view(ledger_path, now)
    out = [summarize(run, None, _running(run, writing) if digests[run.run_id].unfinished else False,
                     statuses.get(run.run_id), costs.get(run.run_id), digest=digests[run.run_id])
           for run in found]
    return sorted(out, key=lambda s: (s.started if s.started is not None else float("inf"), s.run_id))


def _running(run: runs.RunDir, writing: set[Path] | None) -> bool | None:
    """Whether an unfinished run goes on: its run.pid's process is alive, or a process holds its
    event log open for writing (None: neither can be known here)."""
    if runs.live_process(run) is not None or (writing is not None and run.events in writing):
        return True
    return None if writing is None else False


def ledger_view(path: Path | None = None, now: float | None = None) -> tuple[dict[str, str], dict[str, float]]:
    """(run id -> status, run id -> estimated $) from the cost ledger; empty where there is none."""
    from gputui.cloud.costs import report
    from gputui.cloud.ledger import Ledger

    try:
        ledger = Ledger.existing(path)
        if ledger is None:
            return {}, {}
        with ledger:
            statuses = {run_id: status for run_id, _cluster, _start, _end, status in ledger.runs()}
            _clusters, lines = report(ledger, time.time() if now is None else now)
    except (GputuiError, sqlite3.Error, OSError):
        return {}, {}  # a broken ledger costs the column, not the list
    return statuses, {line.name: float(line.usd) for line in lines}


COLUMNS = ("id", "started", "model", "device", "strategy", "epochs", "best acc", "final acc", "time", "cost",
           "state", "note")


def cells(s: RunSummary) -> list[str]:
    """A summary as the cells of COLUMNS, formatted by gputui.model.units (`gputui runs` and the
    dashboard's runs screen show the same). The text is data: the views show it as Text."""
    from gputui.model import units

    started = units.NA if s.started is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(s.started))
    strategy = s.strategy or units.NA
    if s.world_size is not None and s.world_size > 1:
        strategy += f" x{s.world_size}"
    return [s.run_id, started, s.model or units.NA, s.device or units.NA, strategy,
            f"{s.epochs_done}/{s.epochs if s.epochs is not None else '?'}", _pct(s.best_acc), _pct(s.final_acc),
            units.duration(s.train_s), units.money(s.cost_usd), s.state, s.detail or ""]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def delete_run(run: runs.RunDir) -> None:
    """Remove a run's directory (UserError while its process is alive, or for a directory that is
    not a run: one without profile.toml and events.jsonl)."""
    import shutil

    if runs.live_process(run) is not None:
        raise UserError(f"run {run.run_id} is still running: stop it first")
    if not (run.profile.is_file() or run.events.is_file()):
        raise UserError(f"{run.path}: not a run directory (no {runs.PROFILE}, no {runs.EVENTS})")
    try:
        shutil.rmtree(run.path)
    except OSError as exc:
        raise UserError(f"cannot delete {run.path}: {exc.strerror or exc}") from None


# -- curves ---------------------------------------------------------------------------------------

def curves(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's step, eval and epoch events in order, as rows of CSV_COLUMNS.

    A resume from a checkpoint repeats the steps after it (a killed run had gone further):
    the rows past the step it resumed from are dropped, so each step appears once.
    """
    rows: list[dict[str, Any]] = []
    for raw in events:
        if not isinstance(raw, dict):
            continue
        event = typed(raw)
        kind = event.get("event")
        if kind == "start":
            resumed = _int(event.get("resumed_from_step"))
            if resumed is not None:
                while rows and rows[-1]["step"] is not None and rows[-1]["step"] > resumed:
                    rows.pop()
            continue
        if kind in CURVE_EVENTS:
            rows.append(_row(kind, event))
    return rows


def curve_rows(path: Path) -> Iterator[dict[str, Any]]:
    """`curves` of a run's events file, streamed: the file is read twice, in bounded chunks,
    never whole. The first pass finds which rows a resume drops (keeping 16 bytes a row, not
    the rows); the second yields the others. Both stop where the file ended when this began
    (a running run writes on)."""
    try:
        end = path.stat().st_size
    except OSError:
        return
    kept, steps = array("q"), array("d")  # the rows so far that no resume dropped: ordinal, step (NaN: none)
    ordinal = 0
    for raw in runs.iter_events(path, end=end):
        kind = raw.get("event")
        if kind == "start":
            resumed = _int(typed(raw).get("resumed_from_step"))
            while resumed is not None and steps and not math.isnan(steps[-1]) and steps[-1] > resumed:
                steps.pop()
                kept.pop()
        elif kind in CURVE_EVENTS:
            step = _num(typed(raw).get("step"))
            kept.append(ordinal)
            steps.append(math.nan if step is None else float(step))
            ordinal += 1
    wanted = iter(kept)
    next_kept, ordinal = next(wanted, -1), 0
    for raw in runs.iter_events(path, end=end):
        kind = raw.get("event")
        if kind in CURVE_EVENTS:
            if ordinal == next_kept:
                yield _row(kind, typed(raw))
                next_kept = next(wanted, -1)
            ordinal += 1


def _row(kind: str, event: dict[str, Any]) -> dict[str, Any]:
    return {column: (kind if column == "event" else _num(event.get(column))) for column in CSV_COLUMNS}


def write_csv(rows: Iterable[dict[str, Any]], out: TextIO) -> int:
    """Write the rows (with a header) as CSV; return how many rows were written."""
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    count = 0
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_COLUMNS})
        count += 1
    return count


def export_csv(run_dir: str | Path, out: Path | None = None) -> tuple[Path, int]:
    """Write the run's curves as CSV, in the format of `gputui runs export RUN_ID --csv` (the
    dashboard's curves panel exports with it), to `out` (default: curves.csv in the run
    directory). Returns the path and the rows written."""
    path = Path(run_dir).expanduser()
    events_path = path / runs.EVENTS
    if not events_path.is_file():
        raise UserError(f"{path}: no {runs.EVENTS} there, nothing to export")
    target = out if out is not None else path / CSV_NAME
    rows = curve_rows(events_path)  # streamed, never the whole file
    try:
        with open(target, "w", encoding="utf-8", newline="", opener=user_opener) as fh:  # the user's umask
            count = write_csv(rows, fh)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target, count


# -- small readers ---------------------------------------------------------------------------------

def _profile(path: Path) -> dict[str, Any]:
    """The [run] table of a run's profile.toml; empty if it cannot be read."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("run", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return table if isinstance(table, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
