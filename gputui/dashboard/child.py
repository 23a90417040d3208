"""The training run as a child process: `gputui run --json`, so the dashboard shows
exactly what the headless engine does.

Given a run directory (what the dashboard does), the child is its own: a session of its own,
stdout to /dev/null, stderr to the run directory's stderr.log, and the dashboard follows the
run's events.jsonl (gputui.runs.follow), as it follows a run it did not start. So the
run can outlive the dashboard (quit, "keep it running") and be attached to again. Without a
run directory, its events come on stdout, one JSON line each, and its last error line on stderr.

Stopping it is one SIGTERM, and then waiting for the run's own teardown: the run
checkpoints, stops its processes (torchrun's workers, a cluster's nodes) and releases the
cloud slaves it started. The wait is bounded by more than that teardown may take (the
supervisor's grace, the cluster's wait for its nodes, and the cloud's bound on terminating
slaves); only past the bound is every process of the run SIGKILLed, and the run's last
error line says so. While it stops, `progress` says what it waits for, from the run's
`stopping` events and its live process count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from gputui.runs import store as runs
from gputui.model import units
from gputui.runs.follow import Follower
from gputui.model.events import typed
from gputui.model import outside
from gputui.model.text import clean, clean_tree
from gputui.model.supervisor import GRACE_S, Tree
from gputui.model.units import plural

# A local or DDP run stops within the supervisor's grace (torchrun's workers included), plus its checkpoint.
LOCAL_STOP_S = GRACE_S + 30.0
# A cluster run's teardown (gputui.cluster.teardown) gives its nodes the grace plus 10 s, then 15 s for
# the exits of nodes it killed, then terminates the cloud slaves it started, which waits up to the
# cloud's own bound (CloudContext.wait_timeout_s); a minute more for the cloud's calls themselves.
# (Numbers, not imports: the dashboard starts without the cluster and cloud modules.)
CLOUD_RELEASE_S = 600.0
CLUSTER_STOP_S = GRACE_S + 10.0 + 15.0 + CLOUD_RELEASE_S + 60.0
# Events only the trainer (every strategy) emits; any other one comes from a cluster's master.
_TRAINER_EVENTS = {"start", "step", "eval", "epoch", "interrupted", "done", "error", "warning", "fallback", "stopping",
                   "metrics"}  # metrics: what a user's program reported (gputui.jobs.program)
# A program run's own stop (gputui.jobs.program): [run] stop_grace_s for the program, 5 s more
# before its keeper is killed, then the run's end; the bound is at least LOCAL_STOP_S.
PROGRAM_STOP_MARGIN_S = 35.0

Progress = Callable[["TrainingChild", str, bool], None]  # (child, text, worth a line in the log)


def run_argv(profile: Path | None, resume: bool, extra: Sequence[str] = ()) -> list[str]:
    """The command line of the child: a new run of `profile`, or `--resume last`."""
    argv = [sys.executable, "-m", "gputui", "run", "--json"]
    if resume:
        argv += ["--resume", "last"]
    elif profile is not None:
        argv += ["--profile", str(profile)]
    return argv + list(extra)


def program_of(profile: Path) -> tuple[str, ...]:
    """The profile's [run] command (empty: it trains a built-in net; also for a profile that does
    not load: `gputui run` says what is wrong with it)."""
    from gputui.config.profile import load_profile
    from gputui.model.errors import GputuiError

    try:
        return tuple(load_profile(profile).run.command or ())
    except (GputuiError, OSError):
        return ()


def program_grace_s(run_dir: Path | None) -> float:
    """A program run's [run] stop_grace_s, from its resolved profile (the default when unreadable)."""
    from gputui.config.profile import load_profile
    from gputui.config.run import RunConfig
    from gputui.model.errors import GputuiError

    default = float(RunConfig.__dataclass_fields__["stop_grace_s"].default)  # type: ignore[arg-type]
    if run_dir is None:
        return default
    try:
        grace = load_profile(runs.RunDir(run_dir).profile).run.stop_grace_s
    except (GputuiError, OSError):
        return default
    return float(grace) if grace is not None else default


class TrainingChild:
    """One `gputui run --json` process. `events()` blocks: call it from a worker thread.

    `on_progress(child, text, log)` is called from this object's threads while the run stops
    (text "" once it has ended); `clock` measures the stop bound (tests move it by hand).
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                 on_progress: Progress | None = None, clock: Callable[[], float] = time.monotonic,
                 run_dir: Path | None = None, profile: Path | None = None) -> None:
        self.argv = list(argv)
        self.run_dir = run_dir  # set: the run is detached (own session, files) and followed from its events.jsonl
        self.profile = profile  # recorded in run.pid: `t` in another dashboard on this profile attaches
        self.follower: Follower | None = None
        self.detached = False  # the dashboard let it go on without it (quit: "keep it running")
        self.env = env
        self.cwd = cwd
        self.on_progress = on_progress
        self.clock = clock
        self.proc: subprocess.Popen[str] | None = None
        self.tree: Tree | None = None
        self._stderr: deque[str] = deque(maxlen=40)
        self._stderr_done = threading.Event()
        self.stop_requested = False
        self.cluster: bool | None = None  # from its events: None until it says
        self.stopping: dict[str, Any] | None = None  # its latest `stopping` event
        self.progress = ""
        self.killed = False  # SIGKILLed past the stop bound
        self._lock = threading.Lock()
        self._stopper: threading.Thread | None = None
        self._stderr_start = 0
        self._made_dir = False  # this object made run_dir (a new run, not a resume)
        self._kept = False  # stderr.log's lines are in _stderr (the run never started: its directory went)
        self.program = False  # a run of the user's own program (its start event says so)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process (OSError if it cannot be)."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.run_dir is not None:
            self._start_detached(env, self.run_dir)
            return
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1, env=env,
                                     cwd=self.cwd)
        self.tree = Tree(self.proc)  # no marker: the dashboard adopts no orphans
        threading.Thread(target=self._drain_stderr, name="training-stderr", daemon=True).start()

    def _start_detached(self, env: dict[str, str], run_dir: Path) -> None:
        """A run that does not depend on the dashboard: its own session (no signal from the
        dashboard's terminal), no pipe to the dashboard (stdout to /dev/null: its events are in
        events.jsonl; stderr to stderr.log)."""
        run = runs.RunDir(run_dir)
        self._made_dir = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        start = run.events.stat().st_size if run.events.exists() else 0  # a resume appends: follow what is new
        with open(run_dir / runs.STDERR, "ab") as err:
            self._stderr_start = err.tell()
            # text=True changes nothing here (no pipe to read); it keeps self.proc one type, Popen[str].
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         env=env, cwd=self.cwd, start_new_session=True, text=True)
        self.tree = Tree(self.proc)
        runs.write_pid(run, self.proc.pid, self.profile)  # now, not once the run has imported torch: `t` elsewhere attaches
        self.follower = Follower(run.events, alive=lambda: self.proc is not None and self.proc.poll() is None,
                                 start=start)
        self._stderr_done.set()

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                if line.strip():
                    self._stderr.append(clean(line.rstrip()))
        finally:
            self._stderr_done.set()

    def events(self) -> Iterator[dict[str, Any]]:
        """Each event as it is written, until the process has ended (or the dashboard let it go)."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        """The events as they are written, in batches: those of one read of the run's events
        file together (a line at a time from a pipe), never an empty list."""
        assert self.proc is not None
        if self.follower is not None:
            for batch in self.follower.batches():
                for event, _history in batch:
                    self._seen(event)
                yield [event for event, _history in batch]
            return
        for event in self._piped():
            yield [event]

    def _piped(self) -> Iterator[dict[str, Any]]:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = outside.parse_object(line)
            except outside.Refused:
                continue  # `--json` prints only events; anything else is not ours to show
            event = clean_tree(event)  # a cluster run relays what slaves said: data, without control characters
            self._seen(event)
            yield event

    def _seen(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        if kind == "start" and event.get("program") is not None:
            self.cluster = False  # a program runs on this machine (a profile with [cluster] is refused)
            self.program = True
        elif kind == "start" and self.cluster is None:
            self.cluster = event.get("nodes") is not None
        elif kind not in _TRAINER_EVENTS:
            self.cluster = True
        if kind == "stopping":
            self.stopping = typed(event)
            slaves = self.stopping.get("slaves")
            if isinstance(slaves, int) and slaves > 0:
                self.cluster = True
            message = self.stopping.get("message")
            self._note(str(message) if message else self._waiting_for(), log=True)

    def stop_bound(self) -> float:
        """How long the run may take to stop before it is SIGKILLed: a cluster's teardown and
        slave release, unless the run has shown it is local."""
        if self.program:
            return max(LOCAL_STOP_S, program_grace_s(self.run_dir) + PROGRAM_STOP_MARGIN_S)
        return LOCAL_STOP_S if self.cluster is False else CLUSTER_STOP_S

    def wait(self) -> int:
        """The exit code, once the process has ended and its stderr is read."""
        assert self.proc is not None
        code = self.proc.wait()
        self._stderr_done.wait(5.0)
        if self.run_dir is not None:
            runs.clear_pid(runs.RunDir(self.run_dir), self.proc.pid)  # the run removes it itself, unless killed
            if self._made_dir and not runs.RunDir(self.run_dir).profile.exists():
                self._drop_unstarted(self.run_dir)
        return code

    def _drop_unstarted(self, run_dir: Path) -> None:
        """A run refused before it started (a check failed, so it wrote no profile.toml) leaves no
        directory behind: its stderr is kept here for last_error, and the directory this object
        made goes, unless something else was written into it."""
        said = self._stderr_lines()
        self._stderr.clear()
        self._stderr.extend(said)
        self._made_dir = False
        self._kept = True  # from now on, its lines are those kept here
        try:
            (run_dir / runs.STDERR).unlink()
            run_dir.rmdir()
        except OSError:
            pass

    def detach(self) -> None:
        """Let the run go on without this dashboard: stop following it; nothing stops it any more."""
        self.detached = True
        if self.follower is not None:
            self.follower.stop()

    def _stderr_lines(self) -> list[str]:
        """What the run wrote on stderr (the last 40 lines), then this object's own notes."""
        lines: list[str] = []
        if self.run_dir is not None and not self._kept:
            try:
                with open(self.run_dir / runs.STDERR, "rb") as fh:
                    fh.seek(max(self._stderr_start, fh.seek(0, os.SEEK_END) - 16384))
                    text = fh.read().decode("utf-8", "replace")
                lines = [clean(line.rstrip()) for line in text.splitlines() if line.strip()][-40:]
            except OSError:
                pass
        return lines + list(self._stderr)

    def last_error(self) -> str | None:
        """The line that says why the run failed: `gputui: error: ...`, else the last stderr line."""
        lines = self._stderr_lines()
        for line in reversed(lines):
            if line.startswith("gputui: error:"):
                return line
        return lines[-1] if lines else None

    def stop(self) -> bool:
        """Ask the run to checkpoint, tear down and exit: one SIGTERM (a second one would stop a DDP
        run at once, without its checkpoint), then its teardown is watched. False if not running."""
        if not self.running:
            return False
        assert self.proc is not None
        self.stop_requested = True
        with self._lock:
            if self._stopper is not None:
                return True
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                return False
            self._stopper = threading.Thread(target=self._see_it_end, name="training-stop", daemon=True)
            self._stopper.start()
        return True

    def shutdown(self) -> None:
        """Stop the run and wait until it is gone: its own teardown, or SIGKILL past the stop bound."""
        if self.proc is None:
            return
        self.stop()
        stopper = self._stopper
        if stopper is not None:
            stopper.join()
        elif self.proc.poll() is None:  # pragma: no cover - stop() failed on a live process
            self.proc.wait()

    def _see_it_end(self) -> None:
        """The stop's thread: say what the run waits for until it has ended; SIGKILL every process
        of the run if it is still there at the bound."""
        assert self.proc is not None and self.tree is not None
        deadline = self.clock() + self.stop_bound()
        while True:
            try:
                self.proc.wait(0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            left = deadline - self.clock()
            processes = len(self.tree.refresh())  # also remembers them, for the SIGKILL
            if left <= 0:
                self._kill(processes)
                break
            self._note(f"{self._waiting_for()} ({plural(processes, 'process')} left; "
                       f"SIGKILL in {units.duration(left, 'clock')})")
        self.tree.kill()  # anything of the run that outlived it (nothing, when it tore down)
        self._note("")

    def _waiting_for(self) -> str:
        slaves = (self.stopping or {}).get("slaves")
        if isinstance(slaves, int) and slaves > 0:
            return f"stopping: waiting for the run to release {plural(slaves, 'slave')}"
        return "stopping: waiting for the run to checkpoint and end"

    def _kill(self, processes: int) -> None:
        assert self.tree is not None
        self.killed = True
        bound = self.stop_bound()
        line = (f"gputui: error: the run had not stopped {bound:.0f} s after SIGTERM: its {plural(processes, 'process')} "
                "were killed (SIGKILL)")
        if self.cluster is not False:
            line += "; check for slaves left running with `gputui cloud ls`"
        self._stderr.append(line)
        self._note(line, log=True)
        self.tree.kill()

    def _note(self, text: str, log: bool = False) -> None:
        if text == self.progress and not log:
            return
        if not log:
            self.progress = text
        if self.on_progress is not None:
            self.on_progress(self, text, log)
