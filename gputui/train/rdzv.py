"""Where ranks meet, bound where gputui says and nowhere else.

torch's TCPStore listens on every interface (`[::]`) whatever host it is given, and the c10d
rendezvous store feeds torchrun's agents `pickle` data: whoever reaches it runs code on the
nodes. So gputui binds each store's socket itself and hands it over (`master_listen_fd`):
- the rendezvous store on 127.0.0.1 (slaves reach it through their SSH connection);
- the workers' own store on the address their rank 0 advertises (MASTER_ADDR).
Processes started for a run also get an environment without credentials.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from typing import Any, Mapping

LOOPBACK = "127.0.0.1"
# Sockets handed to a TCPStore must outlive it (the store does not own them): kept here,
# by the store's id, until `release`.
_KEEP: dict[int, socket.socket] = {}

# Names that carry credentials: cloud keys, tokens, passwords, the SSH agent.
_SECRET = re.compile(r"^(AWS_|AZURE_|GOOGLE_APPLICATION_CREDENTIALS$|SSH_AUTH_SOCK$)|"
                     r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.IGNORECASE)


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables that hold credentials (what a trainer must never inherit)."""
    return {k: v for k, v in env.items() if not _SECRET.search(k)}


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on exactly `host:port` (port 0: any free one)."""
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


def serve_store(host: str, port: int, timeout_s: float, world_size: int | None = None) -> Any:
    """A TCPStore server listening on `host:port` only (not on every interface)."""
    import torch.distributed as tdist

    sock = listen_socket(host, port)
    try:
        store = getattr(tdist, "TCPStore")(host, sock.getsockname()[1], world_size, is_master=True,
                                           wait_for_workers=False, master_listen_fd=sock.fileno(),
                                           timeout=timedelta(seconds=timeout_s))
    except BaseException:
        sock.close()
        raise
    _KEEP[id(store)] = sock
    return store


def release(store: Any) -> None:
    """Stop listening for a store that `serve_store` made (its run is over)."""
    sock = _KEEP.pop(id(store), None)
    if sock is not None:
        sock.close()


def worker_store(rank: int, world_size: int, timeout_s: float = 600.0) -> Any:
    """The workers' store at MASTER_ADDR:MASTER_PORT: rank 0 serves it on that address alone.
    (torch's env:// would listen on every interface.)"""
    import torch.distributed as tdist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        return serve_store(host, port, timeout_s, world_size)
    return getattr(tdist, "TCPStore")(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
