"""SSH polling: one round over 32 remote hosts with one dead host among them.

Real OpenSSH sshd processes (the test fixture, tests/sshd_fixture.py) listen on 32
loopback ports (16 per process, sshd's limit), each port a "host" whose fake nvidia-smi answers like an 8 x A100 server (R535);
a 33rd host accepts TCP and never answers (a dead host whose connect hangs). Once the
32 connections are up, it times rounds of `SshSource.poll()` (all hosts concurrently,
one command each) and, for comparison, the same 32 hosts polled one after another.

Prints the round wall time (median and worst), the ratio to the 1.0 s target and the
speed-up over sequential polling. Usage:
    python benchmarks/bench_ssh_poll.py [--hosts 32] [--rounds 10] [--fixture r535-a100x8]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.config.hosts import HostSpec  # noqa: E402
from gputui.model.telemetry import HostState  # noqa: E402
from gputui.sources.hostkeys import SshOptions  # noqa: E402
from gputui.sources.ssh import SshSource  # noqa: E402
from tests.sshd_fixture import SshdFactory  # noqa: E402

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fixture", default="r535-a100x8", help="driver generation under tests/data/nvsmi")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gputui-bench-ssh-"))
    factory = SshdFactory(root)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(64)  # accepts TCP, never says a word
    try:
        # sshd listens on at most 16 sockets (MAX_LISTEN_SOCKS): 16 ports per sshd process
        servers = [factory(args.fixture, ports=min(16, args.hosts - n)) for n in range(0, args.hosts, 16)]
        ports = [p for server in servers for p in server.ports]
        known = root / "known_hosts"
        known.write_text("".join(servers[0].known_hosts_line(p) for p in ports))  # one host key for all
        options = SshOptions(known_hosts=(known,), gputui_known_hosts=root / "gputui_known_hosts", ssh_config=None)
        specs = [
            HostSpec(name=f"h{i:02d}", address="127.0.0.1", port=p, user="root", identity_file=factory.user_key, connect_timeout=10.0)
            for i, p in enumerate(ports)
        ]
        specs.append(HostSpec(name="dead", address="127.0.0.1", port=int(dead.getsockname()[1]), user="root",
                              identity_file=factory.user_key, connect_timeout=30.0))
        source = SshSource(specs, options)
        started = time.perf_counter()
        while True:
            hosts = source.poll(settle=True, wait=1.0)
            if all(h.state == HostState.OK for h in hosts[:-1]):
                break
            if time.perf_counter() - started > 60:
                print("connections did not come up:", {h.name: h.message for h in hosts if h.state != HostState.OK})
                return 1
        up = time.perf_counter() - started
        print(f"{args.hosts} connections up in {up:.2f} s (dead host: {hosts[-1].state.value})")

        walls = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            hosts = source.poll()
            walls.append(time.perf_counter() - t0)
            assert all(h.state == HostState.OK and len(h.gpus) > 0 for h in hosts[:-1]), [h.message for h in hosts]
            assert hosts[-1].state in (HostState.CONNECTING, HostState.UNREACHABLE)
        gpus = sum(len(h.gpus) for h in hosts)

        t0 = time.perf_counter()
        for host in source.hosts[:-1]:
            assert host.poll_now().state == HostState.OK
        sequential = time.perf_counter() - t0
        source.close()

        median, worst = statistics.median(walls), max(walls)
        print(f"round over {args.hosts} hosts ({gpus} GPUs) + 1 dead host, {args.rounds} rounds:")
        print(f"  median {median:.3f} s, worst {worst:.3f} s, best {min(walls):.3f} s")
        print(f"  target {TARGET_S:.1f} s: median is {median / TARGET_S:.2f}x of it, worst {worst / TARGET_S:.2f}x")
        print(f"  sequential polling of the same {args.hosts} hosts: {sequential:.3f} s ({sequential / median:.1f}x the concurrent round)")
        print(f"  dead host: {hosts[-1].state.value}: {hosts[-1].message}")
        return 0 if worst <= TARGET_S else 1
    finally:
        dead.close()
        factory.stop()


if __name__ == "__main__":
    raise SystemExit(main())
