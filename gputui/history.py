"""Run history: what each past run was and how it ended, and its curves, read from its directory.

No UI and no torch: `gputui runs` prints these records and the dashboard's runs screen can show
the same ones. Everything read from a run directory (events, profile) is data: numbers go through
`gputui.events.typed`, text is kept as it is (the views clean it and never treat it as markup).

States: `done`, `interrupted` and `failed` come from the run's last word (its done, interrupted
or error event, or the cost ledger's record of a failure); a run that has not ended is `running`
while a process on this machine holds its event log open for writing, and `stopped` otherwise
(killed without a last word: resume it from its last checkpoint).
"""

from __future__ import annotations

import csv
import sqlite3
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

from gputui import runs
from gputui.errors import GputuiError, UserError
from gputui.events import ENDS, typed
from gputui.paths import runs_home

STATES = ("done", "interrupted", "failed", "running", "stopped")
CURVE_EVENTS = ("step", "eval", "epoch")
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


def summarize(run: runs.RunDir, events: Sequence[dict[str, Any]] | None = None, writing: bool | None = False,
              ledger_status: str | None = None, cost_usd: float | None = None) -> RunSummary:
    """A run's summary from its events (read from its directory unless given).

    `writing`: whether a process holds its event log open for writing (None: cannot be known
    here, then the ledger's 'running' is believed); `ledger_status`: the cost ledger's status.
    """
    if events is None:
        events = runs.read_events(run.events)
    events = [typed(e) for e in events if isinstance(e, dict)]
    starts = [e for e in events if e.get("event") == "start"]
    first = starts[0] if starts else {}
    latest = starts[-1] if starts else {}
    profile = _profile(run.profile)
    epochs_done = max((_int(e.get("epoch")) or 0 for e in events if e.get("event") == "epoch"), default=0)
    accs = [e["test_acc"] for e in events if e.get("event") in ("eval", "epoch", "done") and e.get("test_acc") is not None]
    done = next((e for e in reversed(events) if e.get("event") == "done"), None)
    best = max(accs, default=None)
    if done is not None and done.get("best_acc") is not None:
        best = done["best_acc"] if best is None else max(best, done["best_acc"])
    train_s = next((e["elapsed_s"] for e in reversed(events) if e.get("elapsed_s") is not None), None)
    state, detail = _state(events, writing, ledger_status)
    return RunSummary(
        run_id=run.run_id,
        path=str(run.path),
        started=_num(first.get("time")),
        model=_str(latest.get("model")) or _str(profile.get("model")),
        device=_str(latest.get("device")) or _str(profile.get("device")),
        strategy=_str(latest.get("strategy")) or _str(profile.get("strategy")),
        world_size=_int(latest.get("world_size")),
        epochs_done=epochs_done,
        epochs=_int(latest.get("epochs")) or _int(profile.get("epochs")),
        best_acc=best,
        final_acc=accs[-1] if accs else None,
        train_s=train_s,
        cost_usd=cost_usd,
        state=state,
        detail=detail,
        last_event=_num(events[-1].get("time")) if events else None,
    )


def _state(events: Sequence[dict[str, Any]], writing: bool | None, ledger_status: str | None) -> tuple[str, str | None]:
    last = next((e for e in reversed(events) if e.get("event") in (*ENDS, "start")), None)
    kind = last.get("event") if last is not None else None
    if kind == "done":
        return "done", None
    if kind == "interrupted":
        return "interrupted", _str(last.get("reason")) if last is not None else None
    if kind == "error":
        return "failed", _str(last.get("message")) if last is not None else None
    if writing or (writing is None and ledger_status == "running"):
        return "running", None
    if ledger_status == "failed":
        return "failed", "ended without a last event"
    if not events:
        return "stopped", "no events: it stopped before training began"
    return "stopped", "ended without a last event (killed?)"


def completed_epochs(run: runs.RunDir) -> int | None:
    """The epochs a run finished if its last word is `done`, else None (it can go on as it is)."""
    for event in reversed(runs.read_events(run.events)):
        kind = event.get("event") if isinstance(event, dict) else None
        if kind in ENDS or kind == "start":
            return _int(typed(event).get("epochs")) if kind == "done" else None
    return None


def list_runs(home: Path | None = None, ledger_path: Path | None = None, now: float | None = None) -> list[RunSummary]:
    """Every run under `home` (default: the runs' default location), oldest first."""
    home = runs_home() if home is None else home
    found = [runs.RunDir(p) for p in runs.run_dirs(home)]
    logs = {run.run_id: runs.read_events(run.events) for run in found}
    unfinished = [run for run in found if _unfinished(logs[run.run_id])]
    writing = runs.written_files(run.events for run in unfinished) if unfinished else set()
    statuses, costs = ledger_view(ledger_path, now)
    out = [summarize(run, logs[run.run_id],
                     _running(run, writing) if _unfinished(logs[run.run_id]) else False,
                     statuses.get(run.run_id), costs.get(run.run_id))
           for run in found]
    return sorted(out, key=lambda s: (s.started if s.started is not None else float("inf"), s.run_id))


def _running(run: runs.RunDir, writing: set[Path] | None) -> bool | None:
    """Whether an unfinished run goes on: its run.pid's process is alive, or a process holds its
    event log open for writing (None: neither can be known here)."""
    if runs.live_process(run) is not None or (writing is not None and run.events in writing):
        return True
    return None if writing is None else False


def _unfinished(events: Sequence[dict[str, Any]]) -> bool:
    last = next((e for e in reversed(events) if isinstance(e, dict) and e.get("event") in (*ENDS, "start")), None)
    return last is None or last.get("event") == "start"


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


def find_run(ref: str, home: Path | None = None) -> runs.RunDir:
    """The run named by `ref`: 'last', a run id under `home`, or a run directory."""
    home = runs_home() if home is None else home
    if ref == "last":
        listed = list_runs(home)
        if not listed:
            raise UserError(f"no runs in {home} yet; start one with `gputui run`")
        return runs.RunDir(Path(listed[-1].path))
    for path in (home / ref, Path(ref).expanduser()):
        if (path / runs.PROFILE).is_file() or (path / runs.EVENTS).is_file():
            return runs.RunDir(path)
    raise UserError(f"{ref}: no such run (not a run id in {home}, nor a run directory); `gputui runs` lists them")


COLUMNS = ("id", "started", "model", "device", "strategy", "epochs", "best acc", "final acc", "time", "cost",
           "state", "note")


def cells(s: RunSummary) -> list[str]:
    """A summary as the cells of COLUMNS, formatted by gputui.units (`gputui runs` and the
    dashboard's runs screen show the same). The text is data: the views show it as Text."""
    from gputui import units

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
        if kind not in CURVE_EVENTS:
            continue
        rows.append({column: (kind if column == "event" else _num(event.get(column))) for column in CSV_COLUMNS})
    return rows


def write_csv(rows: Iterable[dict[str, Any]], out: TextIO) -> int:
    """Write the rows (with a header) as CSV; return how many rows were written."""
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    count = 0
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_COLUMNS})
        count += 1
    return count


# -- small readers ---------------------------------------------------------------------------------

def _profile(path: Path) -> dict[str, Any]:
    """The [run] table of a run's profile.toml; empty if it cannot be read."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("run", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return table if isinstance(table, dict) else {}


def _num(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
