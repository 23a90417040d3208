"""Run history: what each past run was and how it ended, and its curves, read from its directory.

No UI and no torch: `gputui runs` prints these records and the dashboard's runs screen can show
the same ones. Everything read from a run directory (events, profile) is data: numbers go through
`gputui.model.events.typed`, text is kept as it is (the views clean it and never treat it as markup).

A run of the user's own program (`gputui run -- PROGRAM`) is listed with its program's name where
a net's model is (`program_name`), and its objective's last and best value where a net's
accuracies are; its CSV export has a column for every metric it reported (`metric_columns`).

States: `done`, `interrupted` and `failed` come from the run's last word (its done, interrupted
or error event, or the cost ledger's record of a failure); a run that has not ended is `running`
while a process on this machine holds its event log open for writing, and `stopped` otherwise
(killed without a last word: resume it from its last checkpoint).
"""

from __future__ import annotations

import csv
import math
import os
import re
import shlex
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
    # A run of the user's own program (None for the built-in nets; `model` is then its program_name):
    program: str | None = None  # the command, as one string
    objective: str | None = None  # the metric named by [run] objective
    direction: str | None = None  # "maximize" or "minimize"
    objective_last: float | None = None
    objective_best: float | None = None
    epoch: int | None = None  # the last epoch the program reported
    git_commit: str | None = None  # the code its latest start ran: its workdir's commit (gputui.runs.provenance)
    git_dirty: bool | None = None  # and whether that code had uncommitted changes

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
    state, detail = _state(digest, writing, ledger_status)
    program = digest.program
    if program is None and not digest.has_start:  # not started yet: its profile says what it will run
        command = run_table(run.profile).get("command")
        if isinstance(command, list) and command and all(isinstance(word, str) for word in command):
            program = shlex.join(command)
    if program is not None:  # the program's own: no model, no epochs to reach (a profile's are the defaults')
        return RunSummary(
            run_id=run.run_id, path=str(run.path), started=digest.started, model=program_name(program),
            device=digest.device, strategy=digest.strategy, world_size=digest.world_size, epochs_done=0, epochs=None,
            best_acc=None, final_acc=None, train_s=digest.train_s, cost_usd=cost_usd, state=state, detail=detail,
            last_event=digest.last_time, program=program, objective=digest.objective, direction=digest.direction,
            objective_last=digest.objective_last, objective_best=digest.objective_best, epoch=digest.program_epoch,
            git_commit=digest.git_commit, git_dirty=digest.git_dirty)
    needs_profile = not all((digest.model, digest.device, digest.strategy, digest.epochs))
    profile = run_table(run.profile) if needs_profile else {}  # a start event says it all: no file read
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


# Words before the program's own name: interpreters and launchers (a version suffix allowed: python3.11).
_LAUNCHERS = re.compile(r"(python|pypy|py|torchrun|accelerate|deepspeed|launch|run|exec|uv|poetry|pipenv|conda|"
                        r"env|nice|nohup|time|stdbuf|taskset|numactl|srun|mpirun|mpiexec|sh|bash|zsh|node|deno|bun|"
                        r"ruby|perl|julia|rscript|java|lua|php)[0-9.]*(\.exe)?", re.IGNORECASE)
_SCRIPT = re.compile(r".+\.(py|sh|jl|r|js|mjs|ts|rb|pl|lua|php|ipynb)", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")  # env VAR=value python ...
NAME_CHARS = 32  # what a listing shows of a program's name


def program_name(program: str) -> str:
    """A program run's short name, for the model column: the script a launcher runs ("train.py" of
    `python -u train.py --lr 3`, "mypkg.train" of `python -m mypkg.train`), else the first word
    that is not an interpreter, a launcher, a flag or a number, else the first word; its last path
    part, at most NAME_CHARS characters. Text from a run directory: the views show it as Text."""
    from gputui.model.text import clean

    try:
        words = shlex.split(program)
    except ValueError:  # not as shlex.join writes it: words apart
        words = program.split()
    words = [word for word in words if word]
    if not words:
        return clean(program, NAME_CHARS) or "?"
    if "-c" in words[:-1] and not any(_SCRIPT.fullmatch(word) for word in words[:words.index("-c")]):
        words = words[:words.index("-c")]  # python -c CODE: the interpreter's name, not the code
    named = [word for word in words if not word.startswith("-") and not _ASSIGNMENT.fullmatch(word)
             and not _LAUNCHERS.fullmatch(_last_part(word)) and not _is_number(word)]
    pick = next((word for word in named if _SCRIPT.fullmatch(word)), named[0] if named else words[0])
    return clean(_last_part(pick) or pick, NAME_CHARS)


def _last_part(word: str) -> str:
    return word.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


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


def summary_of(run: runs.RunDir, ledger_path: Path | None = None, now: float | None = None) -> RunSummary:
    """One run's summary, as list_runs gives it (`gputui runs show`)."""
    digest = summaries.read(run)
    writing = runs.written_files([run.events]) if digest.unfinished else set()
    statuses, costs = ledger_view(ledger_path, now)
    return summarize(run, None, _running(run, writing) if digest.unfinished else False,
                     statuses.get(run.run_id), costs.get(run.run_id), digest=digest)


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
# Left out in this order where a terminal is too narrow for them all (the id holds the start time).
HIDE_FIRST = ("started", "strategy", "device", "note", "cost", "best acc", "time")


def cells(s: RunSummary) -> list[str]:
    """A summary as the cells of COLUMNS, formatted by gputui.model.units (`gputui runs` and the
    dashboard's runs screen show the same). The text is data: the views show it as Text."""
    from gputui.model import units

    started = units.NA if s.started is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(s.started))
    strategy = s.strategy or units.NA
    if s.world_size is not None and s.world_size > 1:
        strategy += f" x{s.world_size}"
    if s.program is not None:  # a program: its last epoch, its objective's best (named) and last
        epochs = units.NA if s.epoch is None else str(s.epoch)
        best = units.NA if s.objective is None else f"{s.objective} {_value(s.objective_best)}"
        name = s.model or units.NA
        if s.git_commit:  # the code it ran, as `git describe --dirty` marks a changed work tree
            name += f" @{s.git_commit[:7]}" + ("-dirty" if s.git_dirty else "")
        return [s.run_id, started, name, s.device or units.NA, strategy, epochs, best,
                units.NA if s.objective is None else _value(s.objective_last),
                units.duration(s.train_s), units.money(s.cost_usd), s.state, s.detail or ""]
    return [s.run_id, started, s.model or units.NA, s.device or units.NA, strategy,
            f"{s.epochs_done}/{s.epochs if s.epochs is not None else '?'}", _pct(s.best_acc), _pct(s.final_acc),
            units.duration(s.train_s), units.money(s.cost_usd), s.state, s.detail or ""]


def _value(value: float | None) -> str:
    """A metric's value as a listing shows it: four significant digits (0.9812, 1.234e-05)."""
    return "n/a" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


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


# -- a program run's metrics ------------------------------------------------------------------------

PROGRAM_COLUMNS = ("elapsed_s", "step", "epoch")  # then "rank" if any report has one, then each metric
MAX_METRIC_COLUMNS = 1000  # metric names past this many (a program naming a new one each step) get no column
METRIC_NAME_CHARS = 200


def is_program_run(events_path: Path) -> bool:
    """Whether a run is one of the user's own program: its first start event has `program` (or,
    before its first event, its profile has a [run] command)."""
    for raw in runs.iter_events(events_path):
        if raw.get("event") == "start":
            return isinstance(raw.get("program"), str)
    return isinstance(run_table(events_path.parent / runs.PROFILE).get("command"), list)


def metric_columns(events_path: Path, end: int | None = None) -> tuple[list[str], bool]:
    """The metric names of a program run's metrics events in the order first seen (at most
    MAX_METRIC_COLUMNS), and whether any event has a rank (reports with all_ranks=True); streamed."""
    names: dict[str, None] = {}
    ranked = False
    for raw in runs.iter_events(events_path, end=end):
        if raw.get("event") != "metrics":
            continue
        event = typed(raw)
        ranked = ranked or _int(event.get("rank")) is not None
        for name in event["values"] if "values" in event else ():
            if name not in names and len(names) < MAX_METRIC_COLUMNS:
                names[name] = None
    return list(names), ranked


def csv_header_name(name: str) -> str:
    """A metric's name as a CSV header cell: one printable line, not too long, never read as a
    formula by a spreadsheet (a leading =, +, - or @ gets a quote before it)."""
    from gputui.model.text import clean

    text = clean(name, METRIC_NAME_CHARS)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def write_metrics_csv(events_path: Path, out: TextIO) -> int:
    """A program run's metrics as CSV, one row per metrics event: elapsed_s, step, epoch (rank,
    when reports have one), then every metric in the order first seen, empty where the event
    lacks it. The file is streamed twice (the names, then the rows), up to where it ended when
    this began. Returns the rows written."""
    try:
        end = events_path.stat().st_size
    except OSError:
        end = 0
    names, ranked = metric_columns(events_path, end)
    place = list(PROGRAM_COLUMNS) + (["rank"] if ranked else [])
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(place + [csv_header_name(name) for name in names])
    count = 0
    for raw in runs.iter_events(events_path, end=end) if end else ():
        if raw.get("event") != "metrics":
            continue
        event = typed(raw)
        values = event.get("values") or {}
        writer.writerow([_cell(event.get(column)) for column in place] + [_cell(values.get(name)) for name in names])
        count += 1
    return count


def _cell(value: Any) -> Any:
    return "" if value is None else value


def write_run_csv(events_path: Path, out: TextIO) -> int:
    """A run's CSV: a program run's metrics (write_metrics_csv), a built-in net's curves
    (CSV_COLUMNS). Returns the rows written."""
    if is_program_run(events_path):
        return write_metrics_csv(events_path, out)
    return write_csv(curve_rows(events_path), out)  # streamed, never the whole file


def export_csv(run_dir: str | Path, out: Path | None = None) -> tuple[Path, int]:
    """Write the run's curves (a program run: its metrics) as CSV, in the format of `gputui runs
    export RUN_ID --csv` (the dashboard's curves panel exports with it), to `out` (default:
    curves.csv in the run directory). Returns the path and the rows written."""
    path = Path(run_dir).expanduser()
    events_path = path / runs.EVENTS
    if not events_path.is_file():
        raise UserError(f"{path}: no {runs.EVENTS} there, nothing to export")
    target = out if out is not None else path / CSV_NAME
    try:
        with open(target, "w", encoding="utf-8", newline="", opener=user_opener) as fh:  # the user's umask
            count = write_run_csv(events_path, fh)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target, count


# -- removing runs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Removal:
    """A run `gputui runs rm` is about to remove: what it is, and the bytes it frees."""

    run: runs.RunDir
    state: str
    size: int


def removals(refs: Iterable[str], home: Path | None = None) -> list[Removal]:
    """The runs `refs` name (ids, `last`, paths), each checked before anything is removed, so a
    refused one removes none: it must be a directory directly under `home` (not a link, not a
    `--run-dir` elsewhere, which may sit inside the user's own project), and not running (its
    run.pid's process alive, or its event log open for writing)."""
    home = runs_home() if home is None else home
    out: dict[Path, Removal] = {}
    for ref in refs:
        run = runs.find(ref, home, flag="runs rm")
        try:
            inside = not run.path.is_symlink() and run.path.resolve().parent == home.resolve()
        except OSError:
            inside = False
        if not inside:
            raise UserError(f"runs rm {ref}: {run.path} is not a run directory in {home}; only runs there are "
                            "removed (remove a --run-dir elsewhere yourself, or pass --dir)")
        why = running_refusal(run)
        if why is not None:
            raise UserError(f"runs rm {ref}: {why}")
        digest = summaries.read(run)
        state, _detail = _state(digest, False, None)
        out.setdefault(run.path.resolve(), Removal(run, state, _size(run.path)))
    return list(out.values())


def running_refusal(run: runs.RunDir) -> str | None:
    """Why `run` cannot be removed now (its run.pid's process is alive, or a process holds its
    event log open for writing), or None."""
    if _running(run, runs.written_files([run.events])):
        return (f"run {run.run_id} is running; stop it first (Ctrl-C where it runs, or t in the dashboard), "
                "then remove it")
    return None


def delete_run(run: runs.RunDir) -> None:
    """Remove a run's directory: the one remover (`gputui runs rm`, the dashboard's runs screen).
    UserError while it runs, or for a directory that is not a run (no profile.toml, no
    events.jsonl). Links inside are removed, never followed. Its spend stays in the cost ledger
    (`gputui cost`): money spent is history."""
    import shutil

    why = running_refusal(run)
    if why is not None:
        raise UserError(why)
    if not (run.profile.is_file() or run.events.is_file()):
        raise UserError(f"{run.path}: not a run directory (no {runs.PROFILE}, no {runs.EVENTS})")
    try:
        shutil.rmtree(run.path)
    except OSError as exc:
        raise UserError(f"cannot remove {run.path}: {exc.strerror or exc}") from None


def _size(path: Path) -> int:
    """The bytes of the files under `path` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


# -- small readers ---------------------------------------------------------------------------------

PROFILE_READ = 1 << 20  # bytes of a run's profile.toml read (gputui writes a few hundred)


def run_table(path: Path) -> dict[str, Any]:
    """The [run] table of a run's profile.toml (as gputui wrote it); empty if it cannot be read."""
    try:
        with open(path, "rb") as fh:
            table = tomllib.loads(fh.read(PROFILE_READ).decode("utf-8")).get("run", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return table if isinstance(table, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
