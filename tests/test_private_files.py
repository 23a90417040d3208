"""Another account cannot read what gputui keeps: under a umask of 022, every directory gputui
makes is 0700 and every file 0600 (runs, sweeps, the ledger, SQLite's -wal/-shm, the slaves'
remote directory); what an older gputui left 0755/0644 is tightened on first use; the sweeps'
study keeps no webhook secret; a failed webhook never prints its user:password; local sweep
workers get no credentials. CSV exports outside gputui's directories keep the user's umask."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from gputui import cli
from gputui.model import paths
from gputui.monitor.alerts import AlertEngine, AlertSettings, Notifier
from tests.cluster_fixture import ClusterNodes, cluster_nodes, cluster_wheel, trust  # noqa: F401 - fixtures
from tests.conftest import run_cli
from tests.proc_support import wait_until
from tests.test_alerts import Hook, host

SECRET = "hunter2-T0B0XYZsecrettoken"
WEBHOOK = f"http://alice:{SECRET}@127.0.0.1:9/services/{SECRET}"
WAIT = 240  # s: a tiny sweep on a slow, busy 2-core machine


@pytest.fixture(autouse=True, scope="module")
def open_umask() -> Iterator[None]:
    """The usual umask, under which files are 0644 and directories 0755 unless gputui says otherwise
    (set before the module's sshd starts, so the slaves' shells have it too)."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def modes(top: Path) -> dict[str, str]:
    """Every directory and file under `top` (and `top`) with its mode, e.g. {'runs/x': '0o755'}."""
    found = {".": oct(stat.S_IMODE(top.stat().st_mode))}
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                found[str(path.relative_to(top))] = oct(stat.S_IMODE(path.stat().st_mode))
    return found


def not_private(top: Path) -> dict[str, str]:
    """What under `top` is not 0700 (a directory) or 0600 (a file)."""
    return {name: mode for name, mode in modes(top).items()
            if mode != ("0o700" if (top / name).is_dir() else "0o600")}


def profile(tmp_path: Path, data: Path, extra: str = "") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'[run]\nmodel = "fast"\ndevice = "cpu"\ndata = "{data}"\nepochs = 1\n\n'
                    f'[alerts]\ngpu_temperature_c = 85\nwebhook = "{WEBHOOK}"\n{extra}')
    return path


def test_a_run_leaves_only_private_directories_and_files(small_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    done = run_cli("run", "--profile", str(profile(tmp_path, small_data)), "--json")
    assert done.returncode == 0, done.stderr
    assert (gputui_home / "runs").is_dir() and any((gputui_home / "runs").glob("*/ckpt.pt"))
    assert not_private(gputui_home) == {}


def test_a_sweep_leaves_only_private_files_and_keeps_no_webhook_secret(small_data: Path, tmp_path: Path,
                                                                       gputui_home: Path) -> None:
    path = profile(tmp_path, small_data, '\n[sweep]\nthreads = 1\ntrials = 2\nworkers = 1\npruner = "none"\n'
                                         'lr = [1e-3, 3e-2]\n')
    done = run_cli("sweep", str(path), "--json", timeout=WAIT)
    assert done.returncode == 0, done.stderr
    db = gputui_home / "sweeps" / "sweeps.db"
    assert db.is_file() and any((gputui_home / "sweeps" / "s").glob("trial-*/profile.toml"))
    assert not_private(gputui_home) == {}
    holding = [str(p) for p in gputui_home.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holding == []  # not in sweeps.db (nor its -wal), not in any trial's profile.toml


def test_a_resumed_sweep_takes_the_webhook_from_its_profile_or_says_it_goes_without(
        small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.monitor.alerts import alert_settings
    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    path = profile(tmp_path, small_data, '\n[sweep]\ntrials = 2\nlr = [1e-3, 3e-2]\n')
    studies.create(load_spec(path)[1])
    kept = studies.load("s")[0].user_attrs[studies.PROFILE_ATTR]
    assert SECRET not in kept and "[alerts]" in kept
    settings = alert_settings(studies.load("s")[1])
    assert settings is not None and settings.webhook == WEBHOOK and settings.gpu_temperature_c == 85
    assert capsys.readouterr().err == ""
    path.unlink()
    settings = alert_settings(studies.load("s")[1])
    assert settings is not None and settings.webhook is None and settings.gpu_temperature_c == 85
    note = capsys.readouterr().err.splitlines()
    assert len(note) == 1 and "[alerts] webhook" in note[0] and "goes on without it" in note[0]


def test_a_study_an_older_gputui_kept_with_its_secret_loses_it_on_first_load(small_data: Path, tmp_path: Path) -> None:
    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    path = profile(tmp_path, small_data, '\n[sweep]\ntrials = 2\nlr = [1e-3, 3e-2]\n')
    study = studies.create(load_spec(path)[1])
    study.set_user_attr(studies.PROFILE_ATTR, path.read_text())  # as 8e60a7c kept it
    studies.load("s", "sweep show")
    assert SECRET not in studies.load("s")[0].user_attrs[studies.PROFILE_ATTR]


def test_a_ledger_write_makes_the_database_and_its_wal_private(gputui_home: Path) -> None:
    from gputui.cloud.ledger import Ledger

    with Ledger() as ledger:  # in this process, no CLI: the ledger makes itself private
        ledger.start_run("r1", "c", time.time())
        made = modes(gputui_home)
    assert {"ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"} <= set(made)
    assert not_private(gputui_home) == {}, made


def test_what_an_older_gputui_left_open_is_tightened_on_first_use(gputui_home: Path) -> None:
    from gputui.cloud.ledger import Ledger

    old_run = gputui_home / "runs" / "20240101-000000-abcd"
    old_run.mkdir(parents=True)
    (old_run / "profile.toml").write_text("[run]\n")
    Ledger().close()
    for path in (gputui_home, gputui_home / "runs", old_run):
        path.chmod(0o755)
    for path in [*gputui_home.glob("ledger.sqlite3*"), old_run / "profile.toml"]:
        path.chmod(0o644)
    assert set(not_private(gputui_home)) >= {".", "runs", "ledger.sqlite3", "runs/20240101-000000-abcd/profile.toml"}
    with Ledger():  # its first use: the home (throughout), the database and its -wal/-shm
        assert not_private(gputui_home) == {}


def test_any_command_tightens_an_open_cache_or_log_directory(gputui_home: Path) -> None:
    for name in ("cache", "logs"):
        (gputui_home / name / "guards").mkdir(parents=True, mode=0o755)
        (gputui_home / name / "guards" / "x.log").write_text("old\n")
        (gputui_home / name).chmod(0o755)
    gputui_home.chmod(0o700)
    assert set(not_private(gputui_home)) == {"cache", "cache/guards", "cache/guards/x.log",
                                             "logs", "logs/guards", "logs/guards/x.log"}
    assert cli.main(["runs", "--json"]) == 0
    assert not_private(gputui_home) == {}


def test_a_csv_export_takes_the_users_umask_outside_gputuis_directories(
        small_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    done = run_cli("run", "--profile", str(profile(tmp_path, small_data)), "--json")
    assert done.returncode == 0, done.stderr
    outside, inside = tmp_path / "curves.csv", gputui_home / "curves.csv"
    assert cli.main(["runs", "export", "last", "--csv", str(outside)]) == 0
    assert cli.main(["runs", "export", "last", "--csv", str(inside)]) == 0
    assert (oct(stat.S_IMODE(outside.stat().st_mode)), oct(stat.S_IMODE(inside.stat().st_mode))) == ("0o644", "0o600")
    assert os.umask(0o022) == 0o022  # and the caller's umask is its own again


def test_private_dir_tightens_each_directory_from_the_home_down_and_leaves_others_alone(
        tmp_path: Path, gputui_home: Path) -> None:
    elsewhere = tmp_path / "mine" / "run"
    elsewhere.parent.mkdir(mode=0o755)
    paths.private_dir(elsewhere)
    deep = paths.private_dir(paths.runs_home() / "a" / "b")
    assert oct(stat.S_IMODE(elsewhere.parent.stat().st_mode)) == "0o755"  # the user's own directory
    assert oct(stat.S_IMODE(elsewhere.stat().st_mode)) == "0o700" and deep.is_dir()
    assert not_private(gputui_home) == {}


def deliver(url: str) -> list[str]:
    """What a notifier reports after one alert to `url`."""
    lines: list[str] = []
    settings = AlertSettings(gpu_temperature_c=1, webhook=url, timeout_s=30)
    notifier = Notifier(settings, report=lines.append)
    notifier.send(AlertEngine(settings).evaluate([host()], 0.0))
    assert notifier.wait(1, timeout=60), f"the alert to {url} was not delivered (the delivery thread died?)"
    notifier.close()
    return lines


def test_a_failed_webhook_never_shows_its_user_password_or_path() -> None:
    broken = Hook(status=500)
    try:
        lines = deliver(f"http://127.0.0.1:{broken.server.server_address[1]}/hook/{SECRET}") + deliver(WEBHOOK)
    finally:
        broken.close()
    assert len(lines) == 2 and "HTTP 500" in lines[0], lines
    assert [line.split(":")[0] for line in lines] == ["alert webhook 127.0.0.1"] * 2
    assert not [line for line in lines if SECRET in line or "alice" in line], lines


def test_a_webhook_url_the_http_client_refuses_is_one_line_without_its_path() -> None:
    lines = deliver(f"http://alice:{SECRET}@127.0.0.1:9/a b/{SECRET}")  # a space: http.client's InvalidURL
    assert len(lines) == 1 and lines[0].startswith("alert webhook 127.0.0.1:9: ") and SECRET not in lines[0], lines


def test_local_sweep_workers_get_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.sweep.slots import LocalSlot

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("GPUTUI_TEST_KEEP", "1")
    handle = LocalSlot("cpu-0", "cpu", 1, None, tmp_path / "logs").spawn()
    try:
        environ = wait_until(lambda: [v for v in Path(f"/proc/{handle.pid}/environ").read_bytes().split(b"\0")
                                      if v] if handle.alive() else [], 60, "the worker's environment",
                             detail=handle.last_words)
    finally:
        handle.kill()
    assert b"GPUTUI_TEST_KEEP=1" in environ and b"OMP_NUM_THREADS=1" in environ
    assert not [var for var in environ if var.startswith(b"AWS_") or SECRET.encode() in var]
    assert oct(stat.S_IMODE((tmp_path / "logs" / "cpu-0.log").stat().st_mode)) == "0o600"


def test_an_alert_command_runs_with_the_users_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "umask"
    script = tmp_path / "umask.py"
    script.write_text(f"import os\nopen({str(out)!r}, 'w').write(oct(os.umask(0)))\n")
    settings = AlertSettings(gpu_temperature_c=1, command=f"{sys.executable} {script}", timeout_s=30)
    monkeypatch.setattr(paths, "_user_umask", None)
    paths.private_umask()  # as the CLI does
    try:
        notifier = Notifier(settings)
        notifier.send(AlertEngine(settings).evaluate([host()], 0.0))
        assert notifier.wait(1, timeout=60)
        notifier.close()
    finally:
        os.umask(0o022)
    assert out.read_text() == "0o22"


def test_a_slaves_remote_dir_is_private_and_an_open_one_is_tightened_at_the_next_bringup(
        cluster_nodes: ClusterNodes, cluster_wheel: Path, small_data: Path, gputui_home: Path) -> None:
    from gputui.cluster.bootstrap import Bootstrapper, local_dataset
    from gputui.cluster.sshnode import SlaveConnection
    from gputui.cluster.wheel import given_wheel
    from gputui.config.hosts import HostSpec

    node = cluster_nodes.shared_node(0)  # a loopback sshd: the slave's files are on this machine
    trust(gputui_home, node)
    spec = HostSpec("n0", node.address, node.port, "root", cluster_nodes.user_key)
    boot = Bootstrapper("~/.gputui-cluster", "python3", given_wheel(cluster_wheel), local_dataset(small_data))
    conn = SlaveConnection(spec).open_or_raise()
    try:
        base = Path(boot.bootstrap(conn).base)
        made = [base, *(base / name for name in ("runs", "data", "wheels", "home"))]
        first = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in made}
        for path in made:
            path.chmod(0o755)  # as an older gputui left it
        again = boot.bootstrap(conn)
        second = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in made}
    finally:
        conn.close()
    assert again.skipped  # already bootstrapped: only the first command ran, and it tightened
    assert set(first.values()) == {"0o700"}, first
    assert set(second.values()) == {"0o700"}, second
