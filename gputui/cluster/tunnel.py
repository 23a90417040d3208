"""A port on a slave's loopback that leads, through the SSH connection the master already
holds, to a port on the master's loopback: how slaves reach the rendezvous store without
the store ever listening on a network (`ssh -R 127.0.0.1:0:127.0.0.1:PORT`, in paramiko).

It also works for a master behind NAT: the slave never connects to the master.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"


def _pump(channel: Any, target_port: int) -> None:
    """Copy bytes both ways between one forwarded channel and the master's local port."""
    try:
        sock = socket.create_connection((LOOPBACK, target_port), timeout=10)
    except OSError as exc:
        log.debug("tunnel: cannot reach %s:%d: %s", LOOPBACK, target_port, exc)
        channel.close()
        return
    sock.settimeout(None)
    try:
        while True:
            ready, _, _ = select.select([sock, channel], [], [], 30)
            if sock in ready:
                data = sock.recv(65536)
                if not data:
                    break
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(65536)
                if not data:
                    break
                sock.sendall(data)
            if not ready and (channel.closed or channel.get_transport() is None
                              or not channel.get_transport().is_active()):
                break
    except (OSError, EOFError) as exc:
        log.debug("tunnel to port %d closed: %s", target_port, exc)
    finally:
        sock.close()
        channel.close()


class ReverseForward:
    """`port` on the slave's 127.0.0.1 forwarded to `target_port` on the master's 127.0.0.1."""

    def __init__(self, transport: Any, target_port: int, name: str = "slave") -> None:
        self.transport = transport
        self.target_port = target_port

        def accept(channel: Any, _origin: Any, _server: Any) -> None:  # runs in paramiko's thread: no blocking
            threading.Thread(target=_pump, args=(channel, target_port), name=f"gputui-tunnel-{name}",
                             daemon=True).start()

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
