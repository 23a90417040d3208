"""SshSource at scale, against real OpenSSH sshd processes on 127.0.0.1: bounded threads, one
long-lived poll channel per host, a hung host holding no worker, a dying poll channel replaced,
the output caps on the poll channel. (How fast a round is: benchmarks/bench_ssh_poll.py.)"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostState
from gputui.sources.hostkeys import SshOptions
from gputui.sources.ssh import SshSource
from gputui.sources.sshloop import CONNECT_WORKERS_CAP, POLL_WORKERS_CAP, Pool, pool_sizes
from tests.proc_support import wait_until
from tests.sshd_fixture import Sshd, SshdFactory, free_port, no_agent, sshd_factory  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_agent")


@pytest.fixture(scope="module")
def many(sshd_factory: SshdFactory) -> Sshd:
    """One sshd serving 12 ports: 12 hosts."""
    return sshd_factory("r535-a100x8", ports=12)


def options(tmp_path: Path, *servers: Sshd) -> SshOptions:
    known = tmp_path / "known_hosts"
    known.write_text("".join(s.known_hosts_line(p) for s in servers for p in s.ports))
    return SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gputui_known_hosts", ssh_config=None)


def specs(factory: SshdFactory, server: Sshd, prefix: str = "h", **more: Any) -> list[HostSpec]:
    values: dict[str, Any] = dict(address="127.0.0.1", user="root", identity_file=factory.user_key, connect_timeout=30.0,
                                  command_timeout=30.0)
    values.update(more)
    return [HostSpec(name=f"{prefix}{i}", port=p, **values) for i, p in enumerate(server.ports)]


def all_ok(source: SshSource) -> None:
    wait_until(lambda: all(h.state == HostState.OK for h in source.poll(settle=True)), 120, "every host's first reading",
               detail=lambda: {h.spec.name: h.snapshot.message for h in source.hosts if h.snapshot.state != HostState.OK})


def wrapped_server(factory: SshdFactory, root: Path, fixture: str | Path, wrapper: str) -> Sshd:
    """An sshd whose nvidia-smi runs `wrapper` (sh) before the fake nvidia-smi replaying `fixture`."""
    root.mkdir()
    wrap_dir = root / "wrap"
    wrap_dir.mkdir()
    (wrap_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{wrapper}\nexec {root / 'bin' / 'nvidia-smi'} \"$@\"\n")
    (wrap_dir / "nvidia-smi").chmod(0o755)
    server = Sshd(root, [free_port()], factory.host_key, factory.user_key, str(fixture), path=f"{wrap_dir}:/usr/bin:/bin")
    factory.servers.append(server)
    return server.start()


def test_pool_sizes_come_from_the_machine_and_are_capped() -> None:
    assert pool_sizes(1) == (1, 1)
    poll, connect = pool_sizes(256)
    assert 2 <= poll <= POLL_WORKERS_CAP and connect == CONNECT_WORKERS_CAP


def test_a_pool_runs_at_most_its_size_at_once() -> None:
    pool = Pool("gputui-test-pool", 2)
    release = threading.Event()
    started = threading.Semaphore(0)
    done = threading.Semaphore(0)

    def job() -> None:
        started.release()
        assert release.wait(30), "the test never released the jobs"
        done.release()

    for _ in range(5):
        pool.submit(job)
    assert started.acquire(timeout=30) and started.acquire(timeout=30), "two jobs did not start"
    assert pool.running == 2 and pool.threads == 2  # the other three wait in the queue
    release.set()
    for _ in range(5):
        assert done.acquire(timeout=30), "a queued job never ran"
    assert pool.peak == 2 and pool.threads == 2
    pool.close()


def test_rounds_over_12_hosts_start_no_thread_per_host(sshd_factory: SshdFactory, many: Sshd, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    source = SshSource(specs(sshd_factory, many), options(tmp_path, many), workers=2)
    try:
        all_ok(source)
        started: list[str] = []
        real_start = threading.Thread.start
        def counted_start(thread: threading.Thread) -> None:
            started.append(thread.name)
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted_start)
        for _ in range(3):
            snaps = source.poll()
            assert all(h.state == HostState.OK and len(h.gpus) == 8 for h in snaps), [h.message for h in snaps]
        assert len(started) <= source.pool.size, started  # at most the pool's workers (one per host per round before)
        assert source.pool.peak <= 2 and source.pool.threads <= 2
    finally:
        source.close()


def test_the_poll_channel_is_opened_once_and_reused_across_rounds(sshd_factory: SshdFactory, many: Sshd, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import paramiko

    opened: list[str] = []
    real_open = paramiko.Transport.open_session
    def counted_open(transport: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append("session")
        return real_open(transport, *args, **kwargs)

    monkeypatch.setattr(paramiko.Transport, "open_session", counted_open)
    source = SshSource(specs(sshd_factory, many)[:4], options(tmp_path, many))
    try:
        all_ok(source)
        for _ in range(5):
            assert all(h.state == HostState.OK for h in source.poll())
        assert len(opened) == 4  # one channel per host for all its polls (one per poll before)
        assert [h.loops_opened for h in source.hosts] == [1, 1, 1, 1] and all(h.attempts == 1 for h in source.hosts)
    finally:
        source.close()


def test_a_hung_host_holds_no_worker_the_others_need(sshd_factory: SshdFactory, many: Sshd, tmp_path: Path) -> None:
    trigger = tmp_path / "hang-now"
    # Once the trigger is there, its nvidia-smi answers only after the test is over.
    hung = wrapped_server(sshd_factory, tmp_path / "hung", "r535-a100x8", f"[ -f {trigger} ] && sleep 600")
    hosts = [HostSpec(name="hung", address="127.0.0.1", port=hung.port, user="root", identity_file=sshd_factory.user_key,
                      connect_timeout=30.0, command_timeout=600.0), *specs(sshd_factory, many)[:3]]
    source = SshSource(hosts, options(tmp_path, many, hung), workers=1)  # one poll worker for all four
    try:
        all_ok(source)
        trigger.write_text("")
        source.poll(wait=0)  # the hung host's poll is the first the one worker takes
        wait_until(lambda: not any(h.busy for h in source.hosts[1:]), 60, "the good hosts' polls beside the hung one")
        for _ in range(3):
            before = max(h.snapshot.time for h in source.hosts[1:])
            snaps = source.poll(wait=60)  # waits for the good hosts only: the hung one is still at its poll
            assert all(s.state == HostState.OK and s.time > before for s in snaps[1:]), [s.message for s in snaps]
            assert source.hosts[0].busy and snaps[0].state == HostState.OK  # its last reading, from before
        assert source.pool.peak == 1
    finally:
        source.close()
        hung.stop()


def test_a_poll_channel_that_dies_mid_poll_is_answered_and_replaced(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    trigger = tmp_path / "kill-the-loop"
    # Once the trigger is there, the first nvidia-smi kills the shell that ran it (the poll channel's loop).
    server = wrapped_server(sshd_factory, tmp_path / "dies", "r535-a100x8",
                            f'[ -f {trigger} ] && {{ rm -f {trigger}; kill -9 "$PPID"; exit 1; }}')
    spec = HostSpec(name="dies", address="127.0.0.1", port=server.port, user="root", identity_file=sshd_factory.user_key,
                    connect_timeout=30.0, command_timeout=30.0)
    source = SshSource([spec], options(tmp_path, server))
    host = source.hosts[0]
    try:
        all_ok(source)
        assert host.loops_opened == 1
        trigger.write_text("")
        before = host.snapshot.time
        (snap,) = source.poll()
        assert not trigger.exists()  # the loop was killed in this round
        assert snap.state == HostState.OK and len(snap.gpus) == 8 and snap.time > before, snap  # answered by a command of its own
        for _ in range(3):
            (snap,) = source.poll()
            assert snap.state == HostState.OK and len(snap.gpus) == 8, snap.message
        assert host.loops_opened == 2 and host.attempts == 1  # a new poll channel, used from then on; the same connection
    finally:
        source.close()
        server.stop()


def test_poll_channels_cut_off_mid_stream_never_take_their_connection(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    """A host that never stops talking: each poll is cut off by the output cap and its channel
    closed while data still streams in. Through Channel.fileno()'s pipe that close raced paramiko's
    transport thread, which then wrote to a closed descriptor and ended the connection (within
    about 30 polls here, every time); the reader's signal holds no descriptor."""
    flood = wrapped_server(sshd_factory, tmp_path / "flood", "r535-a100x8", 'exec yes "0, NVIDIA H100, 100, 80"')
    spec = HostSpec(name="flood", address="127.0.0.1", port=flood.port, user="root", identity_file=sshd_factory.user_key,
                    connect_timeout=30.0, command_timeout=30.0)
    source = SshSource([spec], options(tmp_path, flood))
    host = source.hosts[0]
    host.max_bytes = 16 << 10  # cut off soon: many polls, each closed mid-stream
    try:
        for i in range(120):
            (snap,) = source.poll(settle=True)
            assert snap.state == HostState.ERROR and (snap.message or "").startswith("output over 16 KiB"), (i, snap.message)
            assert host.attempts == 1, f"poll {i}: the connection was lost ({snap.message})"
        assert host.loops_opened == 120
    finally:
        source.close()
        flood.stop()


def test_the_output_caps_hold_on_the_poll_channel_in_a_round(sshd_factory: SshdFactory, many: Sshd, tmp_path: Path) -> None:
    flood = wrapped_server(sshd_factory, tmp_path / "flood", "r535-a100x8", 'exec yes "0, NVIDIA H100, 100, 80"')
    long_line = wrapped_server(sshd_factory, tmp_path / "long", "r535-a100x8", "head -c 200000 /dev/zero | tr '\\0' x; exit 0")
    hosts = [*specs(sshd_factory, many)[:2],
             *[HostSpec(name=n, address="127.0.0.1", port=s.port, user="root", identity_file=sshd_factory.user_key,
                        connect_timeout=30.0, command_timeout=30.0) for n, s in (("flood", flood), ("long", long_line))]]
    source = SshSource(hosts, options(tmp_path, many, flood, long_line))
    try:
        for _ in range(3):
            good0, good1, flooded, long = source.poll(settle=True)
            assert good0.state == good1.state == HostState.OK
            assert flooded.state == HostState.ERROR and (flooded.message or "").startswith("output over 1024 KiB"), flooded.message
            assert long.state == HostState.ERROR and (long.message or "").startswith("a line of output over 64 KiB"), long.message
        assert [h.attempts for h in source.hosts] == [1, 1, 1, 1]  # every connection kept
        assert source.hosts[2].loops_opened == 3  # the flooded channel closed each time, a new one opened
    finally:
        source.close()
        flood.stop()
        long_line.stop()
