"""A program sweep's code on its SSH hosts and cloud slaves: the profile's `workdir` goes to each
host once per sweep (gputui.cluster.codesync: only what changed since that host's last sync, the
`.gitignore` of a git work tree and `[run] sync_exclude` honoured, never outside remote_dir), to
`<remote_dir>/runs/sweep-NAME/code`, and `[run] setup` runs there once in the host's gputui venv
(again only when its setup files change). Every trial of the sweep on that host then runs the
program in that directory (gputui.sweep.remote rewrites the trial's workdir), its run directory
beside it (`runs/sweep-NAME/trial-N`).

`program_code` lists the files and checks `[run] sync_max_mb` before any slot starts, here or on
a host: over the cap, the sweep is one line naming the largest files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.model.errors import GputuiError, UserError

CODE = "code"  # in the sweep's directory on a host: its copy of workdir


@dataclass(frozen=True)
class ProgramCode:
    """What a program sweep sends to each of its hosts: the workdir's files, `[run] setup`, and
    where each host's setup output is kept (`<logs>/HOST-setup.log`)."""

    workdir: Path
    files: Any  # gputui.cluster.codesync.CodeFiles
    setup: str | None
    setup_files: tuple[str, ...]
    logs: Path

    def log(self, host: str) -> Path:
        return self.logs / f"{host}-setup.log"


@dataclass(frozen=True)
class Shipped:
    """The code on one host: its directory there, what the sync did, whether setup ran."""

    code_dir: str
    stats: Any  # gputui.cluster.codesync.SyncStats
    setup_ran: bool


def runs_elsewhere(profile: Any) -> bool:
    """Whether a profile's sweep has slots off this machine ([[hosts]] or [cloud])."""
    return bool(profile.tables.get("hosts")) or "cloud" in profile.tables


def program_code(profile: Any, spec: Any, logs: Path) -> ProgramCode | None:
    """The code a program sweep sends to its hosts, its size checked (a UserError in one line);
    None for the built-in nets' sweeps and for sweeps on this machine alone."""
    from gputui.cluster.codesync import check_size, workdir_files

    if not spec.of_program or not runs_elsewhere(profile):
        return None
    run = profile.run.resolve()  # the [run] keys with their defaults (sync_max_mb, setup_files)
    where = f"{profile.path or 'profile'}: sweep {spec.name}"
    workdir = Path(run.workdir or ".").expanduser()
    if not workdir.is_dir():
        raise UserError(f"{where}: {workdir}: the program's workdir is not a directory (set [run] workdir)")
    files = workdir_files(workdir, run.sync_exclude)
    try:
        check_size(files, run.sync_max_mb)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return ProgramCode(workdir, files, run.setup, tuple(run.setup_files), logs)


def code_dir(base: str, sweep: str) -> str:
    """The sweep's code directory on a host whose gputui lives in `base` (its remote_dir)."""
    return f"{base}/runs/sweep-{sweep}/{CODE}"


def ship(conn: Any, boot: Any, code: ProgramCode, sweep: str) -> Shipped:
    """Sync the code to one bootstrapped host and run `[run] setup` there; a GputuiError naming
    the host when either fails."""
    from gputui.cluster.codesync import run_setup, sync_workdir

    from gputui.model.paths import private_dir

    try:
        if code.setup:
            private_dir(code.logs)
        stats = sync_workdir(conn, code.files, code.workdir, code_dir(boot.base, sweep), boot.base)
        ran = run_setup(conn, code.setup, code.setup_files, stats.code_dir, f"{boot.base}/venv", code.log(conn.name))
    except UserError:
        raise
    except OSError as exc:  # an SFTP failure on the way
        raise GputuiError(f"host {conn.name}: the program's code could not be sent ({exc})") from None
    return Shipped(stats.code_dir, stats, ran)
