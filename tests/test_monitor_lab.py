"""`gputui monitor`'s lab view (one line per host when the GPU rows do not fit) and `--users`:
the strip's cells, unreachable hosts, n/a figures, sizes 80x24 and 200x50, sort and filter,
per-account totals and GPU-hours over rounds, and a --serve monitor off a terminal that
prints no table."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from gputui.cli import main
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState, round_to_dict
from gputui.monitor.lab import Lab, LabFilter, held_now
from gputui.sources.sim import SimSource
from gputui.views.lab import LabOptions, lab_live, lab_plain
from tests.conftest import cli_env, json_lines

REFUSED = "ssh: connect to host 10.0.0.9 port 22: Connection refused"


def gpu(index: int, util: float | None, used: float | None, user: str | None = None, total: float | None = 81920.0,
        pid: int = 4000) -> GpuSample:
    procs = () if user is None else (GpuProcess(pid=pid + index, name="python train.py", user=user,
                                                gpu_memory_mib=used),)
    return GpuSample(index, name="A100", util_pct=util, mem_used_mib=used, mem_total_mib=total, processes=procs)


def host(name: str, *gpus: GpuSample, t: float = 1000.0) -> HostSnapshot:
    return HostSnapshot(name, HostState.OK, t, duration_s=0.01, kind="ssh", gpus=tuple(gpus))


def down(name: str, t: float = 1000.0) -> HostSnapshot:
    return HostSnapshot(name, HostState.UNREACHABLE, t, kind="ssh", message=REFUSED)


def fleet(n: int, t: float = 1000.0) -> list[HostSnapshot]:
    """n hosts of 8 GPUs: host i's first i % 9 GPUs run alice's (even i) or bob's (odd i) jobs."""
    out = []
    for i in range(n):
        who = "alice" if i % 2 == 0 else "bob"
        out.append(host(f"node-{i:03d}", *(gpu(g, 95.0, 60000.0, who) if g < i % 9 else gpu(g, 0.0, 4.0)
                                           for g in range(8)), t=t))
    return out


def plain(renderable: object, width: int, height: int) -> list[str]:
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, highlight=False,
                      legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


# -- the strip and the host line -----------------------------------------------------------------


def test_a_host_line_shows_each_gpu_free_busy_idle_held_and_na() -> None:
    frame = Lab().update([host(
        "rig", gpu(0, 0.0, 4.0), gpu(1, 97.0, 70000.0, "alice"), gpu(2, 2.0, 30000.0, "bob"),
        gpu(3, None, 512.0), gpu(4, None, None), gpu(5, 50.0, None, total=None), gpu(6, 40.0, 2000.0))])
    lines = lab_plain(frame, LabOptions()).splitlines()
    assert lines[0] == "2 of 7 GPUs free on 1 host; 5 busy"
    assert lines[1].split() == ["Host", "State", "GPUs", "Free", "Util", "Memory", "Top", "account", "(GPU", "memory)"]
    # free; busy at 97%; held by bob at 2% (not free: a process runs); free with util n/a;
    # nothing known (never free); util 50% with memory n/a; 40% without a process (too busy)
    assert lines[2].split() == ["rig", "ok", "○█▁○?▅▄", "2", "free", "38%", "100/480", "GiB", "alice", "68", "GiB"]


def test_an_unreachable_host_keeps_its_gpu_count_and_says_why() -> None:
    lab = Lab()
    lab.update([host("a", gpu(0, 0.0, 4.0), gpu(1, 0.0, 4.0)), host("b", *(gpu(g, 90.0, 9000.0, "carol") for g in range(4)))])
    frame = lab.update([host("a", gpu(0, 0.0, 4.0), gpu(1, 0.0, 4.0), t=1005.0), down("b", t=1005.0), down("never")])
    text = lab_plain(frame, LabOptions())
    lines = text.splitlines()
    assert lines[0] == "2 of 6 GPUs free on 1 host; 0 busy; 4 unreachable (1 host not reached yet)"
    assert lines[3].split()[:3] == ["b", "unreachable", "----"] and lines[3].endswith(REFUSED)
    assert lines[4].split()[:3] == ["never", "unreachable", "?"] and lines[4].endswith(REFUSED)


def test_names_and_reasons_from_hosts_are_text_not_markup_or_escapes() -> None:
    evil = "[bold red]x[/]\x1b]52;c;aGk=\x07\x1b[2J"
    frame = Lab().update([host(evil, gpu(0, 0.0, 4.0, None)),
                          HostSnapshot("b", HostState.ERROR, 1.0, kind="ssh", message="boom\x1b[31m [link=x]y[/link]")])
    for out in (lab_plain(frame, LabOptions()), "\n".join(plain(lab_live(frame, LabOptions(), 24), 120, 24))):
        assert "\x1b" not in out and "\x07" not in out
        assert "[bold red]x[/]" in out and "[link=x]y[/link]" in out


# -- sizes -------------------------------------------------------------------------------------------


def test_at_80x24_the_live_view_builds_only_the_lines_that_fit() -> None:
    frame = Lab().update(fleet(40))
    lines = plain(lab_live(frame, LabOptions(), 24), 80, 24)
    assert len(lines) == 24 and all(cell_len(line) <= 80 for line in lines), "\n".join(lines)
    shown = [line for line in lines if line.startswith("node-")]
    assert len(shown) == 21 and lines[-1] == "... 19 more hosts (--filter, --hosts-sort)"
    assert lines[0] == "170 of 320 GPUs free on 36 hosts; 150 busy"


def test_at_200x50_every_host_of_40_fits_with_no_more_line() -> None:
    frame = Lab().update(fleet(40))
    lines = plain(lab_live(frame, LabOptions(), 50), 200, 50)
    assert len(lines) == 42 and not any(line.startswith("...") for line in lines)
    assert [line.split()[0] for line in lines[2:]] == [f"node-{i:03d}" for i in range(40)]
    assert lines[2 + 8].split()[2:5] == ["████████", "0", "free"]  # node-008: all 8 busy


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`gputui ARGS` with stdout a pipe and these environment variables."""
    return subprocess.run([sys.executable, "-m", "gputui", *args], capture_output=True, text=True, timeout=180,
                          env=cli_env(**env))


FLEET_LINE = r"\d+ of 80 GPUs free on \d+ hosts?; \d+ busy"


def test_off_a_terminal_lines_decides_between_the_gpu_table_and_every_host_line() -> None:
    args = ("monitor", "--once", "--sim", "10", "--sim-gpus", "8")
    small = cli(*args, COLUMNS="80", LINES="24")
    assert small.returncode == 0, small.stderr
    lines = small.stdout.splitlines()
    assert re.fullmatch(FLEET_LINE, lines[0]), small.stdout
    assert sorted(line.split()[0] for line in lines[2:] if line) == sorted(f"sim-{i}" for i in range(10))  # every host
    assert all(cell_len(line) <= 80 for line in lines), small.stdout
    big = cli(*args, COLUMNS="200", LINES="200")
    assert big.returncode == 0 and "Name / reason" in big.stdout and "GPUs free" not in big.stdout  # 84 rows fit in 200
    forced = cli(*args, "--view", "hosts", LINES="200")
    assert re.fullmatch(FLEET_LINE, forced.stdout.splitlines()[0]), forced.stdout


def test_a_terminal_of_24_rows_shows_what_fits_and_counts_the_rest() -> None:
    """The real path: rich's live view on a pseudo-terminal of 80x24."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**cli_env(), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "monitor", "--sim", "40", "--sim-gpus", "8", "--count", "2",
                             "--interval", "0.05"], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            assert ready, f"no output from the monitor within 120 s: {out[-2000:]!r}"
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        assert proc.wait(60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode())
    last = text.split("gputui monitor  ")[-1].replace("\r", "").splitlines()  # the last frame
    assert len(last) <= 24 and last[-1].startswith("... 20 more hosts (--filter, --hosts-sort)"), text[-3000:]
    assert "GPUs free on" in last[1] and sum(line.startswith("sim-") for line in last) == 20


# -- sort and filter ---------------------------------------------------------------------------------


def test_sort_and_filter_choose_and_order_the_host_lines() -> None:
    frame = Lab().update([*fleet(12), down("gone")])
    by_free = [ln.split()[0] for ln in lab_plain(frame, LabOptions("free")).splitlines()[2:]]
    assert by_free[:2] == ["node-000", "node-009"] and by_free[-1] == "gone"  # 8 free each; unreachable last
    bob = lab_plain(frame, LabOptions("name", LabFilter.parse("user:bob"))).splitlines()
    assert [ln.split()[0] for ln in bob[2:]] == ["node-001", "node-003", "node-005", "node-007", "node-011"]
    assert bob[0].endswith("[filter 'user:bob': 5 of 13 hosts]")
    assert [ln.split()[0] for ln in lab_plain(frame, LabOptions("name", LabFilter.parse("down"))).splitlines()[2:]] == ["gone"]


def test_the_lab_flags_through_the_cli_with_a_recorded_unreachable_host(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "round.jsonl"
    record.write_text(json.dumps(round_to_dict([*fleet(3), down("gone")], 1000.0)) + "\n")
    assert main(["monitor", "--once", "--replay", str(record), "--filter", "down"]) == 0  # implies the lab view
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "21 of 24 GPUs free on 3 hosts; 3 busy; 0 unreachable (1 host not reached yet)  [filter 'down': 1 of 4 hosts]"
    assert [ln.split()[:2] for ln in out[2:] if ln] == [["gone", "unreachable"]] and out[2].endswith(REFUSED)
    assert main(["monitor", "--once", "--replay", str(record), "--hosts-sort", "util"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[2:] if ln]
    assert names == ["node-002", "node-001", "node-000", "gone"]  # busiest first, unreachable last


@pytest.mark.parametrize(("args", "words"), [
    (["--view", "gpus", "--filter", "free"], "drop --view gpus"),
    (["--json", "--view", "hosts"], "--json prints every host"),
    (["--users", "--filter", "free"], "--users prints its own view"),
    (["--users", "--procs"], "--users prints its own view"),
])
def test_flags_that_do_not_go_together_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    assert main(["monitor", "--once", "--sim", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: error: ") and words in err and err.count("\n") == 1


# -- --users -----------------------------------------------------------------------------------------


def test_users_json_is_the_fleets_accounts_most_memory_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--users", "--json", "--sim", "6", "--sim-gpus", "4", "--seed", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"version", "time", "since", "users"} and doc["version"] == 1
    expected = held_now(SimSource(6, 4, seed=3).poll())  # the same seed: the same first round
    got = {u["user"]: (u["gpus"], u["memory_mib"], u["hosts"], u["processes"]) for u in doc["users"]}
    assert got == {u: (g, round(m, 1), h, p) for u, (g, m, h, p) in expected.items()} and got
    memory = [u["memory_mib"] for u in doc["users"]]
    assert memory == sorted(memory, reverse=True)
    assert all(u["gpu_hours_today"] == 0 for u in doc["users"])  # one poll: no time has passed


def test_users_table_has_a_row_per_account(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--users", "--sim", "6", "--sim-gpus", "4", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = held_now(SimSource(6, 4, seed=3).poll())
    assert re.match(rf"{len(expected)} accounts; GPU-hours today counted from \d\d:\d\d:\d\d \(this monitor's start\)",
                    lines[0]), lines
    assert lines[1].split() == ["Account", "GPUs", "GPU", "memory", "GPU-hours", "Hosts", "Procs"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if ln}
    assert set(rows) == set(expected)
    for user, (gpus, _memory, hosts, procs) in expected.items():
        assert (int(rows[user][1]), int(rows[user][-2]), int(rows[user][-1])) == (gpus, hosts, procs)


def test_gpu_hours_accumulate_over_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--users", "--json", "--sim", "6", "--sim-gpus", "2", "--seed", "3", "--count", "3", "--interval", "0.4"]) == 0
    docs = json_lines(capsys.readouterr().out)
    assert len(docs) == 3 and len({d["since"] for d in docs}) == 1
    hours = [{u["user"]: u["gpu_hours_today"] for u in d["users"]} for d in docs]
    busy = [u["user"] for u in docs[-1]["users"] if u["gpus"]]
    assert busy, docs[-1]
    for user in busy:
        assert hours[0].get(user, 0) == 0 and 0 < hours[1][user] < hours[2][user], hours


def test_gpu_hours_by_the_clock_of_the_polls() -> None:
    lab = Lab()
    for minute in range(3):
        t = 1_000_000.0 + 60 * minute
        frame = lab.update([host("a", gpu(0, 90.0, 1000.0, "alice"), gpu(1, 90.0, 1000.0, "alice"), t=t)], now=t)
    (alice,) = frame.users
    assert alice.gpu_hours == pytest.approx(2 * 120 / 3600)


# -- no table nobody reads ---------------------------------------------------------------------------


def test_serve_off_a_terminal_prints_no_table_unless_asked() -> None:
    quiet = cli("monitor", "--serve", "0", "--sim", "64", "--sim-gpus", "8", "--count", "3", "--interval", "0.05")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr.startswith("gputui: serving metrics on http://127.0.0.1:")
    assert quiet.stderr.count("\n") == 1  # one start line
    asked = cli("monitor", "--serve", "0", "--sim", "2", "--count", "2", "--interval", "0.05", "--view", "gpus")
    assert asked.returncode == 0 and asked.stdout.count("sim-1") == 2  # a table per round, as asked
    as_json = cli("monitor", "--serve", "0", "--sim", "64", "--sim-gpus", "8", "--count", "2", "--interval", "0.05",
                  "--json")
    docs = json_lines(as_json.stdout)  # nothing but JSON lines
    assert len(docs) == 2 and all(len(d["hosts"]) == 64 for d in docs)
