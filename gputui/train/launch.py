"""torchrun with gputui's own rendezvous: static node ranks, a client of gputui's store, no pickle.

    python -m gputui.train.launch --nnodes=N --rdzv-backend=gputui --rdzv-endpoint=HOST:PORT \\
        --rdzv-id=ID --rdzv-conf=rank=R,timeout=S ... -m MODULE ARGS

torchrun's c10d rendezvous (dynamic_rendezvous.py) keeps its state in the store as a pickle and
unpickles what it reads back, and any account on a node can connect to the store: whoever
writes that key runs code as the training user. gputui does not need an elastic rendezvous: it
restarts a cluster's attempts itself, each with a fixed set of nodes whose ranks the master
gives. So this launcher registers a static handler (`BACKEND`) before torchrun's own `main`:
- node `rank` of `nnodes` comes from the master; nothing about membership is read from the store;
- it only connects, as a client, to the store gputui already serves on loopback (the master's
  rendezvous store; slaves reach it through their SSH tunnel), so it opens no socket itself;
- every key lives under the run's secret token (gputui.train.rdzv.token_prefix), the rendezvous
  id and the round (an in-place restart is a new round): another account reaching the store
  cannot name them, and torch's agent reads only JSON and plain strings there;
- `use_agent_store` is False: each rank 0 worker serves the workers' own store on MASTER_ADDR
  (gputui.train.rdzv.worker_store), under the token too.

One-machine DDP uses the same handler with one node (gputui.train.distributed): one code path,
tested both ways, rather than a second (FileStore) one.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import sys
import tempfile
from datetime import timedelta
from typing import Sequence

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from gputui.model.pids import process_alive
from gputui.train.rdzv import BACKEND, TOKEN_ENV, read_token, token_prefix, workers_port

DEFAULT_TIMEOUT_S = 600


class StaticRendezvous(RendezvousHandler):
    """Node `rank` of `world_size`, meeting in the store at `host:port` under `prefix`."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, run_id: str, token: str,
                 timeout_s: float, local_addr: str | None) -> None:
        self.host, self.port = host, port
        self.rank, self.world_size = rank, world_size
        self.run_id = run_id
        self.token = token
        self.timeout = timedelta(seconds=timeout_s)
        self.local_addr = local_addr
        self.round = 0  # torchrun restarts the group in place: every node enters the next round
        self._store: Store | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)
        store = PrefixStore(token_prefix(self.token, self.run_id, self.round), self._store)
        self.round += 1
        # Node rank 0 picks the workers' store address (its --local-addr) and a free port, one the
        # kernel hands to no connection meanwhile (workers_port); the others read them back: plain
        # strings (RendezvousStoreInfo.build), as are torch's rank assignments (JSON).
        port = workers_port(self.local_addr or socket.getfqdn()) if self.rank == 0 else 0
        bootstrap = RendezvousStoreInfo.build(self.rank, store, self.local_addr, server_port=port or None)
        return RendezvousInfo(store, self.rank, self.world_size, bootstrap)

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0  # no node joins a running group: the master relaunches the attempt

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's registry calls this with torchrun's arguments; a ValueError names what is wrong."""
    if params.min_nodes != params.max_nodes:
        raise ValueError(f"--nnodes must be one number for the {BACKEND} rendezvous, not "
                         f"{params.min_nodes}:{params.max_nodes}")
    host, port = parse_rendezvous_endpoint(params.endpoint, -1)
    if port <= 0:
        raise ValueError(f"--rdzv-endpoint needs host:port, not {params.endpoint!r}")
    rank = params.get_as_int("rank")
    if rank is None or not 0 <= rank < params.max_nodes:
        raise ValueError(f"--rdzv-conf needs rank=R with 0 <= R < {params.max_nodes}")
    timeout = params.get_as_int("timeout", DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S
    token = read_token(os.environ)
    return StaticRendezvous(host, port, rank, params.max_nodes, params.run_id, token, timeout, params.local_addr)


LOG_DIR_PREFIX = "gputui-torchrun-"  # then the launcher's pid, "-", mkdtemp's random part


def sweep_log_dirs(tmp: str) -> None:
    """Remove the torchrun directories that killed launchers of this account left in `tmp` (the
    supervisor kills a launcher left alone after its workers): a directory of ours, not a link,
    named for a process that is gone. Another account's entries, and live launchers', stay."""
    uid = os.getuid()
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(LOG_DIR_PREFIX)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(LOG_DIR_PREFIX):].split("-", 1)[0]
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not pid.isdigit() or not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or process_alive(int(pid)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """torchrun's main with the `gputui` backend registered; one line on stderr when the
    rendezvous cannot be set up (no token, bad arguments)."""
    from torch.distributed import run as torchrun

    try:
        token = read_token(os.environ)
    except ValueError as exc:
        print(f"gputui launcher: {exc}", file=sys.stderr)
        return 2
    os.environ[TOKEN_ENV] = token  # the workers key their own store with it (gputui.train.rdzv.worker_store)
    rendezvous_handler_registry.register(BACKEND, create_handler)
    from torch.distributed.elastic.multiprocessing.api import SignalException

    # torchrun's per-rank directories (error files; logs when redirected): without --log-dir it
    # makes them in a torchelastic_* directory of its own in $TMPDIR and leaves it there, one a
    # launch. This one goes when torchrun ends (gputui passes no --log-dir of its own), or at the
    # next launch when this launcher was killed.
    try:
        sweep_log_dirs(tempfile.gettempdir())
        log_dir = tempfile.mkdtemp(prefix=f"{LOG_DIR_PREFIX}{os.getpid()}-")
    except OSError as exc:
        print(f"gputui launcher: cannot make torchrun's directory in {tempfile.gettempdir()}: "
              f"{exc.strerror or exc}; free space there or point TMPDIR elsewhere", file=sys.stderr)
        return 2
    args = [f"--log-dir={log_dir}", *(sys.argv[1:] if argv is None else argv)]
    try:
        torchrun.main(args)
    except SystemExit as exc:  # torchrun's @record ends with sys.exit(1) on a failed worker
        return exc.code if isinstance(exc.code, int) else 1
    except SignalException as exc:  # stopped (SIGTERM from gputui): its workers got it too; no traceback
        return 128 + int(getattr(exc, "sigval", 15))
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
