"""The process table: rows from every host, sort and filter (also through `gputui monitor`),
and signals sent locally (os.kill) and remotely (`kill` over the host's SSH connection,
against a real process on the loopback sshd host), with every refusal as one line."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gputui.cli import main
from gputui.config.hosts import HostSpec
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.monitor.polling import Telemetry, kill
from gputui.monitor.processes import filter_rows, kill_local, kill_remote, parse_kill_answer, rows, signal_name, sort_rows
from gputui.sources.hostkeys import SshOptions
from gputui.sources.sim import SimSource
from gputui.sources.ssh import SshHost, SshSource
from tests.proc_support import wait_until
from tests.sshd_fixture import Sshd, SshdFactory, sshd_factory  # noqa: F401

GONE_PID = 2**22 + 12345  # above any pid_max default: no such process
ROOT = os.geteuid() == 0


def proc(pid: int, **more: object) -> GpuProcess:
    return GpuProcess(pid=pid, **more)  # type: ignore[arg-type]


def sample_hosts() -> list[HostSnapshot]:
    a = GpuSample(0, processes=(proc(10, user="ann", name="python train.py", gpu_memory_mib=100, sm_pct=90, cpu_pct=100, running_s=50),
                                proc(11, user="bob", name="jupyter kernel", gpu_memory_mib=900, sm_pct=None, cpu_pct=5, running_s=9)))
    b = GpuSample(1, processes=(proc(12, user="ann", name="Python eval.py", gpu_memory_mib=None, sm_pct=10, cpu_pct=50, running_s=900),))
    return [HostSnapshot("rig", HostState.OK, 1.0, kind="ssh", gpus=(a, b)), HostSnapshot("box", HostState.OK, 1.0, gpus=())]


def test_rows_sort_and_filter() -> None:
    found = rows(sample_hosts())
    assert [(r.host, r.gpu, r.pid) for r in found] == [("rig", 0, 10), ("rig", 0, 11), ("rig", 1, 12)]
    assert [r.pid for r in sort_rows(found, "memory")] == [11, 10, 12]  # largest first, n/a last
    assert [r.pid for r in sort_rows(found, "memory", reverse=True)] == [10, 11, 12]  # n/a still last
    assert [r.pid for r in sort_rows(found, "sm")] == [10, 12, 11]
    assert [r.pid for r in sort_rows(found, "cpu")] == [10, 12, 11]
    assert [r.pid for r in sort_rows(found, "time")] == [12, 10, 11]
    assert [r.pid for r in sort_rows(found, "pid", reverse=True)] == [12, 11, 10]
    assert [r.pid for r in sort_rows(found, "user")] == [10, 12, 11]
    assert [r.pid for r in filter_rows(found, user="ann")] == [10, 12]
    assert [r.pid for r in filter_rows(found, command="PYTHON")] == [10, 12]  # any case
    assert [r.pid for r in filter_rows(found, user="ann", command="eval")] == [12]
    assert filter_rows(found, host="box") == []
    assert found[0].to_dict()["host"] == "rig" and found[0].to_dict()["sm_pct"] == 90


def test_signal_names() -> None:
    assert [signal_name(n) for n in ("term", "SIGINT", "Kill")] == ["TERM", "INT", "KILL"]
    with pytest.raises(ValueError, match="expected TERM, INT or KILL"):
        signal_name("HUP")


def test_monitor_sorts_and_filters_the_process_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["monitor", "--once", "--json", "--sim", "3", "--sim-gpus", "2", "--seed", "1"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "processes" not in doc  # only when asked
    assert main([*args, "--procs", "--sort", "pid"]) == 0
    listed = json.loads(capsys.readouterr().out)["processes"]
    every = [p["pid"] for h in doc["hosts"] for g in h["gpus"] for p in g["processes"]]
    assert listed and [p["pid"] for p in listed] == sorted(every)
    assert set(listed[0]) >= {"host", "gpu", "pid", "user", "gpu_memory_mib", "sm_pct", "cpu_pct", "rss_mib", "running_s", "name"}
    assert main([*args, "--user", "nobody-here"]) == 0
    assert json.loads(capsys.readouterr().out)["processes"] == []
    assert main([*args.__add__(["--command", "GPUTUI"]), "--sort", "memory", "--reverse"]) == 0
    mem = [p["gpu_memory_mib"] for p in json.loads(capsys.readouterr().out)["processes"]]
    assert mem == sorted(mem) and len(mem) == len(every)
    assert main(["monitor", "--once", "--sim", "1", "--sim-gpus", "1", "--seed", "1", "--procs"]) == 0
    out = capsys.readouterr().out
    assert "Processes" in out and "PID" in out and "Command" in out


def test_monitor_rejects_an_unknown_sort_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["monitor", "--once", "--sort", "colour"])
    assert info.value.code == 2 and "invalid choice: 'colour'" in capsys.readouterr().err


# -- signals, locally -------------------------------------------------------------------------

def test_local_kill_sends_and_refuses_in_one_line() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])  # waits for the signal
    try:
        sent = kill_local(child.pid, "TERM", proc(child.pid, name="python sleeper"), host="box")
        assert sent.ok and sent.line == f"SIGTERM sent to pid {child.pid} (python sleeper) on box"
        assert child.wait(30) == -15
    finally:
        child.kill()
    gone = kill_local(GONE_PID, "KILL", host="box")
    assert not gone.ok and gone.line == f"kill refused: pid {GONE_PID} on box has already exited"
    theirs = kill_local(os.getpid(), "INT", host="box", me="somebody-else")
    assert not theirs.ok and theirs.line == f"kill refused: pid {os.getpid()} on box belongs to {getpass.getuser()}, not somebody-else"


@pytest.mark.skipif(not ROOT, reason="starting another user's process needs root")
def test_local_kill_refuses_another_users_process() -> None:
    other = subprocess.Popen(["sleep", "300"], user="nobody")
    try:
        refused = kill_local(other.pid, "KILL", host="box")
        assert not refused.ok and refused.line == f"kill refused: pid {other.pid} on box belongs to nobody, not root"
        assert other.poll() is None  # still running: nothing was sent
    finally:
        other.kill()
        other.wait(30)


def test_a_simulated_process_leaves_its_gpu_and_a_replay_refuses(tmp_path: Path) -> None:
    sim = SimSource(hosts=1, gpus=2, seed=1, clock=lambda: 100.0)
    sim.set_active(0, True)
    pid = sim.poll()[0].gpus[1].processes[0].pid
    result = kill(sim, "sim-0", pid, "term")
    assert result.ok and "SIGTERM sent" in result.line
    assert sim.poll()[0].gpus[1].processes == () and sim.poll()[0].gpus[0].processes
    again = kill(sim, "sim-0", pid, "TERM")
    assert not again.ok and "is not running" in again.line
    assert not kill(sim, "sim-0", pid, "HUP").ok
    from gputui.sources.replay import ReplaySource

    recording = tmp_path / "r.jsonl"
    recording.write_text(json.dumps({"version": 1, "time": 1.0, "hosts": [h.to_dict() for h in sample_hosts()]}) + "\n")
    refused = kill(ReplaySource(recording), "rig", 10, "TERM")
    assert not refused.ok and refused.line == "kill refused: rig is a recording; nothing runs there"


# -- signals over SSH, against a real process on the loopback sshd host -----------------------

@pytest.fixture(scope="module")
def rig(sshd_factory: SshdFactory) -> Sshd:
    return sshd_factory("r580-h100x8")


@pytest.fixture
def host(sshd_factory: SshdFactory, rig: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshHost:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    known = tmp_path / "known_hosts"
    known.write_text(rig.known_hosts_line())
    options = SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "g_known", ssh_config=None)
    spec = HostSpec(name="rig", address="127.0.0.1", port=rig.port, user="root", identity_file=sshd_factory.user_key,
                    connect_timeout=5.0, command_timeout=10.0)
    found = SshHost(spec, options)
    assert found.poll_now().state == HostState.OK
    yield found
    found.close()


def start_remote(host: SshHost) -> int:
    """A process started through the host's own SSH connection, outliving that command."""
    code, out, err = host.run("sh -c 'nohup sleep 300 >/dev/null 2>&1 & echo $!'")
    assert code == 0, err
    return int(out.strip())


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_remote_kill_over_the_hosts_connection(host: SshHost) -> None:
    pid = start_remote(host)
    try:
        assert psutil.Process(pid).username() == "root" and not ended(pid)
        result = kill_remote(host, pid, "TERM", proc(pid, name="sleep 300"))
        assert result.ok and result.line == f"SIGTERM sent to pid {pid} (sleep 300) on rig as root"
        wait_until(lambda: ended(pid), 30, f"pid {pid} to end after SIGTERM")
        assert host.attempts == 1  # the poll's connection, reused
    finally:
        if not ended(pid):
            os.kill(pid, 9)
    gone = kill_remote(host, GONE_PID, "KILL")
    assert not gone.ok and gone.line == f"kill refused: pid {GONE_PID} on rig has already exited"


@pytest.mark.skipif(not ROOT, reason="starting another user's process needs root")
def test_remote_kill_refuses_another_users_process(host: SshHost) -> None:
    other = subprocess.Popen(["sleep", "300"], user="nobody")  # same machine as the loopback sshd
    try:
        refused = kill_remote(host, other.pid, "KILL")
        assert not refused.ok and refused.line == f"kill refused: pid {other.pid} on rig belongs to nobody, not root"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(30)


def test_remote_kill_through_the_telemetry_and_a_lost_connection(sshd_factory: SshdFactory, rig: Sshd, host: SshHost) -> None:
    source = SshSource([host.spec], host.options)
    try:
        assert source.poll(settle=True)[0].state == HostState.OK
        telemetry = Telemetry(None, source)
        pid = start_remote(source.hosts[0])
        result = kill(telemetry, "rig", pid, "sigkill")  # (a `&` job of a script ignores SIGINT)
        assert result.ok and "SIGKILL sent" in result.line, result.line
        wait_until(lambda: ended(pid), 30, f"pid {pid} to end after SIGKILL")
        assert kill(telemetry, "nowhere", 1, "TERM").line == "kill refused: no host named nowhere"
        source.hosts[0].close()
        lost = kill(telemetry, "rig", 1, "TERM")
        assert not lost.ok and lost.line.startswith("kill refused: rig is not connected")
    finally:
        source.close()


def test_what_a_kill_answer_means() -> None:
    said = [parse_kill_answer(text, 7, "TERM", "rig", "gpu").line for text in (
        "sent\n", "gone", "owner alice", "failed sh: kill: (7) - Operation not permitted",
        "failed kill: 7: No such process", "failed something odd", "")]
    assert said == [
        "SIGTERM sent to pid 7 on rig as gpu",
        "kill refused: pid 7 on rig has already exited",
        "kill refused: pid 7 on rig belongs to alice, not gpu",
        "kill refused: pid 7 on rig: permission denied",
        "kill refused: pid 7 on rig has already exited",
        "kill failed: pid 7 on rig: something odd",
        "kill failed: pid 7 on rig: no answer",
    ]
    assert all("\n" not in line for line in said)
