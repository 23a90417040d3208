"""The master's side of a cluster run: bring-up, attempts, teardown, in that order.

The master serves the rendezvous store itself (a TCPStore on loopback, or `master_addr:rdzv_port`),
so no node is special and losing any node never loses the rendezvous. Every node runs
torchrun with gputui's static rendezvous (`--nnodes N --rdzv-conf rank=R`, gputui.train.launch:
nothing read from the store is unpickled) and `--max-restarts R`: a dead trainer is restarted in place by
torchrun, and the ranks resume from the newest checkpoint any node holds (see
gputui.cluster.worker). A node whose torchrun is gone is replaced (a new cloud slave, or
the same host again) or dropped when at least min_nodes remain, and the group relaunched.

The parts: bringup (nodes ready), attempts (torchrun per node, monitored; relay: rank 0's
events; recovery: lost nodes), teardown (nodes, ledger, slaves, connections), stopping
(signals that never raise). While the run lives, SIGINT/SIGTERM/SIGHUP are requests: the
first stops the run (the workers checkpoint), a further one drops the nodes' grace, and
each one is answered at once with a `stopping` event saying what is being waited for.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from gputui.runs import store as runs
from gputui.cluster.attempts import Attempts, Outcome
from gputui.cluster.bringup import bring_up
from gputui.cluster.context import Phase, RunContext
from gputui.cluster.identity import RunIdentity, resume_ref
from gputui.cluster.output import Output, stderr_line
from gputui.cluster.settings import ClusterSettings, load_cluster
from gputui.cluster.stopping import Reporter, StopRequests, Stopped
from gputui.cluster.teardown import report_stop, teardown
from gputui.views.progress import View
from gputui.model.errors import UserError
from gputui.config.run import RunConfig


class ClusterRun:
    """One `gputui run` on a cluster."""

    def __init__(self, run: runs.RunDir, cfg: RunConfig, settings: ClusterSettings, view: View,
                 manager: Any = None, say: Callable[[str], None] | None = None) -> None:
        if cfg.strategy == "dataparallel":
            raise UserError(f"{settings.source}: a cluster trains with ddp across its nodes; remove "
                            "strategy = \"dataparallel\" from [run]")
        self.run, self.settings, self.view, self.say = run, settings, view, say
        self.cfg = replace(cfg, strategy="ddp", nproc=settings.nproc_per_node)
        self.manager = manager
        self.stops = StopRequests()

    def execute(self, resume: bool) -> str:
        """'done' or 'interrupted' ('stopped' when interrupted with no checkpoint to resume from:
        the line saying so is printed here). Errors are GputuiError subclasses."""
        identity = RunIdentity.of(self.run)
        log = runs.EventLog(self.run.events)
        try:
            out = Output(log, self.view, self.say, on_failure=self.stops.request)
            ctx = RunContext(self.run, identity, self.cfg, self.settings, out, self.stops, manager=self.manager)
            with self.stops.installed(), Reporter(self.stops, lambda reason, _n: report_stop(ctx, reason)):
                outcome, trained = self._run(ctx, resume)
        finally:
            log.close()
        out.raise_failure()
        return self._result(outcome, trained)

    def _run(self, ctx: RunContext, resume: bool) -> tuple[str, bool]:
        """Bring-up and attempts, then the teardown whatever happened: (outcome, whether training began)."""
        outcome = "failed"
        attempts: Attempts | None = None
        try:
            self.run.profile.write_text(self.cfg.to_toml(), encoding="utf-8")
            try:
                bring_up(ctx)
                ctx.phase = Phase.TRAINING
                if self.cfg.is_program:
                    from gputui.cluster.programrun import ProgramAttempts

                    attempts = ProgramAttempts(ctx)
                else:
                    attempts = Attempts(ctx)
                outcome = attempts.run(resume).value
            except Stopped as stop:
                outcome = Outcome.INTERRUPTED.value
                if attempts is None:
                    ctx.emit("interrupted", reason=stop.reason)
        finally:
            teardown(ctx, attempts.relay if attempts is not None else None, outcome)
        return outcome, attempts is not None

    def _result(self, outcome: str, trained: bool) -> str:
        if outcome != "interrupted" or self.run.checkpoint.is_file():
            return outcome
        if self.cfg.is_program:  # jobs.run says where the program's checkpoints are
            return outcome
        ref = resume_ref(self.run)
        if trained:
            stderr_line(f"interrupted: no checkpoint reached {self.run.path} (the nodes keep theirs); "
                        f"resume with: gputui run --resume {ref}")
        else:
            stderr_line(f"interrupted before training started: nothing to save; start it with: gputui run --resume {ref}")
        return "stopped"


def execute_cluster(run: runs.RunDir, cfg: RunConfig, resume: bool, view: View, profile: Path) -> str:
    """`gputui run` on the cluster of `profile`; 'done' or 'interrupted' (or 'stopped', see ClusterRun.execute)."""
    settings = load_cluster(profile)
    return ClusterRun(run, cfg, settings, view).execute(resume)
