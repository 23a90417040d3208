"""One run in detail: `gputui runs show RUN_ID` (and `--json`).

Its summary as `gputui runs` lists it (gputui.runs.history: state, time, cost, the code it ran),
and what a listing leaves out: the command or model and where it ran, the latest value of each
metric it reported, the trial's values (`[run] trial`), its checkpoints, the last lines of its
output, and the command that goes on from it. Every read is bounded, whatever the run's size:
the end of its events file (the latest values are there), the end of output.log, a count of the
files under checkpoints/. Everything read is data: text is cleaned before it is shown.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gputui.model import outside
from gputui.model.text import clean
from gputui.runs import history
from gputui.runs import store as runs
from gputui.runs.output import read_tail

EVENTS_TAIL = 256 * 1024  # bytes read from the end of events.jsonl for the latest values
OUTPUT_TAIL = 64 * 1024  # ... and from the end of output.log
OUTPUT_LINES = 10  # the output's last lines shown
MAX_METRICS = 64  # metrics shown (a report line holds at most as many)
FILES_COUNTED = 10_000  # files under checkpoints/ counted at most
NODES_LOOKED = 256  # a cluster run's nodes whose output.log is looked at


@dataclass(frozen=True)
class RunDetail:
    summary: history.RunSummary
    workdir: str | None = None  # where a program ran
    trial: dict[str, Any] = field(default_factory=dict)  # its [run] trial (a sweep's trial, `sweep show --run`)
    step: int | None = None  # the last step reported
    metrics: dict[str, float] = field(default_factory=dict)  # the latest value of each metric, the latest first
    checkpoint: str | None = None  # the checkpoint file or directory
    checkpoint_files: int = 0
    checkpoint_bytes: int = 0
    output: list[str] = field(default_factory=list)  # the last lines of output.log, cleaned
    output_path: str | None = None  # that file (a cluster run's: the node's that wrote last)
    next: str | None = None  # the command that goes on from the run (None: nothing to go on with)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["summary"] = self.summary.to_json()
        return out


def detail(ref: str, home: Path | None = None, ledger_path: Path | None = None) -> RunDetail:
    """The run `ref` names (an id, `last`, a run directory: gputui.runs.store.find) in detail."""
    run = runs.find(ref, home, flag="runs show")
    summary = history.summary_of(run, ledger_path)
    profile = history.run_table(run.profile)
    step, metrics = _latest(run.events, program=summary.program is not None)
    files, size, where = _checkpoints(run, program=summary.program is not None)
    complete = summary.state == "done"  # a program's --resume would run it again: not offered
    output = _output_file(run)
    return RunDetail(
        summary=summary,
        workdir=_text(profile.get("workdir")) if summary.program is not None else None,
        trial={clean(str(k), 64): clean(v, 200) if isinstance(v, str) else v
               for k, v in (profile.get("trial") or {}).items()
               if isinstance(v, (str, int, float, bool))} if isinstance(profile.get("trial"), dict) else {},
        step=step, metrics=metrics,
        checkpoint=where, checkpoint_files=files, checkpoint_bytes=size,
        output=list(read_tail(output.parent, OUTPUT_LINES, OUTPUT_TAIL).lines) if output else [],
        output_path=str(output) if output else None,
        next=None if complete or summary.state == "running" else f"gputui run --resume {_ref(run, home)}",
    )


def _output_file(run: runs.RunDir) -> Path | None:
    """The run's output.log; a cluster run's nodes each have theirs (nodes/NAME/output.log): the
    one written to last. None where there is none."""
    mine = run.path / runs.OUTPUT
    if mine.is_file():
        return mine
    found = []
    for node in sorted((run.path / "nodes").glob(f"*/{runs.OUTPUT}"))[:NODES_LOOKED]:
        try:
            found.append((node.stat().st_mtime, node))
        except OSError:
            continue
    return max(found)[1] if found else None


def _ref(run: runs.RunDir, home: Path | None) -> str:
    from gputui.model.paths import runs_home

    return run.run_id if run.path.parent == (runs_home() if home is None else home) else str(run.path)


def _latest(events: Path, program: bool) -> tuple[int | None, dict[str, float]]:
    """The last step, and the latest value of each metric, from the end of the events file: a
    program's `metrics` events (rank 0's), a built-in net's step and epoch figures."""
    try:
        size = events.stat().st_size
    except OSError:
        return None, {}
    step: int | None = None
    latest: dict[str, float] = {}
    for event in runs.iter_events(events, max(0, size - EVENTS_TAIL), size):  # a torn first line is skipped
        kind = event.get("event")
        if program and (kind != "metrics" or outside.index(event.get("rank")) not in (None, 0)):
            continue  # a program's figures are rank 0's reports
        if not program and kind not in ("step", "epoch", "eval"):
            continue
        at = outside.index(event.get("step"))
        if program:
            values = event.get("values")
            if isinstance(values, dict):
                for name, value in values.items():
                    number = outside.finite(value)
                    if number is not None and isinstance(name, str):
                        latest.pop(name, None)
                        latest[name] = number
        else:
            for name in ("loss", "lr", "samples_per_s", "train_loss", "test_loss", "test_acc"):
                number = outside.finite(event.get(name))
                if number is not None:
                    latest.pop(name, None)
                    latest[name] = number
        if at is not None:
            step = at
    shown = list(latest.items())[-MAX_METRICS:][::-1]  # the latest reported first
    return step, {clean(name, 64): value for name, value in shown}


def _checkpoints(run: runs.RunDir, program: bool) -> tuple[int, int, str | None]:
    """(files, bytes, path) of the run's checkpoints: a program's checkpoints/ (links not
    followed), a built-in net's ckpt.pt; (0, 0, None) where there are none."""
    if not program:
        try:
            return 1, run.checkpoint.stat().st_size, str(run.checkpoint)
        except OSError:
            return 0, 0, None
    top = run.path / runs.CHECKPOINTS
    files = size = 0
    for folder, _dirs, names in os.walk(top):
        for name in names:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            size += info.st_size
            if files >= FILES_COUNTED:
                return files, size, str(top)
    return files, size, str(top) if files else None


def _text(value: Any) -> str | None:
    return clean(value) if isinstance(value, str) and value else None


LABEL = 11  # the width of a line's label


def text_lines(d: RunDetail) -> list[str]:
    """The detail as `gputui runs show` prints it: a header, then one labelled line a subject."""
    import time

    from gputui.model import units

    s = d.summary
    head = [f"run {s.run_id}", s.state + (f": {clean(s.detail)}" if s.detail else "")]
    if s.started is not None:
        head.append("started " + time.strftime("%Y-%m-%d %H:%M", time.localtime(s.started)))
    head += [f"{units.duration(s.train_s)} trained", units.money(s.cost_usd)]
    out = [" · ".join(head)]

    def line(label: str, text: str) -> None:
        out.append(f"  {label:<{LABEL}}{text}")

    where = " · ".join(part for part in (s.device, s.strategy + (f" x{s.world_size}" if s.world_size and s.world_size > 1
                                                                    else "") if s.strategy else None) if part)
    if s.program is not None:
        line("program", clean(s.program))
        if d.workdir:
            line("workdir", d.workdir)
    else:
        epochs = f"{s.epochs_done}/{s.epochs if s.epochs is not None else '?'} epochs"
        line("model", " · ".join([s.model or units.NA, epochs, f"best {history._pct(s.best_acc)}",
                                   f"final {history._pct(s.final_acc)}"]))
    if s.git_commit:
        line("code", f"git {clean(s.git_commit)[:10]}" + (" with uncommitted changes" if s.git_dirty else ""))
    if where:
        line("device", clean(where))
    if d.trial:
        line("trial", " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in d.trial.items()))
    if s.objective:
        line("objective", f"{clean(s.objective)} ({s.direction or 'maximize'}): best {history._value(s.objective_best)}"
                          f" · last {history._value(s.objective_last)}")
    figures = ([f"step {d.step}"] if d.step is not None else []) + [_figure(k, v, s.program is None)
                                                                     for k, v in d.metrics.items()]
    if figures:
        line("latest", " · ".join(figures))
    if d.checkpoint:
        what = units.plural(d.checkpoint_files, "file") + ", " if s.program is not None else ""
        line("checkpoint", f"{d.checkpoint} ({what}{units.size(d.checkpoint_bytes)})")
    line("dir", s.path)
    if d.output:
        line("output", f"the last {units.plural(len(d.output), 'line')} of {d.output_path}:")
        out.extend(f"    {text}" for text in d.output)
    if d.next:
        line("go on", d.next)
    line("curves", f"gputui runs export {s.run_id} --csv")
    return [clean(text, 4000) for text in out]  # every line is data from the run (a path, a trial's string)


def _figure(name: str, value: float, net: bool) -> str:
    """`name value`: a built-in net's figures in their units, a program's as numbers (4 significant
    digits, grouped thousands for a large one: 33,690 rather than 3.369e+04)."""
    if net and name == "test_acc":
        return f"test acc {value:.2f}%"
    if net and name == "samples_per_s":
        return f"{value:,.0f} samples/s"
    if 1e4 <= abs(value) < 1e15:
        return f"{name.replace('_', ' ') if net else name} {value:,.0f}"
    return f"{name.replace('_', ' ') if net else name} {value:.4g}"
