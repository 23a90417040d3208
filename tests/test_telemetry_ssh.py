"""The SSH source against a real OpenSSH sshd on 127.0.0.1: every host state, host-key
policy, backoff, reconnection, timeouts, and rounds that a dead host never delays."""

from __future__ import annotations

import logging
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostState
from gputui.sources.hostkeys import SshOptions
from gputui.sources import pollchannel
from gputui.monitor.polling import Telemetry
from gputui.sources import ssh
from gputui.sources.ssh import SshHost, SshSource
from tests.proc_support import wait_until
from tests.sshd_fixture import Sshd, SshdFactory, free_port, keygen, logging_ps, no_agent, sshd_factory  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_agent")


@pytest.fixture(scope="module")
def a100(sshd_factory: SshdFactory) -> Sshd:
    return sshd_factory("r535-a100x8")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def options(tmp_path: Path, *trusted: Sshd, tofu: bool = False) -> SshOptions:
    known = tmp_path / "known_hosts"
    known.write_text("".join(s.known_hosts_line() for s in trusted))
    return SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gputui_known_hosts", ssh_config=None, trust_on_first_use=tofu)


def spec(factory: SshdFactory, port: int, name: str = "h", **more: object) -> HostSpec:
    values: dict[str, object] = dict(name=name, address="127.0.0.1", port=port, user="root", identity_file=factory.user_key,
                                     connect_timeout=2.0, command_timeout=5.0)
    values.update(more)
    return HostSpec(**values)  # type: ignore[arg-type]


def test_ok_host_reports_its_gpus_over_one_persistent_connection(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path) -> None:
    source = SshSource([spec(sshd_factory, a100.port)], options(tmp_path, a100))
    try:
        (snap,) = source.poll(settle=True)
        assert snap.state == HostState.OK and snap.kind == "ssh" and snap.address == f"root@127.0.0.1:{a100.port}"
        assert len(snap.gpus) == 8 and snap.driver == "535.183.01" and snap.mem_total_mib and snap.duration_s
        assert snap.gpus[0].processes[0].user == "root"
        for _ in range(3):
            (snap,) = source.poll()
            assert snap.state == HostState.OK and len(snap.gpus) == 8 and snap.cpu_pct is not None
        assert source.hosts[0].attempts == 1  # connected once, reused
    finally:
        source.close()


@pytest.mark.parametrize(
    ("fixture", "state", "gpus", "words"),
    [
        ("r470-k80", HostState.OK, 2, None),
        ("r340-quadro", HostState.OK, 1, None),
        ("zero", HostState.OK, 0, "no GPU"),
        ("nodriver", HostState.NO_DRIVER, 0, "no NVIDIA driver"),
        (None, HostState.NO_NVIDIA_SMI, 0, "nvidia-smi not found"),
    ],
)
def test_driver_generations_and_missing_nvidia_smi(
    sshd_factory: SshdFactory, tmp_path: Path, fixture: str | None, state: HostState, gpus: int, words: str | None
) -> None:
    server = sshd_factory(fixture)
    try:
        host = SshHost(spec(sshd_factory, server.port), options(tmp_path, server))
        snap = host.poll_now()
        assert snap.state == state, snap.message
        assert len(snap.gpus) == gpus
        if words is None:
            assert snap.message is None
        else:
            assert words in (snap.message or "")
        assert snap.mem_total_mib  # the host part works whatever the GPUs do
        host.close()
    finally:
        server.stop()


def test_wrong_key_is_auth_failed_and_no_secret_is_logged(
    sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stranger = keygen(tmp_path / "stranger")
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse battery", "-f", str(locked)], check=True)
    opts = options(tmp_path, a100)
    wrong = SshHost(spec(sshd_factory, a100.port, identity_file=stranger), opts).poll_now()
    assert wrong.state == HostState.AUTH_FAILED and "authentication failed for root@127.0.0.1" in (wrong.message or "")
    assert "authorized_keys" in (wrong.message or "")
    encrypted = SshHost(spec(sshd_factory, a100.port, identity_file=locked), opts).poll_now()
    assert encrypted.state == HostState.AUTH_FAILED and "passphrase" in (encrypted.message or "")
    secrets = [line for key in (stranger, locked) for line in key.read_text().splitlines()[1:-1]] + ["correct horse battery"]
    said = caplog.text + (wrong.message or "") + (encrypted.message or "")
    assert not any(secret in said for secret in secrets)


def test_unknown_host_key_is_refused_with_the_way_to_trust_it(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path) -> None:
    opts = options(tmp_path)  # nothing known
    snap = SshHost(spec(sshd_factory, a100.port), opts).poll_now()
    assert snap.state == HostState.HOST_KEY_UNKNOWN
    listed = subprocess.run(["ssh-keygen", "-lf", str(a100.host_key) + ".pub"], capture_output=True, text=True, check=True).stdout
    assert listed.split()[1] in (snap.message or "")  # the fingerprint ssh-keygen shows
    assert f"ssh-keyscan -p {a100.port} 127.0.0.1" in (snap.message or "") and "trust_on_first_use" in (snap.message or "")
    assert not opts.gputui_known_hosts_path().exists()  # nothing was recorded


def test_changed_host_key_is_always_refused(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host")
    opts = options(tmp_path, tofu=True)
    opts.known_hosts[0].write_text(f"[127.0.0.1]:{a100.port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    snap = SshHost(spec(sshd_factory, a100.port, trust_on_first_use=True), opts).poll_now()
    assert snap.state == HostState.HOST_KEY_MISMATCH and "CHANGED" in (snap.message or "")
    assert f"ssh-keygen -R '[127.0.0.1]:{a100.port}'" in (snap.message or "")
    assert not opts.gputui_known_hosts_path().exists()


def test_trust_on_first_use_records_the_key(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path) -> None:
    opts = options(tmp_path)
    first = SshHost(spec(sshd_factory, a100.port, trust_on_first_use=True), opts)
    assert first.poll_now().state == HostState.OK
    first.close()
    recorded = opts.gputui_known_hosts_path()
    assert a100.host_public_key() in recorded.read_text() and f"[127.0.0.1]:{a100.port}" in recorded.read_text()
    assert stat.S_IMODE(recorded.stat().st_mode) == 0o600
    later = SshHost(spec(sshd_factory, a100.port), opts)  # no TOFU: the recorded key is known now
    assert later.poll_now().state == HostState.OK
    later.close()


def test_closed_port_is_unreachable_and_retried_with_backoff(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    clock = Clock()
    source = SshSource([spec(sshd_factory, free_port())], options(tmp_path), clock=clock)
    (snap,) = source.poll(settle=True)
    host = source.hosts[0]
    assert snap.state == HostState.UNREACHABLE and "refused" in (snap.message or "") and "retry in 1 s" in (snap.message or "")
    source.poll(settle=True)
    assert host.attempts == 1  # still backing off
    clock.now += 1.5
    (snap,) = source.poll(settle=True)
    assert host.attempts == 2 and "retry in 2 s" in (snap.message or "")
    clock.now += 2.5
    source.poll(settle=True)
    assert host.attempts == 3 and "retry in 4 s" in (source.hosts[0].snapshot.message or "")


def test_silent_host_is_bounded_by_the_connect_timeout(sshd_factory: SshdFactory, tmp_path: Path, silent_port: int) -> None:
    # How long the bound takes is measured by benchmarks/bench_ssh_timeouts.py; here: the verdict and its words.
    snap = SshHost(spec(sshd_factory, silent_port, connect_timeout=1.0), options(tmp_path)).poll_now()
    assert snap.state == HostState.UNREACHABLE, snap.message
    assert "no SSH handshake" in (snap.message or "") and "within 1 s" in (snap.message or ""), snap.message


def test_a_dead_host_never_delays_the_others(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path, silent_port: int) -> None:
    # The silent host's connect outlasts the test: every round below happens while it is still connecting.
    specs = [
        spec(sshd_factory, a100.port, name="good"),
        spec(sshd_factory, silent_port, name="silent", connect_timeout=120.0),
        spec(sshd_factory, free_port(), name="closed"),
    ]
    source = SshSource(specs, options(tmp_path, a100))
    try:
        wait_until(lambda: source.poll()[0].state == HostState.OK, 30, "the good host's first reading",
                   detail=lambda: [h.snapshot.message for h in source.hosts])
        for _ in range(3):
            before = time.time()
            good, silent, closed = source.poll()  # waits for the connected host only
            assert good.state == HostState.OK and good.time >= before  # polled in this round, not an old reading
            assert silent.state == HostState.CONNECTING  # still trying, in its own thread
            assert closed.state == HostState.UNREACHABLE and "refused" in (closed.message or "")
        assert source.hosts[1].busy and source.hosts[0].attempts == 1
    finally:
        source.close()


def test_a_round_with_settle_waits_for_the_slow_host_s_verdict(
        sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path, silent_port: int) -> None:
    specs = [spec(sshd_factory, a100.port, name="good"), spec(sshd_factory, silent_port, name="silent", connect_timeout=1.0)]
    source = SshSource(specs, options(tmp_path, a100))
    try:
        good, silent = source.poll(settle=True)
        assert good.state == HostState.OK
        assert silent.state == HostState.UNREACHABLE and "no SSH handshake" in (silent.message or "")
    finally:
        source.close()


def test_hung_command_is_bounded_and_the_connection_kept(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    server = sshd_factory("hang")
    try:
        host = SshHost(spec(sshd_factory, server.port, command_timeout=1.0), options(tmp_path, server))
        snap = host.poll_now()
        assert snap.state == HostState.ERROR and "no answer within 1 s" in (snap.message or "")
        assert host.connected and host.attempts == 1
        host.close()
    finally:
        server.stop()


def test_reconnects_after_the_server_comes_back(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    server = sshd_factory("r550-rtx4090")
    clock = Clock()
    source = SshSource([spec(sshd_factory, server.port)], options(tmp_path, server), clock=clock)
    try:
        assert source.poll(settle=True)[0].state == HostState.OK
        server.stop()
        wait_until(lambda: not source.hosts[0].connected, 30, "the client to see the connection close")
        (snap,) = source.poll(settle=True)
        assert snap.state == HostState.UNREACHABLE and "refused" in (snap.message or ""), snap.message
        server.start()
        clock.now += 61
        (snap,) = source.poll(settle=True)
        assert snap.state == HostState.OK and len(snap.gpus) == 1 and source.hosts[0].attempts >= 2
    finally:
        source.close()
        server.stop()


def test_close_while_connecting_keeps_no_connection(sshd_factory: SshdFactory, a100: Sshd, tmp_path: Path) -> None:
    source = SshSource([spec(sshd_factory, a100.port)], options(tmp_path, a100))
    (snap,) = source.poll()  # starts connecting; a round does not wait for a connecting host
    assert snap.state == HostState.CONNECTING
    source.close()
    host = source.hosts[0]
    assert host.done.wait(5) and not host.connected


def test_throttle_reasons_and_process_columns_over_ssh(sshd_factory: SshdFactory, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    server = sshd_factory("r580-h100x8")
    old = sshd_factory("r470-k80-reasons")
    try:
        host = SshHost(spec(sshd_factory, server.port), options(tmp_path, server))
        snap = host.poll_now()
        assert snap.state == HostState.OK and len(snap.gpus) == 8
        assert [g.throttle for g in snap.gpus[:3]] == [(), ("power-cap",), ("sw-thermal", "hw-thermal")]
        init = snap.gpus[0].processes[0]
        assert init.pid == 1 and init.user == "root" and init.rss_mib and init.running_s and init.cpu_pct is not None
        host.close()
        calls: list[str] = []  # the requests on the host's poll channel
        k80 = SshHost(spec(sshd_factory, old.port), options(tmp_path, old))
        real_request = pollchannel.poll_request
        monkeypatch.setattr(pollchannel, "poll_request", lambda *a: calls.append(real_request(*a).decode()) or real_request(*a))
        first = k80.poll_now()
        assert [g.throttle for g in first.gpus] == [("power-cap",), ("idle",)] and len(calls) == 2  # asked again once
        assert [g.throttle for g in k80.poll_now().gpus] == [("power-cap",), ("idle",)] and len(calls) == 3
        assert "clocks_throttle_reasons.active" in calls[-1] and "clocks_event_reasons" not in calls[-1]
        k80.close()
    finally:
        server.stop()
        old.stop()


def test_the_test_sshd_takes_new_ports_when_its_port_was_taken(tmp_path: Path) -> None:
    """A port the fixture found free can be taken before sshd binds it (seen beside two CPU hogs):
    the fixture starts again on new ports rather than failing the test that needed a host."""
    import socket

    from .sshd_fixture import Sshd, keygen

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    server = Sshd(tmp_path, [port], keygen(tmp_path / "host"), keygen(tmp_path / "user"), None)
    try:
        server.start()
        assert server.port != port and server.process is not None and server.process.poll() is None
        assert "Address already in use" not in server.log.read_text()  # the log of the start that worked
    finally:
        server.stop()
        taken.close()


def test_a_process_s_ps_row_is_read_once_then_every_refresh_or_every_poll_for_a_table(
        sshd_factory: SshdFactory, tmp_path: Path) -> None:
    """`ps` (a wrapper on the host's PATH that logs each call) runs at the first poll, not at the
    next ones (the rows are the master's, their ages moved on), again after PS_REFRESH_S, and at
    every poll while a process table wants fresh rows. The fixture's other pids do not exist
    here: kept as unknown, they are not looked up at every poll either."""
    server = sshd_factory("r535-a100x8")
    log = tmp_path / "ps.log"
    logging_ps(server.root / "bin", log)
    calls = lambda: len(log.read_text().splitlines()) if log.exists() else 0  # noqa: E731
    clock = Clock()
    host = SshHost(spec(sshd_factory, server.port), options(tmp_path, server), clock)
    try:
        first = host.poll_now()
        assert first.state == HostState.OK, first.message
        init = first.gpus[0].processes[0]
        read = calls()  # one a request: the first poll asks again without the fields this driver rejects
        assert init.pid == 1 and init.user == "root" and init.running_s is not None and read >= 1
        clock.now += 3.0
        again = host.poll_now().gpus[0].processes[0]
        assert (again.user, again.name, again.running_s) == ("root", init.name, init.running_s + 3.0) and calls() == read
        clock.now += ssh.PS_REFRESH_S
        assert host.poll_now().gpus[0].processes[0].user == "root" and calls() == read + 1
        source = SshSource([spec(sshd_factory, server.port)], options(tmp_path, server))
        Telemetry(None, source).want_process_sm(True)  # a process table is shown
        assert [h.fresh_ps for h in source.hosts] == [True]
        host.fresh_ps = True
        host.poll_now()
        host.poll_now()
        assert calls() == read + 3
    finally:
        host.close()
        server.stop()
