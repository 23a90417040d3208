"""The cluster tunnel (gputui.cluster.tunnel.ReverseForward): this tree's pump against an older
commit's, over one real OpenSSH sshd on loopback, interleaved in one process.

A slave reaches the rendezvous store through the tunnel: many small round trips. Each side
forwards a port of the "slave" (this machine, through sshd) to an echo server on the master's
loopback, then times 500 round trips of 64 bytes and one 16 MiB copy there and back. Prints
the medians, and each new figure's ratio to the old. --hogs N runs N busy loops beside it.

    .venv/bin/python benchmarks/bench_tunnel.py [--old 616e0dd] [--rounds 6] [--hogs 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import paramiko  # noqa: E402

import gputui.cluster.tunnel as new  # noqa: E402
from hogs import busy_loops  # noqa: E402 - beside this script
from oldcode import module_at  # noqa: E402 - beside this script
from tests.sshd_fixture import SshdFactory  # noqa: E402

SMALL, TRIPS, BULK = 64, 500, 16 << 20


def echo_server() -> int:
    """An echo server on the master's loopback (the rendezvous store's stand-in); its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def recv_exactly(sock: socket.socket, n: int) -> None:
    while n > 0:
        data = sock.recv(min(n, 1 << 20))
        if not data:
            raise SystemExit("the tunnel closed mid-measure")
        n -= len(data)


def measure(port: int) -> tuple[float, float]:
    """(microseconds a 64-byte round trip, MiB/s there and back) through the forwarded `port`."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * SMALL
        sock.sendall(message)
        recv_exactly(sock, SMALL)  # the connection is up end to end
        began = time.perf_counter()
        for _ in range(TRIPS):
            sock.sendall(message)
            recv_exactly(sock, SMALL)
        trip_us = (time.perf_counter() - began) / TRIPS * 1e6
        began = time.perf_counter()
        reader = threading.Thread(target=recv_exactly, args=(sock, BULK))
        reader.start()
        chunk = b"y" * (1 << 20)
        for _ in range(BULK // len(chunk)):
            sock.sendall(chunk)
        reader.join(120)
        mib_s = BULK / (1 << 20) / (time.perf_counter() - began)
    return trip_us, mib_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="616e0dd", help="the commit whose tunnel is the baseline")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hogs", type=int, default=0, help="busy loops to run beside it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gputui-bench-tunnel-") as top:
        factory = SshdFactory(Path(top))
        client = paramiko.SSHClient()
        try:
            server = factory(None)
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # our own sshd, just started
            client.connect("127.0.0.1", port=server.port, username="root", key_filename=str(factory.user_key),
                           allow_agent=False, look_for_keys=False, timeout=30)
            transport = client.get_transport()
            assert transport is not None
            target = echo_server()
            sides = {"old": module_at(args.old, "gputui/cluster/tunnel.py", Path(top)), "new": new}
            forwards = {name: module.ReverseForward(transport, target, f"bench-{name}") for name, module in sides.items()}
            trips: dict[str, list[float]] = {name: [] for name in sides}
            rates: dict[str, list[float]] = {name: [] for name in sides}
            with busy_loops(args.hogs):
                print(f"{args.hogs} CPU hogs beside; load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
                for k in range(args.rounds):
                    for name in (list(sides) if k % 2 == 0 else list(reversed(sides))):
                        trip_us, mib_s = measure(forwards[name].port)
                        trips[name].append(trip_us)
                        rates[name].append(mib_s)
            print(f"after: load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
        finally:
            client.close()
            factory.stop()
    old_trip, old_rate = statistics.median(trips["old"]), statistics.median(rates["old"])
    for name in sides:
        trip, rate = statistics.median(trips[name]), statistics.median(rates[name])
        print(f"{name:4}: {trip:7.1f} us a 64-byte round trip ({trip / old_trip:.2f}x old {args.old}), "
              f"{rate:6.1f} MiB/s there and back ({rate / old_rate:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
