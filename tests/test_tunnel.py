"""The reverse tunnel a slave reaches the rendezvous store through (gputui.cluster.tunnel),
against a real sshd on loopback: bytes go both ways, and one forwarded connection ending never
ends the SSH connection the slave's run is on."""

from __future__ import annotations

import shlex
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gputui.cluster.sshnode import SlaveConnection
from gputui.config.hosts import HostSpec
from tests.cluster_fixture import trust
from tests.sshd_fixture import SshdFactory, no_agent, sshd_factory  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_agent")

# The slave's side: connect to the forwarded port ROUNDS times; each time say hello, read the
# master's answer, then send without pause until the connection is closed under it (the master
# closes it while the bytes still come).
SLAVE = r"""
import socket, sys
port, rounds = int(sys.argv[1]), int(sys.argv[2])
for i in range(rounds):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"hello %d\n" % i)
    answer = s.recv(64)
    assert answer == b"ok %d\n" % i, answer
    try:
        while True:
            s.sendall(b"x" * 65536)
    except OSError:
        pass
    s.close()
print("slave done", flush=True)
"""

ROUNDS = 40


def test_forwarded_connections_closed_mid_stream_never_end_the_ssh_connection(sshd_factory: SshdFactory,
                                                                              gputui_home: Path) -> None:
    """The master's side of each forwarded connection closes while the slave still sends. Through
    select() on the channel (Channel.fileno()'s pipe) that close raced paramiko's transport thread
    (paramiko #1700, #2271), which then wrote to a closed descriptor and ended the whole SSH
    connection: the slave's run, its output and its exit status with it."""
    server = sshd_factory(None)
    trust(gputui_home, server)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(120)
    served: list[bytes] = []

    def master_side() -> None:  # the rendezvous store's stand-in: answer the hello, then hang up
        try:
            for _ in range(ROUNDS):
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(60)
                    hello = b""
                    while not hello.endswith(b"\n"):
                        hello += conn.recv(64)
                    served.append(hello)
                    conn.sendall(hello.replace(b"hello", b"ok"))
                    conn.recv(1024)  # the stream has begun: close under it
        except OSError as exc:
            served.append(f"master side failed: {exc}".encode())

    thread = threading.Thread(target=master_side, daemon=True)
    thread.start()
    node = SlaveConnection(HostSpec("n0", server.address, server.port, "root", sshd_factory.user_key,
                                    connect_timeout=30.0)).open_or_raise()
    try:
        forward = node.forward_to_master(listener.getsockname()[1])
        channel = node.open(f"{shlex.quote(sys.executable)} -c {shlex.quote(SLAVE)} {forward.port} {ROUNDS}")
        assert channel.status_event.wait(180), "the slave's script did not end within 180 s"
        output = b""
        while chunk := channel.recv(65536):
            output += chunk
        assert channel.recv_exit_status() == 0, output.decode(errors="replace")[-2000:]
        assert output.strip().endswith(b"slave done"), output[-2000:]
        assert served == [b"hello %d\n" % i for i in range(ROUNDS)], served[-3:]
        transport = node.transport()
        assert transport is not None and transport.is_active(), "the SSH connection ended"
        assert node.check("echo still here", 60, "a command after the tunnels").strip() == "still here"
    finally:
        node.close()
        listener.close()
        thread.join(30)


HOLDER = r"""
import socket, sys
port = int(sys.argv[1])

def hello(s, i):
    s.sendall(b"hello %d\n" % i)
    try:
        return s.recv(64)
    except OSError:
        return b""

held = []
for i in range(2):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    held.append(s)
    print("held", i, hello(s, i), flush=True)
for extra in range(3):  # past the cap: each closed at once
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    print("extra", hello(s, 2), flush=True)
    s.close()
held.pop(0).close()
print("closed one", flush=True)
sys.stdin.readline()  # the test says when the master has seen it end
s = socket.create_connection(("127.0.0.1", port), timeout=60)
print("after one ended", hello(s, 3), flush=True)
"""


def read_until(channel: Any, marker: bytes, timeout: float) -> bytes:
    """What `channel` says up to and including `marker` (AssertionError after `timeout` s)."""
    channel.settimeout(timeout)
    said = b""
    while marker not in said:
        try:
            chunk = channel.recv(65536)
        except socket.timeout:
            chunk = b""
        assert chunk, f"the slave's script did not say {marker!r} within {timeout:g} s: {said[-2000:]!r}"
        said += chunk
    return said


def test_a_tunnel_takes_at_most_its_connections_and_lets_one_in_when_one_ends(sshd_factory: SshdFactory,
                                                                            gputui_home: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Any account of a shared slave can connect to the forwarded port on its loopback: past the
    cap a connection is closed at once, costing the master no thread and no store connection."""
    from gputui.cluster.tunnel import ReverseForward
    from tests.proc_support import wait_until

    server = sshd_factory(None)
    trust(gputui_home, server)
    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(64), b"")],
                             daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    node = SlaveConnection(HostSpec("n0", server.address, server.port, "root", sshd_factory.user_key,
                                    connect_timeout=30.0)).open_or_raise()
    try:
        transport = node.transport()
        forward = ReverseForward(transport, listener.getsockname()[1], "n0", max_connections=2)
        channel = node.open(f"{shlex.quote(sys.executable)} -c {shlex.quote(HOLDER)} {forward.port}")
        output = read_until(channel, b"closed one\n", 120)
        wait_until(lambda: forward.connections == 1, 30, "the master to see the closed connection end",
                   detail=lambda: forward.connections)
        channel.sendall(b"go\n")
        assert channel.status_event.wait(120), "the slave's script did not end within 120 s"
        while chunk := channel.recv(65536):
            output += chunk
        lines = output.decode(errors="replace").splitlines()
        assert lines[:5] == ["held 0 b'hello 0\\n'", "held 1 b'hello 1\\n'", *["extra b''"] * 3], lines
        assert lines[5:] == ["closed one", "after one ended b'hello 3\\n'"], lines
        assert forward.refused >= 3
        said = [r for r in caplog.records if "connections open already" in r.getMessage()]
        assert len(said) == 1, said  # once, however many are refused
        wait_until(lambda: forward.connections == 0, 30, "the tunnel's connections to end with the slave's script",
                   detail=lambda: forward.connections)
    finally:
        node.close()
        listener.close()
