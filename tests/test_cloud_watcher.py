"""The spot interruption watcher against a fake instance-metadata server on loopback,
with real processes receiving SIGTERM; and the master's remote command to it (through a
stand-in ssh here; the real OpenSSH route is tested in test_guard_ssh.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cloud import watcher
from gputui.cloud.remote import REMOTE_CHECKPOINT, ssh_checkpointer, ssh_command
from gputui.model.errors import GputuiError
from gputui.model.cloud import InstanceRecord

from .proc_support import wait_until

CHILD = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(*_):
    out.write_text("checkpoint written")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
if len(sys.argv) > 2 and sys.argv[2] == "stdin":
    sys.stdin.read()  # lives until the test closes its stdin
else:
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 60)
"""


class FakeImds:
    """IMDSv2 as a slave sees it: a session token first, then 404 until a notice exists."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.notice: dict[str, str] | None = None
        self.log: list[tuple[float, str, str]] = []  # (time, method, outcome)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def reply(self, code: int, body: str = "") -> None:
                fake.log.append((time.monotonic(), self.command, str(code)))
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.reply(400)
                token = f"token-{len(fake.tokens)}"
                fake.tokens.add(token)
                self.reply(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    return self.reply(401)
                if self.path != "/latest/meta-data/spot/instance-action" or fake.notice is None:
                    return self.reply(404, "Not Found")
                self.reply(200, json.dumps(fake.notice))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def outcomes(self, method: str) -> list[str]:
        return [outcome for _t, m, outcome in self.log if m == method]


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def start_child(tmp_path: Path, name: str, seconds: float | None = 60) -> tuple[subprocess.Popen[str], Path]:
    """A process standing for a training run; `seconds=None`: it lives until its stdin is closed."""
    marker = tmp_path / f"{name}.ckpt"
    life = "stdin" if seconds is None else str(seconds)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), life], stdout=subprocess.PIPE, text=True,
                             stdin=subprocess.PIPE if seconds is None else None)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child, marker


def test_client_does_the_token_handshake_and_renews_a_rejected_token(imds: FakeImds) -> None:
    client = watcher.Imds(imds.url)
    assert client.instance_action() is None and client.instance_action() is None
    assert imds.outcomes("PUT") == ["200"] and imds.outcomes("GET") == ["404", "404"]  # one token, reused
    imds.tokens.clear()  # the token expired on the server's side
    imds.notice = {"action": "terminate", "time": "2026-11-21T17:00:00Z"}
    assert client.instance_action() == imds.notice
    assert imds.outcomes("PUT") == ["200", "200"] and imds.outcomes("GET")[-2:] == ["401", "200"]


def test_watcher_sigterms_the_training_process_on_a_notice(tmp_path: Path, imds: FakeImds) -> None:
    child, marker = start_child(tmp_path, "train")
    watch = subprocess.Popen([sys.executable, "-m", "gputui.cloud.watcher", "--pid", str(child.pid),
                              "--imds", imds.url, "--interval", "0.2"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while imds.outcomes("GET").count("404") < 3:  # polling, nothing to report yet
            assert time.monotonic() < deadline and watch.poll() is None
            time.sleep(0.05)
        assert child.poll() is None and not marker.exists()
        imds.notice = {"action": "terminate", "time": "2026-11-21T17:02:00Z"}
        assert child.wait(timeout=30) == 0  # it checkpointed and stopped cleanly
        assert marker.read_text() == "checkpoint written"
        assert watch.wait(timeout=30) == 0
        _out, err = watch.communicate()
    finally:
        for proc in (child, watch):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # It acted on the first poll that saw the notice (one 200), far inside the two-minute warning.
    assert imds.outcomes("GET").count("200") == 1
    assert "spot interruption notice" in err and str(child.pid) in err
    assert "200" in imds.outcomes("GET") and "401" not in imds.outcomes("GET")
    assert not any(watcher.registry().glob("*"))  # it deregistered itself


def test_gputui_cloud_watch_ends_with_the_process_when_no_notice_comes(tmp_path: Path, imds: FakeImds) -> None:
    """The process ends once the watcher has polled twice (whenever that is on a busy machine)."""
    child, marker = start_child(tmp_path, "short", seconds=None)
    watch = subprocess.Popen([sys.executable, "-m", "gputui", "cloud", "watch", "--pid", str(child.pid),
                              "--imds", imds.url, "--interval", "0.2"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: imds.outcomes("GET").count("404") >= 2 or watch.poll() is not None, 120,
                   "two polls of the metadata service")
        assert watch.poll() is None, "the watcher ended while the process lived"
        assert child.stdin is not None
        child.stdin.close()  # the process ends
        child.wait(timeout=30)
        out, err = watch.communicate(timeout=60)
    finally:
        for proc in (watch, child):
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert watch.returncode == 0 and not marker.exists(), err
    assert "notice" not in err and imds.outcomes("GET").count("404") >= 2


def test_unreachable_metadata_is_said_once_and_polling_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    sleeps: list[float] = []
    client = watcher.Imds("http://127.0.0.1:9", timeout_s=0.5)
    pid = os.getpid()
    stop_after = iter([True, True, True, False])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(watcher, "process_alive", lambda p: next(stop_after))
        assert watcher.watch(pid, client, interval_s=5, sleep=sleeps.append, say=said.append) is None
    assert len(said) == 1 and "not reachable" in said[0] and sleeps == [5, 5, 5]


def test_checkpoint_all_signals_every_watched_run(tmp_path: Path) -> None:
    first, first_marker = start_child(tmp_path, "a")
    second, second_marker = start_child(tmp_path, "b")
    try:
        watcher.register(first.pid)
        watcher.register(second.pid)
        (watcher.registry() / "999999999").write_text("")  # a run long gone
        result = subprocess.run([sys.executable, "-m", "gputui.cloud.watcher", "--checkpoint-all"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0
        assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
        assert first_marker.exists() and second_marker.exists()
        assert not (watcher.registry() / "999999999").exists()
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_master_reaches_the_slaves_over_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `ssh` runs the remote command here: the fan-out and the remote command, not
    the ssh client (test_guard_ssh.py takes the real client to a real sshd)."""
    fake_ssh = tmp_path / "ssh"
    calls = tmp_path / "calls.txt"
    fake_ssh.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nfor last; do :; done\nexec sh -c "$last"\n')
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("GPUTUI_SSH", str(fake_ssh))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert ssh_command("ubuntu", "203.0.113.9")[-5:] == ["-l", "ubuntu", "--", "203.0.113.9", REMOTE_CHECKPOINT]
    assert "BatchMode=yes" in ssh_command("ubuntu", "203.0.113.9")
    child, marker = start_child(tmp_path, "remote")
    try:
        watcher.register(child.pid)
        record = InstanceRecord("i-1", "ec2", "us-east-1", "c", None, "g4dn.xlarge", "us-east-1a", "spot", 0.2,
                                0.0, None, "running", None, "203.0.113.9")
        ssh_checkpointer("ubuntu")([record])
        assert child.wait(timeout=30) == 0 and marker.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "-l ubuntu -- 203.0.113.9" in calls.read_text()
    no_address = InstanceRecord("i-2", "ec2", "us-east-1", "c", None, "t", "z", "spot", 0.2, 0.0, None, "pending",
                                None, None)
    with pytest.raises(GputuiError, match="i-2: no address"):
        ssh_checkpointer("ubuntu")([no_address])


def test_remote_checkpoint_prefers_the_cluster_venv(tmp_path: Path) -> None:
    """A slave bootstrapped by gputui cluster has gputui in its venv, not in the system python3."""
    venv_python = tmp_path / ".gputui-cluster" / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    used = tmp_path / "used.txt"
    venv_python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "$@" > {used}\n')
    venv_python.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path)}
    result = subprocess.run(["sh", "-c", REMOTE_CHECKPOINT], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert used.read_text().split() == ["-m", "gputui.cloud.watcher", "--checkpoint-all"]


def test_remote_checkpoint_without_gputui_fails_clearly(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path)}  # no venv, no python3 on PATH
    result = subprocess.run(["/bin/sh", "-c", REMOTE_CHECKPOINT], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 3
    assert "gputui is not installed on this slave" in result.stderr


@pytest.mark.parametrize("pid", ["0", "-3", str(2**64), str(int(Path("/proc/sys/kernel/pid_max").read_text()) + 1)])
def test_watching_a_pid_no_process_has_is_one_line_and_exit_2(pid: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A number past any pid used to end in OverflowError's traceback; a gone one in the same line as 0."""
    assert watcher.main(["--pid", pid, "--imds", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == f"gputui watcher: no process {pid}\n"


def test_a_zombie_or_a_reused_pid_is_not_signalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_all asks gputui.model.pids: a registered pid whose start time changed (reused) is
    dropped, not signalled; the registry entry of a live, unchanged one is kept and signalled."""
    monkeypatch.setenv("GPUTUI_HOME", str(tmp_path / "data"))
    sent: list[int] = []
    monkeypatch.setattr(watcher.os, "kill", lambda pid, sig: sent.append(pid) if sig else None)
    mine = watcher.register(os.getpid())
    reused = watcher.registry() / "1"
    reused.write_text("not-its-start", encoding="ascii")
    assert watcher.checkpoint_all() == [os.getpid()] and sent == [os.getpid()]
    assert mine.exists() and not reused.exists()


def test_checkpoint_all_drops_entries_it_cannot_read_and_a_run_that_ended_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbled entry, a directory planted under a pid's name and a process that ends between
    the check and the signal: none raises; the live run is still signalled."""
    monkeypatch.setenv("GPUTUI_HOME", str(tmp_path / "data"))
    sent: list[int] = []
    ended = 4242

    def kill(pid: int, sig: int) -> None:
        if sig and pid == ended:
            raise ProcessLookupError(3, "No such process")
        if sig:
            sent.append(pid)

    monkeypatch.setattr(watcher.os, "kill", kill)
    mine = watcher.register(os.getpid())
    assert (mine.parent.stat().st_mode & 0o777) == 0o700
    (watcher.registry() / "7").write_bytes(b"\xff\xfe")
    (watcher.registry() / "8").mkdir()
    gone = watcher.registry() / str(ended)
    gone.write_text("", encoding="ascii")  # no start time recorded: the pid is trusted, as the store does
    monkeypatch.setattr(watcher, "process_alive", lambda pid: True)
    assert watcher.checkpoint_all() == [os.getpid()] and sent == [os.getpid()]
    assert sorted(p.name for p in watcher.registry().iterdir()) == sorted(["8", str(os.getpid())])


def test_a_notice_for_a_run_that_just_ended_is_said_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTUI_HOME", str(tmp_path / "data"))

    class Notice:
        def instance_action(self) -> dict[str, Any]:
            return {"action": "terminate"}

    def kill(pid: int, sig: int) -> None:
        if sig:
            raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(watcher.os, "kill", kill)
    said: list[str] = []
    assert watcher.watch(os.getpid(), Notice(), say=said.append) == {"action": "terminate"}  # type: ignore[arg-type]
    assert said == [f'gputui watcher: spot interruption notice {{"action": "terminate"}}; '
                    f"no SIGTERM: it had already ended, {os.getpid()}"]
    assert not any(watcher.registry().iterdir())
