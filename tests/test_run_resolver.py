"""One resolver for a run reference (`last`, a run id, a run directory): `gputui run --resume`,
`gputui runs export`, `gputui monitor --run` and the dashboard all name the same run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gputui.monitor import watches
from gputui.runs import store as runs
from gputui.model.errors import UserError
from gputui.model.paths import runs_home

from .conftest import REPO


def make_run(home: Path, name: str, written: float, started: float | None) -> Path:
    """A run directory whose events were last written at `written` (None: no start event yet)."""
    path = home / name
    path.mkdir(parents=True)
    (path / runs.PROFILE).write_text("[run]\n")
    lines = [] if started is None else [{"event": "start", "run_id": name, "time": started}]
    (path / runs.EVENTS).write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.utime(path / runs.PROFILE, (written, written))
    os.utime(path / runs.EVENTS, (written, written))
    return path


def test_last_is_the_run_written_most_recently_for_every_command(gputui_home: Path) -> None:
    home = runs_home()
    # an older run resumed after a newer one ran: the resumed one is `last` everywhere
    old = make_run(home, "20260101-100000-aaaa", written=5_000.0, started=1_000.0)
    make_run(home, "20260101-110000-bbbb", written=3_000.0, started=2_000.0)
    assert runs.find("last").path == old
    assert watches.find_run("last") == old / runs.EVENTS
    from gputui.commands import runs as runs_command

    assert "runs.find(" in Path(runs_command.__file__).read_text()


def test_ids_and_directories_resolve_and_errors_name_the_flag(gputui_home: Path, tmp_path: Path) -> None:
    home = runs_home()
    one = make_run(home, "one", written=1.0, started=1.0)
    elsewhere = make_run(tmp_path / "elsewhere", "two", written=2.0, started=2.0)
    assert runs.find("one").path == one
    assert runs.find(str(elsewhere)).path == elsewhere
    with pytest.raises(UserError, match=r"^--run nowhere: no such run"):
        watches.find_run("nowhere")
    with pytest.raises(UserError, match=r"^runs export nowhere: no such run"):
        runs.find("nowhere", flag="runs export")


def test_no_runs_yet_is_one_line(gputui_home: Path) -> None:
    with pytest.raises(UserError, match=r"^--resume last: no runs in .* yet; start one with `gputui run`$"):
        runs.find("last")


def test_no_second_last_resolver_in_the_code() -> None:
    """`last` is resolved in gputui/runs/store.py alone (a grep check: a second resolver fails here)."""
    offenders = []
    for path in (REPO / "gputui").rglob("*.py"):
        if path == REPO / "gputui" / "runs/store.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"""==\s*["']last["']|["']last["']\s*==""", line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []
