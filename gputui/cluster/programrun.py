"""A cluster run of the user's own program: the attempts of gputui.cluster.attempts, with the
program's contract (docs/program.md, docs/clusters.md "Your own program on a cluster").

Each node runs `python -m gputui.cluster.node --program-dir DIR -- LAUNCHER-ARGS --no-python
PROGRAM ARGS` in its copy of the workdir (gputui's static rendezvous; torchrun's own restarts
off: the master relaunches). DIR is the node's run directory under the cluster's remote_dir
(the master's own node: `<run dir>/node-master`). The node relays what rank 0 reports as
`metrics` lines; the master writes them to its events.jsonl with its own clock, and every
node's output to `<run dir>/nodes/NAME/output.log`.

Checkpoints (gputui.cluster.checkpoints): pulled from rank 0's node when a report says
`checkpoint=True`, every `[run] checkpoint_pull_s`, and once the group has exited (a stop, the
end); pushed to every node of an attempt that resumes (a relaunch, a replacement, `--resume`),
which then gets GPUTUI_RESUME=1. A node that is lost (its connection or supervisor gone) makes a
relaunch on the nodes left or replaced; a program that fails (a non-zero exit, the node still
there) is the run's error.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from pathlib import Path
from typing import Any

from gputui.cluster import checkpoints as ckpts
from gputui.cluster.attempts import Attempts, Outcome, put_secret
from gputui.cluster.context import RunContext
from gputui.cluster.identity import resume_ref
from gputui.cluster.members import KILL_MARGIN_S, Node
from gputui.cluster.node import NODE_TAG
from gputui.cluster.nodeprog import SETTINGS_FILE, STOP_NOTICE_S, settings_text
from gputui.cluster.procs import LocalNode, RemoteNode, Rendezvous
from gputui.cluster.stopping import Stopped
from gputui.cluster.worker import EVENT_TAG
from gputui.model import events, outside
from gputui.model.errors import GputuiError
from gputui.model.lines import OUTPUT_LINE
from gputui.model.text import clean, clean_tree
from gputui.model.units import plural
from gputui.runs.provenance import code_version
from gputui.runs.store import CHECKPOINTS, OUTPUT

MASTER_DIR = "node-master"  # the master's own node's run directory, inside the run directory
CODE_DIR = "code"  # in a node's run directory: its copy of the workdir
TAIL_LINES = 400  # a node's last output lines kept for its failure's message
# torchrun's line when a rank fails: "E1127 ... api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 19759) of binary: python"
TORCHRUN_FAILED = re.compile(r"\] failed \(exitcode: (-?\d+)\) local_rank: \d+")


class ProgramRelay:
    """The nodes' lines: rank 0's node's metrics (and any node's all_ranks reports) into the run,
    every node's output into its output.log."""

    def __init__(self, ctx: RunContext, clock: Any) -> None:
        self.ctx, self.clock = ctx, clock
        self.rank0: str | None = None
        self.last_step = 0  # the furthest step reported in the run
        self.step: int | None = None
        self.epoch: int | None = None
        self.checkpoint_due = False  # a report said checkpoint=True since the last pull
        self.checkpoint_step: int | None = None  # the step of that report
        self.tallies: dict[str, outside.Tally] = {}
        self.started = True
        self.last_kind: str | None = None
        self.stopping: list[str] = []  # nodes whose supervisor was signalled there (a spot notice, the budget guard)
        self.lines: dict[str, deque[str]] = {}  # each node's last output lines (what a failure says)
        from gputui.jobs.program import OutputMetrics, Pacer

        self.outputs = OutputMetrics(ctx.cfg.metrics_regex)  # [run] metrics_regex, on rank 0's node's lines
        self.pacer = Pacer()

    def failure(self, node: Node, code: int) -> tuple[int, str]:
        """What a node's failed run says: the program's own exit code and its last line before
        torchrun's report of the failure (torchrun itself exits 1 with a traceback of its own)."""
        lines = list(self.lines.get(node.name, ()))
        for i, line in enumerate(lines):
            found = TORCHRUN_FAILED.search(line)
            if found:
                said = [ln.strip() for ln in lines[:i] if ln.strip()]
                return int(found.group(1)), (said[-1] if said else "no output")
        return code, node.proc.last_error() if node.proc is not None else "no output"

    def line(self, node: Node, text: str) -> None:
        if text.startswith(EVENT_TAG):
            tally = self.tallies.setdefault(node.name, outside.Tally(f"node {node.name}"))
            raw = tally.line(text[len(EVENT_TAG):])
            warning = tally.warning()
            if warning is not None:
                self.ctx.emit("warning", node=node.name, reason="bad_line", message=clean(warning, 300))
            if raw is not None:
                self._event(node, events.typed(clean_tree(raw)))
            return
        if text.startswith(NODE_TAG):
            said = _json_object(text[len(NODE_TAG):])
            if said.get("stopping") is not None and node.name not in self.stopping:
                self.stopping.append(node.name)
            return
        line = node.keep_output(text)
        self.lines.setdefault(node.name, deque(maxlen=TAIL_LINES)).append(line)
        if node.name != self.rank0:
            return
        # On the terminal, as on one machine; a slave's bytes are data (no escape reaches a terminal).
        self.ctx.out.program(clean(line, OUTPUT_LINE), "\r" if text.endswith("\r") else "\n")
        if self.outputs.patterns:  # a program that only prints, as on one machine
            record = self.outputs.match(line)
            if record is not None:
                self._paced(self.pacer.add(record, time.monotonic()))

    def tick(self, flush: bool = False) -> None:
        """The metrics that metrics_regex found and the pacer held back, once they are due; the
        view's own tick (the output lines it holds, its clock)."""
        self._paced(self.pacer.due(time.monotonic(), flush))
        self.ctx.out.tick()

    def _paced(self, batch: list[tuple[Any, int]]) -> None:
        for record, count in batch:
            self._metrics(dict(values=record.values, step=record.step, epoch=record.epoch,
                               elapsed_s=self.clock.elapsed(), source="output", merged=count if count > 1 else None))

    def _event(self, node: Node, raw: dict[str, Any]) -> None:
        kind = raw.get("event")
        if kind == "warning":
            self.ctx.emit("warning", node=node.name, reason="bad_report", message=clean(str(raw.get("message")), 300))
            return
        if kind != "metrics":
            return
        rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
        if node.name != self.rank0 and rank is None:
            return  # another node's rank 0 of its own: only the group's rank 0 speaks for the run
        values = raw.get("values") if isinstance(raw.get("values"), dict) else {}
        step = raw.get("step") if isinstance(raw.get("step"), int) else None
        epoch = raw.get("epoch") if isinstance(raw.get("epoch"), int) else None
        fields: dict[str, Any] = dict(step=step, epoch=epoch, values=values,
                                      elapsed_s=self.clock.elapsed(outside.number(raw.get("time"))),
                                      source="report", rank=rank)
        if isinstance(raw.get("merged"), int) and raw["merged"] > 1:
            fields["merged"] = raw["merged"]
        if raw.get("checkpoint") is True and rank is None:
            fields["checkpoint"] = True
            self.checkpoint_due = True
            self.checkpoint_step = step if step is not None else self.step
        self._metrics(fields)

    def _metrics(self, fields: dict[str, Any]) -> None:
        """A metrics event of the run; one of the group's (no `rank`) moves its step and epoch."""
        step, epoch = fields.get("step"), fields.get("epoch")
        if fields.get("rank") is None:
            if step is not None:
                self.step = step
                self.last_step = max(self.last_step, step)
            if epoch is not None:
                self.epoch = epoch
        self.ctx.out.write(events.make("metrics", **{k: v for k, v in fields.items() if v is not None}))

    def node_lost(self) -> None:
        pass

    def new_attempt(self) -> None:
        self.checkpoint_due = False
        self.stopping.clear()


class ProgramAttempts(Attempts):
    """Attempts of a program run until one ends it; checkpoints pulled and pushed."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        from gputui.jobs.program import Clock

        self.clock = Clock(before_s=0.0)
        self.relay = ProgramRelay(ctx, self.clock)  # type: ignore[assignment]
        self.prelay: ProgramRelay = self.relay  # type: ignore[assignment]
        self.pulled = ckpts.Pulled.load(ctx.run.path)
        self.last_pull = time.monotonic()
        self.exits: dict[str, int] = {}
        self.shipped: set[str] = set()
        self.code_files: Any = None  # the workdir's files to send, listed (and size-checked) once

    @property
    def checkpoint_dir(self) -> Path:
        return self.ctx.run.path / CHECKPOINTS

    # -- the run ---------------------------------------------------------------------------
    def run(self, resume: bool) -> Outcome:
        from gputui.jobs.program import command_text, last_elapsed

        ctx, cfg = self.ctx, self.ctx.cfg
        self.clock.before_s = last_elapsed(ctx.run.events) if resume else 0.0
        self.checkpoint_dir.mkdir(mode=0o700, exist_ok=True)
        workdir = Path(cfg.workdir or ".").expanduser().resolve()
        start: dict[str, Any] = dict(
            run_id=ctx.run.run_id, run_dir=str(ctx.run.path), program=command_text(cfg.command), workdir=str(workdir),
            device=cfg.device, strategy="ddp", world_size=len(ctx.group) * ctx.settings.nproc_per_node, resumed=resume,
            direction=cfg.direction, nodes=len(ctx.group), nproc_per_node=ctx.settings.nproc_per_node)
        if cfg.objective:
            start["objective"] = cfg.objective
        version = code_version(workdir)  # the master's copy, which every node gets (gputui.runs.provenance)
        if version is not None:
            start.update(version.fields())
        before = _last_step(ctx.run.events) if resume else 0
        ctx.out.write(events.make("start", **start))
        if resume:
            self.prelay.last_step = before
            self._say_resumed()
        attempt = 0
        while True:
            outcome = self._attempt(attempt, resume=resume or attempt > 0)
            if outcome is not Outcome.RELAUNCH:
                return self._end(outcome)
            self._pull_after_attempt()
            why = "a node was lost" if self.lost else "a node was told to stop (a spot notice or the budget guard)"
            self.lost.update(self.prelay.stopping)  # a node told to stop goes (its slave is being taken back)
            attempt += 1
            if attempt > ctx.settings.max_restarts:
                raise GputuiError(f"cluster run stopped {attempt} times; giving up (max_restarts "
                                  f"{ctx.settings.max_restarts}); resume later with: gputui run --resume {resume_ref(ctx.run)}")
            try:
                self.recovery.refill(self.lost)
            except Stopped:
                return self._end(Outcome.INTERRUPTED)
            if ctx.stops.requested:
                return self._end(Outcome.INTERRUPTED)
            ctx.emit("relaunch", attempt=attempt, from_step=self.pulled.step or 0, reason=why,
                     message=f"relaunching on {plural(len(ctx.group), 'node')} ({why}), resuming from the last "
                     "pulled checkpoint")
            self._say_resumed()

    def _say_resumed(self) -> None:
        ctx, relay = self.ctx, self.prelay
        has = self.pulled.files and ckpts_present(self.checkpoint_dir)
        from_step = (self.pulled.step or 0) if has else 0
        lost = max(0, relay.last_step - from_step)
        fields: dict[str, Any] = dict(from_step=from_step, lost_steps=lost, nodes=len(ctx.group))
        if has:
            fields["checkpoint"] = str(self.checkpoint_dir)
        where = f"the checkpoint of step {from_step} ({self.checkpoint_dir})" if has else "the start (no checkpoint pulled)"
        ctx.emit("resumed", **fields, message=f"resuming from {where} on {plural(len(ctx.group), 'node')}; "
                 f"{plural(lost, 'step')} redone")

    def _end(self, outcome: Outcome) -> Outcome:
        ctx, relay = self.ctx, self.prelay
        relay.tick(flush=True)
        self._pull_after_attempt()
        code = max(self.exits.values(), default=0) if self.exits else 0
        elapsed = self.clock.elapsed()
        if outcome is Outcome.DONE:
            ctx.out.write(events.make("done", **{k: v for k, v in dict(exit_code=0, elapsed_s=elapsed,
                                                                         step=relay.step).items() if v is not None}))
            return outcome
        fields: dict[str, Any] = dict(reason=ctx.stops.reason or "interrupted", step=relay.step, epoch=relay.epoch,
                                      elapsed_s=elapsed, exit_code=code)
        if self.pulled.files and ckpts_present(self.checkpoint_dir):
            fields["checkpoint"] = str(self.checkpoint_dir)
            fields["lost_steps"] = max(0, relay.last_step - (self.pulled.step or 0))
        ctx.out.write(events.make("interrupted", **{k: v for k, v in fields.items() if v is not None}))
        return outcome

    # -- one attempt -----------------------------------------------------------------------
    def _attempt(self, attempt: int, resume: bool) -> Outcome:
        self.exits.clear()
        return super()._attempt(attempt, resume)

    def _start(self, node: Node, rank: int, rdzv: Rendezvous, resume: bool) -> None:
        from gputui.train.rdzv import TOKEN_ENV, TOKEN_FILE_ENV

        ctx, cfg = self.ctx, self.ctx.cfg
        if rank == 0:
            self.prelay.rank0 = node.name
        if node.log is None:
            folder = ctx.run.path / "nodes" / node.name
            folder.mkdir(parents=True, exist_ok=True)
            node.log = open(folder / OUTPUT, "a", encoding="utf-8")
        settings = settings_text(dict(cfg.env), resume, dict(cfg.trial))
        workdir = Path(cfg.workdir or ".").expanduser().resolve()
        if node.kind == "master":
            run_dir = ctx.run.path / MASTER_DIR
            run_dir.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(run_dir / SETTINGS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(settings)
            if resume:
                ckpts.push(None, self.checkpoint_dir, str(run_dir / CHECKPOINTS))
            args = rdzv.program_args(rank, node.address, self._endpoint(node), cfg.command)
            node.proc = LocalNode(node.name, ctx.items, args, {**rdzv.env, TOKEN_ENV: rdzv.token}, cfg.stop_grace_s,
                                  flags=["--program-dir", str(run_dir)], cwd=str(workdir))
            return
        assert node.conn is not None and node.boot is not None
        remote = node.boot.run_dir(ctx.identity.slave_name)
        code_dir = f"{remote}/{CODE_DIR}"
        if node.name not in self.shipped:  # the code, then [run] setup: once per node and run (codesync)
            self._ship(node, workdir, code_dir)
            self.shipped.add(node.name)
        from gputui.cluster.attempts import TOKEN_FILE

        token_file = f"{remote}/{TOKEN_FILE}"
        put_secret(node.conn, rdzv.token, token_file)
        put_secret(node.conn, settings, f"{remote}/{SETTINGS_FILE}")
        if resume:
            ckpts.push(node.conn, self.checkpoint_dir, f"{remote}/checkpoints")
        env = {**rdzv.env, "GPUTUI_HOME": node.boot.home, TOKEN_FILE_ENV: token_file}
        if node.kind == "cloud" and os.environ.get("GPUTUI_IMDS_URL"):
            env["GPUTUI_IMDS_URL"] = os.environ["GPUTUI_IMDS_URL"]
        args = rdzv.program_args(rank, node.address, self._endpoint(node), cfg.command)
        node.proc = RemoteNode(node.name, ctx.items, node.conn, node.boot.venv_python, code_dir, args, env,
                               cfg.stop_grace_s, spot_watcher=node.kind == "cloud", extra_flags=["--program-dir", remote])

    def _ship(self, node: Node, workdir: Path, code_dir: str) -> None:
        """The workdir onto `node` (only what changed since its last sync there; .gitignore and
        [run] sync_exclude honoured), then [run] setup in its venv when the setup files changed;
        one `node` event says what was sent."""
        from gputui.cluster import codesync

        assert node.conn is not None and node.boot is not None
        cfg = self.ctx.cfg
        if self.code_files is None:
            self.code_files = codesync.workdir_files(workdir, cfg.sync_exclude)
            codesync.check_size(self.code_files, cfg.sync_max_mb)
        stats = codesync.sync_workdir(node.conn, self.code_files, workdir, code_dir)
        log = self.ctx.run.path / "nodes" / node.name / OUTPUT
        ran = codesync.run_setup(node.conn, cfg.setup, cfg.setup_files, stats.code_dir, f"{node.boot.base}/venv", log,
                                 check=self._check_stop)
        setup = "; [run] setup ran" if ran else ("; [run] setup already done" if cfg.setup else "")
        self.ctx.emit("node", node=node.name, kind="code", message=(
            f"{node.name}: code {plural(stats.sent_files, 'file')} sent ({stats.sent_bytes / 1e6:.1f} MB), "
            f"{stats.unchanged_files} unchanged, {stats.removed_files} removed in {stats.seconds:.2f} s{setup}"))

    def _check_stop(self) -> None:
        if self.ctx.stops.requested:
            raise GputuiError("stopped during [run] setup")

    def _monitor(self) -> Outcome:
        ctx, group = self.ctx, self.ctx.group
        running = {n.name for n in group if n.proc is not None}
        stop_sent = urgent_sent = False
        overdue_s = ctx.cfg.stop_grace_s + STOP_NOTICE_S + KILL_MARGIN_S
        while running:
            if ctx.stops.requested and not stop_sent:
                stop_sent = True
                group.stop()
            if self.prelay.stopping and not stop_sent and not ctx.stops.requested:
                stop_sent = True
                names = ", ".join(self.prelay.stopping)
                ctx.emit("stopping", reason="node_signalled", processes=len(group.running()), slaves=0,
                         message=f"stopping: {names} was told to stop (a spot notice or the budget guard): every "
                         "node's program is asked to save and exit, then the run goes on from the pulled checkpoint")
                group.stop()
            if ctx.stops.urgent and not urgent_sent:
                urgent_sent = True
                group.stop(now=True)
            if group.overdue(overdue_s) and not group.killed:
                group.kill()
            self.pump(running)
            self.prelay.tick()
            if running and (self.prelay.checkpoint_due or
                            time.monotonic() - self.last_pull > ctx.cfg.checkpoint_pull_s):
                self.pull_checkpoint()
        return self._program_outcome()

    def _exited(self, node: Node, code: int) -> None:
        ctx = self.ctx
        self.exits[node.name] = code
        if ctx.stops.requested or code == 0:
            return
        if self._gone(node, code):
            self.lost.add(node.name)
            ctx.emit("node_lost", node=node.name, exit_code=code, step=self.prelay.last_step,
                     reason=node.proc.last_error() if node.proc else "gone",
                     message=f"{node.name} lost at step {self.prelay.last_step} (exit {code}); stopping the other "
                     "nodes to relaunch from the last pulled checkpoint")
        if ctx.group.stop_asked_at is None:
            ctx.group.stop()  # the others cannot go on without it

    @staticmethod
    def _gone(node: Node, code: int) -> bool:
        """Whether the node itself is gone (its connection or supervisor), not the program failing."""
        return code < 0 or (node.conn is not None and not node.conn.connected)

    def _program_outcome(self) -> Outcome:
        ctx = self.ctx
        if ctx.stops.requested:
            return Outcome.INTERRUPTED
        for node in ctx.group:
            code = self.exits.get(node.name)
            if code is not None and code != 0 and node.name not in self.lost and self._gone(node, code):
                self.lost.add(node.name)
        if self.lost or self.prelay.stopping:
            return Outcome.RELAUNCH
        failed = [(n, self.exits[n.name]) for n in ctx.group if self.exits.get(n.name, 0) != 0]
        if not failed:
            return Outcome.DONE
        first = next(((n, c) for n, c in failed if n.name == self.prelay.rank0), failed[0])
        node, code = first
        code, last = self.prelay.failure(node, code)
        last = clean(last, 300)
        program = Path(ctx.cfg.command[0]).name if ctx.cfg.command else "program"
        message = f"{program} exited with code {code} on {node.name}: {last}"
        ctx.out.write(events.make("error", message=message, exit_code=code, node=node.name,
                                  elapsed_s=self.clock.elapsed()))
        raise GputuiError(message)

    # -- checkpoints -----------------------------------------------------------------------
    def _pull_after_attempt(self) -> None:
        node = self.ctx.group.find(self.prelay.rank0)
        if node is not None and node.name not in self.lost and (node.conn is None or node.conn.connected):
            self.pull_checkpoint()

    def pull_checkpoint(self) -> None:
        """Rank 0's node's checkpoint directory into the run's (only what changed); a warning and
        the previous one kept when it is refused or fails."""
        ctx, relay = self.ctx, self.prelay
        due, step = relay.checkpoint_due, relay.checkpoint_step
        relay.checkpoint_due = False
        self.last_pull = time.monotonic()
        node = ctx.group.find(relay.rank0)
        if node is None:
            return
        if node.kind == "master":
            source: Any = ckpts.LocalSource(ctx.run.path / MASTER_DIR / CHECKPOINTS)
        elif node.conn is not None and node.boot is not None:
            source = ckpts.RemoteSource(node.conn, f"{node.boot.run_dir(ctx.identity.slave_name)}/{CHECKPOINTS}")
        else:
            return
        t0 = time.perf_counter()
        try:
            got = ckpts.pull(source, self.checkpoint_dir, self.pulled)
        except (GputuiError, OSError) as exc:
            why = clean(str(exc) or type(exc).__name__, 300)
            kept = (f"the checkpoint {_of_step(self.pulled.step)} is kept" if self.pulled.files
                    else "no checkpoint was pulled before")
            ctx.emit("warning", node=node.name, reason="checkpoint_refused",
                     message=f"checkpoint from {node.name} not pulled: {why}; {kept}")
            return
        if got is None:
            return
        pulled, files, size = got
        pulled.step = step if due and step is not None else relay.step
        pulled.node = node.name
        self.pulled = pulled
        pulled.save(ctx.run.path)
        ctx.emit("checkpoint_pulled", node=node.name, step=pulled.step, files=files, bytes=size,
                 path=str(self.checkpoint_dir), seconds=round(time.perf_counter() - t0, 3),
                 message=f"checkpoint {_of_step(pulled.step)} pulled from {node.name} ({plural(files, 'file')} changed, "
                 f"{size} bytes)")


def _of_step(step: int | None) -> str:
    """Which step a pulled checkpoint is of, in words: a program that checkpoints without saying
    so, before its first report, has none."""
    return f"of step {step}" if step is not None else "(before any step was reported)"


def _json_object(text: str) -> dict[str, Any]:
    """A node supervisor's tagged line (data from a slave): a JSON object, or {} (the one parser of
    outside text, bounded)."""
    from gputui.model import outside

    try:
        return outside.parse_object(text, 4096)
    except outside.Refused:
        return {}


def ckpts_present(path: Path) -> bool:
    from gputui.jobs.program import wrote_checkpoint

    return wrote_checkpoint(path)


def _last_step(path: Path) -> int:
    """The furthest step the run's events reached (a resumed run's steps lost are counted from it)."""
    from gputui.runs import store as runs

    last = 0
    for event in runs.iter_events(path):
        step = event.get("step")
        if event.get("event") in ("metrics", "interrupted") and isinstance(step, int) and not isinstance(step, bool) \
                and "rank" not in event:
            last = max(last, step)
    return last
