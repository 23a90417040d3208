"""A run of the user's own program: `gputui run -- PROGRAM [ARGS...]` or `[run] command`.

The program runs under gputui's supervision (gputui.jobs.keeper: its whole process tree ends
with the run, however the run ends), in its `workdir`, with the GPUs gputui chose and the
`GPUTUI_*` variables of docs/program.md. What it reports (`gputui.report`, or any language
appending JSON lines to `GPUTUI_EVENTS`) and what `[run] metrics_regex` finds in its output
become `metrics` events in the run's events.jsonl; its output goes unchanged to output.log.
Nothing here imports torch (a DDP program's rendezvous store does, in gputui.train.rdzv).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from gputui.config.run import METRIC_NAME
from gputui.model import events, outside, units
from gputui.model.errors import GputuiError, UserError
from gputui.model.lines import OUTPUT_LINE, LineSplitter
from gputui.model.text import clean
from gputui.runs import store as runs
from gputui.runs.provenance import code_version

OUTPUT, CHECKPOINTS = runs.OUTPUT, runs.CHECKPOINTS  # output.log, GPUTUI_CHECKPOINT_DIR (named in gputui.runs.store)
REPORTED = "reported.jsonl"  # GPUTUI_EVENTS: the program appends its report lines here
STOP_FILE = "stop"  # GPUTUI_STOP_FILE: exists once gputui asked the run to stop
MAX_REPORT_LINE = 64 * 1024  # bytes: a report line longer than this is dropped (and counted)
MAX_VALUES = 64  # metrics in one report line; more are dropped (and counted)
LOOK: Any = object()  # execute_program's `code`: read the workdir's (a sweep's worker is given the master's)
EVENTS_PER_S = 50.0  # metrics events written at most this often; faster reports are merged
READ_CHUNK = 1 << 20
READS_PER_TICK = 64  # at most 64 MiB of reports read between two looks at the program and the stop flag
POLL_S = 0.05
SHOWN_PENDING = 4096  # bytes of a line not yet ended that the terminal view gets (a wide terminal's line)
STEP_KEYS = ("step", "epoch")  # named groups of a metrics_regex that place a line, not measure it


@dataclass
class Record:
    """One set of numbers the program reported."""

    values: dict[str, float | int]
    step: int | None = None
    epoch: int | None = None
    rank: int | None = None
    time: float | None = None  # Unix seconds, as the program said (checked against the clock before use)
    source: str = "report"
    checkpoint: bool = False  # the program says it has just written a checkpoint (report.log(checkpoint=True))
    said: int | None = None  # merged (Pacer with an objective): how many of its reports gave the objective


class Reports:
    """The program's report lines, checked: a line that is not a report (not JSON, not an
    object, too long, no numbers) is refused and counted; a value that is not a finite number,
    a name that is not a metric's, and values past MAX_VALUES are dropped and counted. The first
    problem is said once (`warning`), the rest only counted."""

    def __init__(self, source: str = "the program's GPUTUI_EVENTS") -> None:
        self.tally = outside.Tally(source)
        self.lines = LineSplitter(MAX_REPORT_LINE)
        self.dropped = 0  # values not taken from lines that were

    def feed(self, chunk: bytes) -> list[Record]:
        out = []
        for line in self.lines.feed(chunk):
            if line.strip():
                record = self.parse(line)
                if record is not None:
                    out.append(record)
        if self.lines.cut:
            self.tally.refuse(f"a line longer than {MAX_REPORT_LINE // 1024} KiB")
            self.lines.cut = 0
        return out

    def parse(self, line: bytes) -> Record | None:
        raw = self.tally.line(line, MAX_REPORT_LINE)
        if raw is None:
            return None
        values_in = raw.get("values")
        if not isinstance(values_in, dict):
            self.tally.refuse('a line without a "values" object')
            return None
        values: dict[str, float | int] = {}
        for name, value in values_in.items():
            number = outside.finite(value)
            if not METRIC_NAME.match(name):
                why = (f"a metric named {clean(name, 40)!r} (a name is a letter or _, then up to 63 letters, "
                       "digits or _ . : / -)")
            elif number is None:
                why = f"a value of {name} that is not a finite number"
            elif len(values) >= MAX_VALUES:
                why = f"more than {MAX_VALUES} values in one line ({name} and the rest)"
            else:
                values[name] = number
                continue
            self.dropped += 1
            self.tally.refuse(why)
        checkpoint = raw.get("checkpoint") is True
        if not values and not checkpoint:
            return None
        return Record(values, step=outside.index(raw.get("step")), epoch=outside.index(raw.get("epoch")),
                      rank=outside.index(raw.get("rank")), time=outside.number(raw.get("time")), checkpoint=checkpoint)


class OutputMetrics:
    """`[run] metrics_regex`: each output line that a pattern matches gives the numbers of its
    named groups (a group named step or epoch places the line instead)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [re.compile(p) for p in patterns]

    def match(self, line: str) -> Record | None:
        values: dict[str, float | int] = {}
        place: dict[str, int | None] = {}
        for pattern in self.patterns:
            found = pattern.search(line)
            if found is None:
                continue
            for name, text in found.groupdict().items():
                if text is None:
                    continue
                number = outside.number_text(text)
                if name in STEP_KEYS:
                    place[name] = outside.index(number)
                elif number is not None and METRIC_NAME.match(name):
                    values[name] = number
        if not values:
            return None
        return Record(values, step=place.get("step"), epoch=place.get("epoch"), source="output")


class Pacer:
    """Metrics events at most EVENTS_PER_S a second per rank: a report that comes sooner is
    merged into the next event (the latest value of each metric, the latest step and epoch;
    `merged` counts the reports in it, and with an `objective` the merged record's `said` those that
    gave it). Nothing reported is lost for longer than one interval."""

    def __init__(self, per_s: float = EVENTS_PER_S, objective: str | None = None) -> None:
        self.interval = 1.0 / per_s
        self.objective = objective
        self.last: dict[int | None, float] = {}
        self.pending: dict[int | None, tuple[Record, int]] = {}

    def add(self, record: Record, now: float) -> list[tuple[Record, int]]:
        key = record.rank
        held = self.pending.pop(key, None)
        if held is not None:
            objective, said = self.objective, None
            if objective is not None:  # a sweep's pruner counts the objective's reports (programs.Relay)
                before = held[0].said if held[0].said is not None else int(objective in held[0].values)
                said = before + (objective in record.values)
            merged = Record({**held[0].values, **record.values},
                            step=record.step if record.step is not None else held[0].step,
                            epoch=record.epoch if record.epoch is not None else held[0].epoch,
                            rank=record.rank, time=record.time, source=record.source,
                            checkpoint=record.checkpoint or held[0].checkpoint, said=said)
            record, count = merged, held[1] + 1
        else:
            count = 1
        if now - self.last.get(key, -1e9) >= self.interval:
            self.last[key] = now
            return [(record, count)]
        self.pending[key] = (record, count)
        return []

    def due(self, now: float, flush: bool = False) -> list[tuple[Record, int]]:
        out = []
        for key in list(self.pending):
            if flush or now - self.last.get(key, -1e9) >= self.interval:
                out.append(self.pending.pop(key))
                self.last[key] = now
        return out


@dataclass
class Clock:
    """The run's training clock: `elapsed_s` goes on from where a resumed run stopped."""

    before_s: float  # elapsed_s the run had when this attempt started
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    last: float = 0.0

    def elapsed(self, said_wall: float | None = None) -> float:
        """Now (or when the program said, if that is between this attempt's start and now),
        never before the last one given."""
        now = time.monotonic() - self.started
        at = now
        if said_wall is not None:
            offset = said_wall - self.started_wall
            if 0 <= offset <= now:
                at = offset
        self.last = max(self.last, self.before_s + at)
        return round(self.last, 3)


def last_elapsed(path: Path) -> float:
    """The last elapsed_s in a run's events (0 for a new run)."""
    last = 0.0
    for event in runs.iter_events(path):
        value = outside.number(event.get("elapsed_s"))
        if value is not None and value >= last:
            last = value
    return last


def program_env(base: Mapping[str, str], run: runs.RunDir, extra: Mapping[str, str], resume: bool,
                trial: Mapping[str, Any]) -> dict[str, str]:
    """The program's environment: the user's, `[run] env`, and gputui's variables (docs/program.md).
    The directory of the Python running gputui goes first on PATH, so `python` is the one that
    has gputui (and torch) when gputui runs from a virtual environment."""
    env = dict(base)
    env.update(extra)
    here = str(Path(sys.executable).parent)
    env["PATH"] = here + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    env.update({
        "GPUTUI_RUN_DIR": str(run.path),
        "GPUTUI_EVENTS": str(run.path / REPORTED),
        "GPUTUI_CHECKPOINT_DIR": str(run.path / CHECKPOINTS),
        "GPUTUI_RESUME": "1" if resume else "0",
        "GPUTUI_TRIAL": json.dumps(dict(trial), sort_keys=True),
        "GPUTUI_STOP_FILE": str(run.path / STOP_FILE),
        "PYTHONUNBUFFERED": "1",  # its output is seen as it prints
    })
    return env


class _Pump(threading.Thread):
    """One output stream of the program: to output.log unchanged, and segment by segment to
    `line(text, stream, end)`, split as a terminal shows it: `end` is "\n" for a line, "\r" for a
    progress bar's redraw, and "" for what is shown of a segment not yet ended (after each chunk,
    when it changed: a bar drawn as "\r" + text shows now, not at its next redraw). With `copy`
    (a file, a pipe: not a view that draws it) each chunk also goes there as it came, and only
    lines and redraws are given to `line` (for metrics_regex). With `whole_segments` (two pumps
    writing one output.log) the log gets whole lines and redraws, so the other stream's lines
    come between them, never inside one (a tqdm frame had a stdout line glued into it)."""

    def __init__(self, stream: Any, name: str, log: Any, lock: threading.Lock,
                 line: Callable[[str, str, str], None], copy: Callable[[bytes], None] | None = None,
                 whole_segments: bool = False) -> None:
        super().__init__(name=f"gputui-{name}", daemon=True)
        self.stream, self.kind, self.log, self.lock, self.line = stream, name, log, lock, line
        self.copy = copy
        self.whole_segments = whole_segments  # output.log is shared with the other stream's pump
        self.splitter = LineSplitter(OUTPUT_LINE, marker=b" [...]", redraws=True)
        self.last = ""
        self.lost: str | None = None  # why output.log first refused a chunk (the run says it once)

    def run(self) -> None:
        read = getattr(self.stream, "read1", self.stream.read)
        shown = b""
        held = b""  # what follows the last line or redraw that ended, held from output.log (shared)
        while True:
            try:
                chunk = read(65536)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            if self.whole_segments:
                ended, held = _at_segment_end(held + chunk)
                self._log(ended)
            else:
                self._log(chunk)
            if self.copy is not None:
                self.copy(chunk)
            done = self.splitter.feed(chunk)
            for raw in done:
                self._segment(raw)
            if self.copy is not None:
                continue
            pending = self.splitter.pending(SHOWN_PENDING)
            if pending != shown or (done and pending):
                shown = pending
                self.line(pending.decode("utf-8", errors="replace"), self.kind, "")
        self._log(held)
        rest = self.splitter.finish()
        if rest is not None:
            self._segment(rest)

    def _log(self, data: bytes) -> None:
        if not data:
            return
        with self.lock:
            try:  # unbuffered: a chunk the disk refused is not retried at close
                written = self.log.write(data)
                if written is not None and written < len(data):
                    raise OSError(f"a short write ({written} of {len(data)} bytes): is the disk full?")
            except OSError as exc:  # a full disk costs the log, never the run
                if self.lost is None:
                    self.lost = str(exc.strerror or exc)

    def _segment(self, raw: bytes) -> None:
        end = "\r" if raw.endswith(b"\r") else "\n"
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip():
            self.last = text
        self.line(text, self.kind, end)


LOG_HELD = 64 * 1024  # bytes of a line not yet ended that output.log waits for before it takes them anyway


def _at_segment_end(data: bytes) -> tuple[bytes, bytes]:
    """`data` cut after its last line or redraw that has ended, and the rest (held for the next
    chunk): a "\r" at the very end may be a CRLF's first half, so it does not end one yet. A
    rest longer than LOG_HELD is not held: the log never lags far behind, nor grows a buffer."""
    stop = len(data) - 1 if data.endswith(b"\r") else len(data)
    cut = max(data.rfind(b"\n", 0, stop), data.rfind(b"\r", 0, stop)) + 1
    if len(data) - cut > LOG_HELD:
        cut = len(data)
    return data[:cut], data[cut:]


def command_text(command: Sequence[str]) -> str:
    return shlex.join(command)


class ReportsFile:
    """The program's reports file (GPUTUI_EVENTS), read from where it ended when the attempt began.
    Opened once it exists, without blocking and only if it is a regular file (a FIFO would block
    the open, a device would never end: `refused` says so once); at most READS_PER_TICK chunks a
    call, so a flood never keeps gputui from looking at the program and its stop flag."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.is_file() else 0
        self.fh: Any = None
        self.gave_up = False
        self.refused: str | None = None

    def _open(self) -> None:
        import stat

        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return
        except OSError as exc:
            self.gave_up, self.refused = True, f"cannot read {self.path}: {exc.strerror or exc}"
            return
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self.gave_up, self.refused = True, f"{self.path} is not a regular file: the program's reports are not read"
            return
        os.set_blocking(fd, True)
        self.fh = os.fdopen(fd, "rb")
        self.fh.seek(self.offset)

    def chunks(self) -> Iterator[bytes]:
        if self.fh is None and not self.gave_up:
            self._open()
        if self.fh is None:
            return
        for _ in range(READS_PER_TICK):
            chunk = self.fh.read(READ_CHUNK)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def find_program(name: str, workdir: Path, path: str) -> str:
    """Where `name` is (a path is taken from `workdir`); a UserError in one line when it is nowhere."""
    import shutil

    if os.sep in name:
        where = workdir / Path(name).expanduser()
        if where.is_file() and os.access(where, os.X_OK):
            return str(where)
        if where.is_file():
            why = "is not executable (chmod +x it, or put its interpreter first)"
        elif where.is_dir():
            why = "is a directory, not a program (name the program in it, e.g. python train.py)"
        else:
            why = "does not exist"
        raise UserError(f"{name}: {why} (from the workdir {workdir})")
    found = shutil.which(name, path=path)
    if found is None:
        raise UserError(f"{name}: no such program on PATH (give its path, e.g. ./{name}, or python {name})")
    return found


def wrote_checkpoint(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


def execute_program(run: runs.RunDir, cfg: Any, resume: bool, view: Any, stop: Any = None, code: Any = LOOK) -> str:
    """Run the program to its end; 'done' or 'interrupted', or raise GputuiError (a non-zero exit).
    `stop` (set(reason), is_set(), reason): a sweep worker's stop for its trial (a pruned trial).
    `code`: the CodeVersion (or None) its start event records; LOOK: read from the workdir."""
    from gputui.jobs import gpus as gpu_choice
    from gputui.model.paths import user_umask
    from gputui.jobs.prompt import PromptWatch
    from gputui.model.supervisor import StopFlag, Tree, stop_on_signals
    from gputui.train.distributed import _die_with_parent

    command = list(cfg.command)
    workdir = Path(cfg.workdir or ".").expanduser()
    if not workdir.is_dir():
        raise UserError(f"{workdir}: the program's workdir is not a directory (set [run] workdir, or cd there)")
    from gputui.train.threads import child_env, machine, run_threads, take_sample

    sample = take_sample()  # others' CPU use is sampled while the GPUs are looked at: no extra wait
    ddp = cfg.strategy == "ddp"
    nproc = (cfg.nproc or 0) if ddp else 1
    choice = gpu_choice.choose(cfg.device, cfg.gpus, max(nproc, 1), os.environ,
                               rule=gpu_choice.free_rule_of(run.profile))  # the profile's [free], kept in the run's copy
    if ddp and not nproc:
        nproc = len(choice.visible) if choice.visible else 2
    env = program_env(os.environ, run, dict(cfg.env), resume, dict(cfg.trial))
    env.update(choice.env())
    find_program(command[0], workdir, env.get("PATH", ""))
    threads_info: dict[str, Any] = {}
    if choice.device == "cpu":  # on the CPU: threads that fit what is free
        view_now = None if cfg.threads or "OMP_NUM_THREADS" in os.environ else machine(sample)
        threads, why = run_threads(cfg.threads, os.environ, workers=max(nproc, 1), view=view_now)
        if cfg.threads or "OMP_NUM_THREADS" not in os.environ:
            env = child_env(env, threads, why)
        threads_info = {"threads": threads, "threads_why": why}
    (run.path / CHECKPOINTS).mkdir(exist_ok=True)
    (run.path / STOP_FILE).unlink(missing_ok=True)
    store = None
    argv = command
    if ddp:
        from gputui.train.distributed import local_group_env
        from gputui.train.rdzv import LOOPBACK, new_token, serve_store

        token = new_token()
        env = {**env, **{k: v for k, v in local_group_env({}, token).items()}}
        store = serve_store(LOOPBACK, 0, timeout_s=600)
        argv = [sys.executable, "-m", "gputui.train.launch", "--nnodes=1", f"--nproc-per-node={nproc}",
                "--rdzv-backend=gputui", f"--rdzv-endpoint={LOOPBACK}:{store.port}", f"--rdzv-id={run.run_id}",
                "--rdzv-conf=rank=0", f"--local-addr={LOOPBACK}", "--max-restarts=0", "--no-python", *command]
    clock = Clock(before_s=last_elapsed(run.events) if resume else 0.0)
    log = runs.EventLog(run.events)
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        with lock:
            log.write(runs.encode(event))
        view.show(event)

    start: dict[str, Any] = dict(
        run_id=run.run_id, run_dir=str(run.path), program=command_text(command), workdir=str(workdir.resolve()),
        device=choice.device,
        device_choice=choice.why, gpus=list(choice.visible or ()), strategy="ddp" if ddp else "single",
        world_size=nproc if ddp else 1, resumed=resume, direction=cfg.direction, **threads_info)
    if cfg.objective:
        start["objective"] = cfg.objective
    version = code_version(workdir) if code is LOOK else code  # which code this start ran (gputui.runs.provenance)
    if version is not None:
        start.update(version.fields())
    outputs = OutputMetrics(cfg.metrics_regex)
    reports = Reports()
    pacer = Pacer(objective=cfg.objective or None)
    position: dict[str, int | None] = {"step": None, "epoch": None}

    def metrics(batch: list[tuple[Record, int]]) -> None:
        for record, count in batch:
            if record.step is not None:
                position["step"] = record.step
            if record.epoch is not None:
                position["epoch"] = record.epoch
            fields: dict[str, Any] = dict(step=record.step, epoch=record.epoch, values=record.values,
                                          elapsed_s=clock.elapsed(record.time), source=record.source)
            if record.rank is not None:
                fields["rank"] = record.rank
            if count > 1:
                fields["merged"] = count
                if record.said is not None and record.said > 1:  # a sweep's pruner counts them (step-less)
                    fields["objective_reports"] = record.said
            if record.checkpoint:
                fields["checkpoint"] = True
            emit(events.make("metrics", **{k: v for k, v in fields.items() if v is not None}))

    output_lock = threading.Lock()

    output_at = [time.monotonic()]  # when the program last wrote (a program that prints waits for no line)

    def on_line(text: str, stream: str, end: str) -> None:
        output_at[0] = time.monotonic()
        if stream in drawn:
            view.output(text, stream, end)
        record = outputs.match(text) if outputs.patterns and end else None  # a line, or a bar's redraw
        if record is not None:
            with output_lock:
                metrics(pacer.add(record, time.monotonic()))

    tick = getattr(view, "tick", None)  # a terminal view draws what changed while nothing else comes
    stop = stop if stop is not None else StopFlag()
    emit(events.make("start", **start))
    # Where the program's output goes, once the view has its start: one pipe for stdout and
    # stderr (their order kept, in output.log too), unless the view sends them to two places
    # (`> out.txt` on a terminal); a stream the view does not draw is copied as it came.
    placed = getattr(view, "program_streams", None)
    # The command's stdin goes to the program, as a shell gives it (`< params.txt`, a pipe, the
    # terminal for input() and breakpoint()); a view that does not say so (a sweep's worker, whose
    # stdin is its master's) gives it none.
    reads_stdin = getattr(view, "program_stdin", False) is True
    awaiting = getattr(view, "awaiting_input", None)  # a terminal view: the program waits for a typed line
    prompts = PromptWatch.for_stdin() if reads_stdin and awaiting is not None else None
    streams: list[tuple[str, Callable[[bytes], None] | None]] = placed() if placed else [("output", None)]
    drawn = {name for name, copy in streams if copy is None and hasattr(view, "output")}  # on_line's
    output_file = open(run.path / OUTPUT, "ab", buffering=0)
    proc: subprocess.Popen[bytes] | None = None
    tree: Tree | None = None
    stopping_at: float | None = None
    output_lost_said = False
    try:
        with stop_on_signals(stop):
            proc = subprocess.Popen(
                [sys.executable, "-m", "gputui.jobs.keeper", "--grace", str(cfg.stop_grace_s),
                 "--parent", str(os.getpid()), "--umask", f"{user_umask():o}", "--", *argv],
                cwd=str(workdir), env=env, stdin=None if reads_stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if len(streams) > 1 else subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                start_new_session=not sys.platform.startswith("linux"))
            tree = Tree(proc)
            pumps = [_Pump(pipe, name, output_file, lock, on_line, copy, whole_segments=len(streams) > 1)
                     for (name, copy), pipe in zip(streams, (proc.stdout, proc.stderr))]
            for pump in pumps:
                pump.start()
            reported = ReportsFile(run.path / REPORTED)
            looked = time.monotonic()
            while True:
                finished = proc.poll() is not None
                if time.monotonic() - looked > 1.0:  # remember the program's processes (the keeper could die)
                    tree.refresh()
                    looked = time.monotonic()
                got = False
                for chunk in reported.chunks():
                    if not got and not reports.lines.fed:  # its first report: the program's processes are up
                        tree.refresh()
                    got = True
                    now = time.monotonic()
                    with output_lock:
                        for record in reports.feed(chunk):
                            metrics(pacer.add(record, now))
                    warning = reports.tally.warning()
                    if warning is not None:
                        emit(events.make("warning", reason="bad_report", message=warning))
                if reported.refused is not None:
                    emit(events.make("warning", reason="bad_report", message=reported.refused))
                    reported.refused = None
                output_lost_said = output_lost_said or _say_lost_output(pumps, run.path / OUTPUT, emit)
                with output_lock:
                    metrics(pacer.due(time.monotonic(), flush=finished))
                if finished and not got:
                    break
                if stop.is_set() and stopping_at is None:
                    stopping_at = time.monotonic()
                    _ask_to_stop(run, tree)
                    if prompts is not None and prompts.waiting:  # it sees the stop only once it has its line
                        emit(events.make("warning", reason="waiting_for_input", message=(
                            "the program waits for a line typed here, and sees the stop only after it (it has "
                            f"{units.duration(cfg.stop_grace_s)}): press Enter, or Ctrl-C again to end it now")))
                if stopping_at is not None and time.monotonic() - stopping_at > cfg.stop_grace_s + 5:
                    tree.kill()  # the keeper itself did not end the program in its grace
                if prompts is not None and awaiting is not None and not finished:
                    said = prompts.check(tree.pids(), output_at[0])
                    if said is not None:
                        awaiting(said)
                if tick is not None:
                    tick()
                if not got:
                    time.sleep(POLL_S)
            reported.close()
            output_lost_said = output_lost_said or _say_lost_output(pumps, run.path / OUTPUT, emit)
            # The keeper has ended. Whatever of the program is left (orphans of a keeper that was
            # killed) holds the output pipes open: it ends now, so the pipes reach their end.
            tree.kill()
            for pump in pumps:
                pump.join(10)
            with output_lock:  # what metrics_regex found in the last output, read after the program ended
                metrics(pacer.due(time.monotonic(), flush=True))
    except BaseException:  # a second Ctrl-C, a closed stdout: nothing of the program outlives gputui
        if tree is not None:
            tree.kill()
        raise
    finally:
        if tree is not None:
            tree.kill()  # a no-op once the keeper has ended everything
        store = None  # the store stops listening as it goes (nothing else holds it)
        output_file.close()
    code = proc.returncode if proc is not None else 1
    end = clock.elapsed()
    try:
        if stop.is_set():
            checkpoint = run.path / CHECKPOINTS
            fields: dict[str, Any] = dict(reason=stop.reason, step=position["step"], epoch=position["epoch"],
                                          elapsed_s=end, exit_code=code)
            if wrote_checkpoint(checkpoint):
                fields["checkpoint"] = str(checkpoint)
            emit(events.make("interrupted", **{k: v for k, v in fields.items() if v is not None}))
            return "interrupted"
        if code == 0:
            emit(events.make("done", **{k: v for k, v in dict(exit_code=0, elapsed_s=end, step=position["step"]).items()
                                        if v is not None}))
            return "done"
        last = clean(next((pump.last for pump in reversed(pumps) if pump.last), "no output"))[:300]  # stderr's first
        message = f"{Path(command[0]).name} exited with code {code}: {last}"
        emit(events.make("error", message=message, exit_code=code, elapsed_s=end))
        raise GputuiError(message)
    finally:
        log.close()


def _say_lost_output(pumps: Sequence[_Pump], path: Path, emit: Callable[[dict[str, Any]], None]) -> bool:
    """One `warning` (reason `output_log`) once output.log refused a chunk, and True; what the
    program prints still shows and is still read for metrics, the file misses it."""
    lost = next((pump.lost for pump in pumps if pump.lost is not None), None)
    if lost is None:
        return False
    emit(events.make("warning", reason="output_log",
                     message=f"cannot write {path}: {lost}; the program's output is not all kept there "
                             "(it still shows here; free space for the rest)"))
    return True


def _ask_to_stop(run: runs.RunDir, tree: Any) -> None:
    """`report.should_stop()` turns True (the stop file), and SIGTERM goes to the keeper, which
    passes it on to the whole program and SIGKILLs what is left after [run] stop_grace_s."""
    try:
        (run.path / STOP_FILE).touch()
    except OSError:
        pass
    try:
        os.kill(tree.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
