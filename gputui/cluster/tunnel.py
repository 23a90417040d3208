"""A port on a slave's loopback that leads, through the SSH connection the master already
holds, to a port on the master's loopback: how slaves reach the rendezvous store without
the store ever listening on a network (`ssh -R 127.0.0.1:0:127.0.0.1:PORT`, in paramiko).

It also works for a master behind NAT: the slave never connects to the master.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"


def _pump(channel: Any, target_port: int) -> None:
    """Copy bytes both ways between one forwarded channel and the master's local port, until
    either side ends (then both are closed): the master's port to the channel in a thread of its
    own, the channel to the port in this one. Blocking reads on both, never select() on the
    channel: Channel.fileno()'s pipe is written by paramiko's transport thread with no lock
    against Channel.close() (paramiko #1700, #2271), so closing a channel the slave still sends
    on could end the whole SSH connection (the slave's run with it)."""
    try:
        sock = socket.create_connection((LOOPBACK, target_port), timeout=10)
    except OSError as exc:
        log.debug("tunnel: cannot reach %s:%d: %s", LOOPBACK, target_port, exc)
        channel.close()
        return
    sock.settimeout(None)
    channel.settimeout(None)

    def down() -> None:  # the master's port -> the slave
        try:
            while data := sock.recv(65536):
                channel.sendall(data)
        except (OSError, EOFError) as exc:
            log.debug("tunnel to port %d: %s", target_port, exc)
        finally:
            channel.close()  # wakes the other direction's recv (it gets b"")

    other = threading.Thread(target=down, name=threading.current_thread().name + "-down", daemon=True)
    other.start()
    try:
        while data := channel.recv(65536):  # b"" at the channel's end, or its connection's
            sock.sendall(data)
    except (OSError, EOFError) as exc:
        log.debug("tunnel to port %d closed: %s", target_port, exc)
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's recv
        except OSError:
            pass
        channel.close()
        other.join(10)
        sock.close()


# Connections open at once through one slave's tunnel. A node's torchrun holds a few store
# connections (its agent's, each worker's); the port is on the slave's loopback, where any account
# of a shared slave can connect to it, and each connection costs the master two threads and a
# connection to the store: past this many, more are closed at once.
MAX_CONNECTIONS = 128


class ReverseForward:
    """`port` on the slave's 127.0.0.1 forwarded to `target_port` on the master's 127.0.0.1,
    at most `max_connections` connections at once."""

    def __init__(self, transport: Any, target_port: int, name: str = "slave",
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.transport = transport
        self.target_port = target_port
        self.max_connections = max_connections
        self.connections = 0  # connections through it now
        self.refused = 0  # connections closed at once, past max_connections
        lock = threading.Lock()

        def pump(channel: Any) -> None:
            try:
                _pump(channel, target_port)
            finally:
                with lock:
                    self.connections -= 1

        def accept(channel: Any, _origin: Any, _server: Any) -> None:  # runs in paramiko's thread: no blocking
            with lock:
                refuse = self.connections >= self.max_connections
                if refuse:
                    self.refused += 1
                else:
                    self.connections += 1
            if refuse:
                if self.refused == 1:  # said once: a flood of them must not flood the run's output
                    log.warning("tunnel of %s: %d connections open already; more are closed at once", name,
                                self.max_connections)
                threading.Thread(target=channel.close, name=f"gputui-tunnel-{name}-refuse", daemon=True).start()
                return
            threading.Thread(target=pump, args=(channel,), name=f"gputui-tunnel-{name}", daemon=True).start()

        self.port = int(transport.request_port_forward(LOOPBACK, 0, handler=accept))

    @property
    def endpoint(self) -> str:
        """host:port of the forward, as the slave's processes see it."""
        return f"{LOOPBACK}:{self.port}"

    def close(self) -> None:
        try:
            if self.transport.is_active():
                self.transport.cancel_port_forward(LOOPBACK, self.port)
        except Exception:  # noqa: BLE001 - the connection is already gone
            pass
