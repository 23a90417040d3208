"""Where ranks meet, bound where gputui says and nowhere else, and keyed by a secret.

torch's TCPStore listens on every interface (`[::]`) whatever host it is given, so gputui binds
each store's socket itself and hands it over (`master_listen_fd`):
- the rendezvous store on 127.0.0.1 (slaves reach it through their SSH connection);
- the workers' own store on the address their rank 0 advertises (MASTER_ADDR).
Any account on a node can still connect to those sockets (the port is in `ps`). So nothing
read from a store is unpickled (torchrun's c10d rendezvous does: gputui.train.launch
replaces it), and every key gputui's launchers and workers use starts with a random token
(`token_prefix`) that only this account holds (an environment variable, or a 0600 file on a
slave): another account cannot name those keys, so it can at most make a run fail.
Processes started for a run also get an environment without credentials.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

LOOPBACK = "127.0.0.1"
BACKEND = "gputui"  # torchrun's --rdzv-backend for gputui's static rendezvous (gputui.train.launch)
LAUNCHER = "gputui.train.launch"  # `python -m LAUNCHER TORCHRUN-ARGS`: torchrun knowing that backend
TOKEN_ENV = "GPUTUI_RDZV_TOKEN"  # the secret itself (a process's environment is private to its account)
TOKEN_FILE_ENV = "GPUTUI_RDZV_TOKEN_FILE"  # or a 0600 file holding it (how a slave gets it: never a command line)
_TOKEN = re.compile(r"^[0-9a-f]{32,128}$")

# Names that carry credentials: cloud keys, tokens, passwords, the SSH agent.
_SECRET = re.compile(r"^(AWS_|AZURE_|GOOGLE_APPLICATION_CREDENTIALS$|SSH_AUTH_SOCK$)|"
                     r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.IGNORECASE)


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables that hold credentials (what a trainer must never inherit)."""
    return {k: v for k, v in env.items() if not _SECRET.search(k)}


def new_token() -> str:
    """A fresh rendezvous secret (128 bits, hex)."""
    return secrets.token_hex(16)


def read_token(env: Mapping[str, str]) -> str:
    """The rendezvous secret from `env` (TOKEN_ENV, else the file TOKEN_FILE_ENV names); a
    ValueError in one line when there is none."""
    token = env.get(TOKEN_ENV, "").strip()
    if not token and env.get(TOKEN_FILE_ENV):
        path = env[TOKEN_FILE_ENV]
        try:
            with open(path, encoding="ascii") as fh:
                token = fh.read(256).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the rendezvous token in {path}: {getattr(exc, 'strerror', None) or exc}") \
                from None
    if not _TOKEN.match(token):
        raise ValueError(f"no rendezvous token ({TOKEN_ENV} or {TOKEN_FILE_ENV}): start the run with gputui")
    return token


def token_prefix(token: str, *parts: object) -> str:
    """The key prefix of everything gputui keeps in a store: only the token's holder can name those keys."""
    return "/".join(["gputui", token, *(str(p) for p in parts)]) + "/"


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


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
QUIET_PORTS = (10000, 32768)  # below Linux's default ephemeral range (32768-60999)


def quiet_ports(ranges: str | None = None) -> tuple[int, int]:
    """Ports [low, high) that the kernel never hands out by itself: below this machine's ephemeral
    range (`ranges`: that file's text), whose ports go to every connect() and every bind to port 0."""
    try:
        text = ranges if ranges is not None else Path(EPHEMERAL_RANGE).read_text(encoding="ascii")
        ephemeral_low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return QUIET_PORTS
    low = QUIET_PORTS[0]
    return (low, ephemeral_low) if ephemeral_low - low >= 1000 else QUIET_PORTS


def workers_port(host: str, tries: int = 20) -> int:
    """A free port on `host` for the workers' store, which rank 0 binds seconds later (once its
    Python and torch are up). torch picks an ephemeral one, and in those seconds any connection
    on the machine can take it as its own local port (EADDRINUSE: seen with four test workers
    on two cores). This one is drawn from the quiet ports, free when drawn; 0 (torch's own pick)
    when none of `tries` was."""
    low, high = quiet_ports()
    for _ in range(tries):
        port = random.randrange(low, high)
        try:
            listen_socket(host, port).close()
        except OSError:
            continue
        return port
    return 0


def serve_store(host: str, port: int, timeout_s: float, world_size: int | None = None) -> Any:
    """A TCPStore server listening on `host:port` only (not on every interface).

    torch takes the listening socket over (TCPStoreOptions.masterListenFd: it closes it when the
    store goes), so gputui hands it over and keeps no copy: the number is closed once, by its one
    owner. It stops listening when the store is gone. (gputui used to keep the socket too and close
    it at the run's end; torch's own close, later, then hit whatever file the process had opened
    under that number since: a DDP run's stop thread saw "Bad file descriptor".)"""
    import torch.distributed as tdist

    sock = listen_socket(host, port)
    bound, made = sock.getsockname()[1], os.fstat(sock.fileno())
    fd = sock.detach()
    try:
        return getattr(tdist, "TCPStore")(host, bound, world_size, is_master=True, wait_for_workers=False,
                                          master_listen_fd=fd, timeout=timedelta(seconds=timeout_s))
    except BaseException:
        _close_if_still(fd, made)
        raise


def _close_if_still(fd: int, made: os.stat_result) -> None:
    """Close `fd` if it is still the socket that was made (a store that failed to start may or may
    not have closed it; the number may be another file's by now)."""
    try:
        now = os.fstat(fd)
    except OSError:
        return
    if (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
        os.close(fd)


def worker_store(rank: int, world_size: int, timeout_s: float = 600.0) -> Any:
    """The workers' store at MASTER_ADDR:MASTER_PORT: rank 0 serves it on that address alone
    (torch's env:// would listen on every interface), its keys under the run's token when the
    launcher passed one (another account reaching the port cannot name them)."""
    import torch.distributed as tdist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        store = serve_store(host, port, timeout_s, world_size)
    else:
        store = getattr(tdist, "TCPStore")(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
    token = os.environ.get(TOKEN_ENV)
    return getattr(tdist, "PrefixStore")(token_prefix(token, "workers"), store) if token else store
