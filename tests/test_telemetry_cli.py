"""`gputui monitor` and `gputui doctor`: JSON schema, record/replay, --host and [[hosts]]
against a real sshd, one-line errors with exit 2, and imports that stay light."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.model.errors import UserError
from gputui.sources.hostspecs import parse_host_arg
from gputui.model.telemetry import THROTTLE_CODES, GpuProcess, GpuSample, HostSnapshot, HostState
from tests.conftest import json_lines, run_cli
from tests.sshd_fixture import Sshd, SshdFactory, free_port, sshd_factory  # noqa: F401

STATES = {s.value for s in HostState}
NUMBER = (int, float, type(None))
HOST_SCHEMA: dict[str, Any] = {
    "name": str, "state": str, "time": (int, float), "duration_s": NUMBER, "kind": str, "address": (str, type(None)),
    "cpu_pct": NUMBER, "mem_used_mib": NUMBER, "mem_total_mib": NUMBER, "gpus": list, "message": (str, type(None)),
    "driver": (str, type(None)),
}
GPU_SCHEMA: dict[str, Any] = {name: NUMBER for name in GpuSample.__dataclass_fields__}
GPU_SCHEMA.update(index=int, name=(str, type(None)), uuid=(str, type(None)), pstate=(str, type(None)), processes=list,
                  throttle=(list, type(None)))
PROCESS_SCHEMA: dict[str, Any] = {"pid": int, "name": (str, type(None)), "user": (str, type(None)), "gpu_memory_mib": NUMBER,
                                  "sm_pct": NUMBER, "cpu_pct": NUMBER, "rss_mib": NUMBER, "running_s": NUMBER,
                                  "started": NUMBER}


def check_round(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert that a document is one round of the documented schema; return its hosts."""
    assert set(doc) == {"version", "time", "hosts"} and doc["version"] == 1 and isinstance(doc["time"], float)
    for host in doc["hosts"]:
        assert set(host) == set(HOST_SCHEMA) == set(HostSnapshot.__dataclass_fields__)
        assert all(isinstance(host[k], t) for k, t in HOST_SCHEMA.items()), host
        assert host["state"] in STATES and (host["state"] == "ok" or host["message"])
        for gpu in host["gpus"]:
            assert set(gpu) == set(GPU_SCHEMA) and all(isinstance(gpu[k], t) for k, t in GPU_SCHEMA.items()), gpu
            assert gpu["throttle"] is None or set(gpu["throttle"]) <= set(THROTTLE_CODES)
            for proc in gpu["processes"]:
                assert set(proc) == set(PROCESS_SCHEMA) == set(GpuProcess.__dataclass_fields__)
                assert all(isinstance(proc[k], t) for k, t in PROCESS_SCHEMA.items())
    return list(doc["hosts"])


def monitor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["monitor", "--once", "--json", *args])
    return code, check_round(json.loads(capsys.readouterr().out))


@pytest.fixture(scope="module")
def a100(sshd_factory: SshdFactory) -> Sshd:
    return sshd_factory("r535-a100x8")


def test_once_json_here_is_one_document_and_exits_0() -> None:
    result = run_cli("monitor", "--once", "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    (host,) = check_round(json.loads(result.stdout))
    assert host["kind"] == "local" and host["state"] in ("ok", "no-driver") and host["mem_total_mib"] > 0
    if host["state"] == "no-driver":
        assert host["gpus"] == [] and "no NVIDIA driver" in host["message"]


def test_once_table_shows_every_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--sim", "2", "--sim-gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "sim-0" in out and "sim-1" in out and "A100" in out and "Util" in out
    assert main(["monitor", "--once"]) == 0
    out = capsys.readouterr().out
    assert socket.gethostname()[:5] in out and ("no-driver" in out or "ok" in out)


def test_json_lines_per_round_record_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "rec.jsonl"
    code = main(["monitor", "--json", "--sim", "2", "--sim-gpus", "3", "--seed", "5", "--count", "3", "--interval", "0.01", "--record", str(record)])
    assert code == 0
    live = json_lines(capsys.readouterr().out)
    assert len(live) == 3 and all(len(check_round(doc)) == 2 for doc in live)
    assert all(len(h["gpus"]) == 3 for doc in live for h in doc["hosts"])
    assert json_lines(record.read_text()) == live  # the recording is what was shown
    assert main(["monitor", "--json", "--replay", str(record), "--interval", "0.01"]) == 0
    replayed = json_lines(capsys.readouterr().out)
    assert [doc["hosts"] for doc in replayed] == [doc["hosts"] for doc in live]  # stops at the end


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--interval", "0"], "--interval 0: expected"),
        (["--count", "0"], "--count 0"),
        (["--host", "a@b@c"], "expected [user@]address[:port]"),
        (["--host", "gpu@host:99999"], "expected [user@]address[:port]"),
        (["--host", "h", "--identity", "/nonexistent/key"], "--identity /nonexistent/key: no such file"),
        (["--identity", "/nonexistent/key"], "--identity applies to --host"),
        (["--host", "h", "--host", "h"], "listed twice"),
        (["--sim", "1", "--replay", "x.jsonl"], "choose one"),
        (["--sim", "0"], "--sim 0"),
        (["--sim", "1", "--host", "h"], "drop --host"),
        (["--no-local"], "nothing to watch"),
        (["--replay", "/nonexistent.jsonl"], "recording not found"),
        (["--profile", "/nonexistent.toml"], "profile not found"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    assert main(["monitor", "--once", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: error: ") and words in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[[hosts]]\nname = "a"\n', "needs `address`"),
        ('[[hosts]]\naddress = "h"\nprot = 22\n', "p.toml:3: [hosts] prot: unknown key"),
        ('[[hosts]]\naddress = "h"\nport = 0\n', "[hosts] port: expected"),
        ('[[hosts]]\naddress = "bad host"\n', "[hosts] address: expected a host name"),
        ('[hosts]\naddress = "h"\n', "write it as [[hosts]]"),
        ('[[hosts]]\naddress = "h"\nidentity_file = "missing_key"\n', "identity_file"),
    ],
)
def test_broken_hosts_profile_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(text)
    assert main(["doctor", "--no-local", "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and str(profile) in err


def test_host_arguments() -> None:
    assert parse_host_arg("gpu@10.0.0.5:2222").label() == "gpu@10.0.0.5:2222"
    spec = parse_host_arg("root@[::1]:22")
    assert (spec.address, spec.port, spec.user, spec.name) == ("::1", 22, "root", "::1:22")
    assert (parse_host_arg("rig").user, parse_host_arg("rig").port) == (None, None)
    with pytest.raises(UserError):
        parse_host_arg("user@")


def test_monitor_remote_host_states_through_the_cli(
    a100: Sshd, sshd_factory: SshdFactory, ssh_home: Path, gputui_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--host", f"root@127.0.0.1:{a100.port}", "-i", str(sshd_factory.user_key)]
    code, hosts = monitor_json(capsys, *target)
    assert code == 0 and [h["kind"] for h in hosts] == ["local", "ssh"]  # the local part worked
    assert hosts[1]["state"] == "host-key-unknown" and "ssh-keyscan" in hosts[1]["message"]
    code, hosts = monitor_json(capsys, *target, "--trust-on-first-use", "--no-local")
    assert code == 0 and hosts[0]["state"] == "ok" and len(hosts[0]["gpus"]) == 8
    assert a100.host_public_key() in (gputui_home / "known_hosts").read_text()
    code, hosts = monitor_json(capsys, *target, "--no-local")  # recorded: known from now on
    assert code == 0 and hosts[0]["state"] == "ok"
    code, hosts = monitor_json(capsys, "--no-local", "--host", f"root@127.0.0.1:{free_port()}", "-i", str(sshd_factory.user_key))
    assert code == 1 and hosts[0]["state"] == "unreachable"


def test_profile_hosts_and_ssh_config(
    a100: Sshd, sshd_factory: SshdFactory, ssh_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ssh_home / ".ssh" / "known_hosts").write_text(a100.known_hosts_line())
    (ssh_home / ".ssh" / "config").write_text(f"Host rig\n  HostName 127.0.0.1\n  Port {a100.port}\n  User root\n")
    key = tmp_path / "keys" / "id"
    key.parent.mkdir()
    key.write_bytes(sshd_factory.user_key.read_bytes())
    key.chmod(0o600)
    profile = tmp_path / "hosts.toml"
    profile.write_text('[[hosts]]\nname = "rig"\naddress = "rig"\nidentity_file = "keys/id"\nconnect_timeout = 3.0\n')
    code, hosts = monitor_json(capsys, "--profile", str(profile), "--no-local")
    assert code == 0 and hosts[0]["name"] == "rig" and hosts[0]["state"] == "ok", hosts[0]["message"]
    assert hosts[0]["address"] == f"root@127.0.0.1:{a100.port}"


def test_doctor_checks_local_and_remote(
    a100: Sshd, sshd_factory: SshdFactory, ssh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ssh_home / ".ssh" / "known_hosts").write_text(a100.known_hosts_line())
    good = ["--host", f"root@127.0.0.1:{a100.port}", "-i", str(sshd_factory.user_key)]
    assert main(["doctor", "--json", *good]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(c["host"], c["name"]): c for c in doc["checks"]}
    assert doc["ok"] is True and all(set(c) == {"host", "name", "status", "detail", "fix"} for c in doc["checks"])
    assert all(c["status"] in ("pass", "warn", "fail") for c in doc["checks"])
    local = {n for h, n in rows if h == "local"} - {"storage"}  # no CUDA and no driver here is one finding, "gpu"
    assert local == {"python", "torch", "gpu"} or {"python", "torch", "cuda", "nvml"} <= local, local
    assert rows[("local", "storage")]["status"] in ("pass", "warn")  # warn: a machine short of room
    assert rows[("local", "python")]["status"] == "pass" and rows[("local", "torch")]["status"] == "pass"
    remote = f"127.0.0.1:{a100.port}"
    for check in ("reachable", "host key", "nvidia-smi"):
        assert rows[(remote, check)]["status"] == "pass"
    assert rows[(remote, "gpus")]["detail"].startswith("8 GPUs")
    assert rows[(remote, "python")]["status"] == "pass" and rows[(remote, "torch")]["status"] in ("pass", "warn")
    assert all(c["fix"] for c in doc["checks"] if c["status"] == "fail")


def test_doctor_fails_with_fixes(
    a100: Sshd, sshd_factory: SshdFactory, ssh_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = free_port()
    args = ["doctor", "--no-local", "-i", str(sshd_factory.user_key), "--host", f"root@127.0.0.1:{closed}", "--host", f"root@127.0.0.1:{a100.port}"]
    assert main([*args, "--json"]) == 1
    rows = {(c["host"], c["name"]): c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert rows[(f"127.0.0.1:{closed}", "reachable")]["status"] == "fail" and "refused" in rows[(f"127.0.0.1:{closed}", "reachable")]["detail"]
    key_row = rows[(f"127.0.0.1:{a100.port}", "host key")]
    assert key_row["status"] == "fail" and "ssh-keyscan" in key_row["fix"]
    assert main(args) == 1  # the table
    out = capsys.readouterr().out
    assert "fail" in out and "ssh-keyscan" in out and "failed" in out


def test_help_and_light_imports() -> None:
    result = run_cli("--help", timeout=60)
    assert "monitor" in result.stdout and "doctor" in result.stdout
    code = (
        "import sys, gputui.cli, gputui.commands.monitor, gputui.commands.doctor, gputui.monitor.polling, "
        "gputui.model.telemetry, gputui.sources.ssh, gputui.sources.nvml, gputui.jobs.doctor\n"
        "gputui.cli.build_parser()\n"
        "print(sorted({'paramiko', 'pynvml', 'torch', 'textual'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
