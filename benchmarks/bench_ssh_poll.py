"""SSH polling: rounds over N remote hosts (32 by default, up to 256) with one dead host among them.

Real OpenSSH sshd processes (the test fixture, tests/sshd_fixture.py) listen on N loopback
ports (16 per process, sshd's limit), each port a "host" whose fake nvidia-smi answers like an
8 x A100 server (R535); one more host accepts TCP and never answers (a dead host whose connect
hangs). Once the N connections are up, it times rounds of `SshSource.poll()` (every host on its
long-lived poll channel, the blocking steps in pools sized from this machine) and, for
comparison, the same hosts polled one after another, and with --compare the same rounds by one
command per poll (`SshSource(oneshot=True)`: a new channel, login shell and `sh` each time,
as before the poll channel).

Prints the round wall time (median and worst) against the target, this process's CPU per host
per round (target: under 2 ms), the speed-up over sequential polling, the pools' sizes and the
load average. --hogs N runs N busy loops beside it for the measured part. Usage:
    python benchmarks/bench_ssh_poll.py [--hosts 32] [--rounds 10] [--compare] [--hogs 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.config.hosts import HostSpec  # noqa: E402
from gputui.model.telemetry import HostState  # noqa: E402
from gputui.sources.hostkeys import SshOptions  # noqa: E402
from gputui.sources.ssh import SshSource  # noqa: E402
from tests.sshd_fixture import SshdFactory  # noqa: E402

CPU_TARGET_S = 0.002  # this process's CPU per host per round


def load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def bring_up(source: SshSource, hosts: int) -> float:
    started = time.perf_counter()
    while True:
        snaps = source.poll(settle=True, wait=1.0)
        if all(h.state == HostState.OK for h in snaps[:hosts]):
            return time.perf_counter() - started
        if time.perf_counter() - started > 120:
            raise SystemExit(f"connections did not come up: { {h.name: h.message for h in snaps if h.state != HostState.OK} }")


def rounds(source: SshSource, hosts: int, count: int) -> tuple[list[float], list[float]]:
    """Wall seconds and this process's CPU seconds per host, one each per round."""
    walls, cpus = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        snaps = source.poll()
        walls.append(time.perf_counter() - t0)
        assert all(h.state == HostState.OK and len(h.gpus) > 0 for h in snaps[:hosts]), [h.message for h in snaps]
        assert snaps[-1].state in (HostState.CONNECTING, HostState.UNREACHABLE), snaps[-1]
        assert source.last_round_cpu_s is not None
        cpus.append(source.last_round_cpu_s / max(1, source.last_round_hosts))
    return walls, cpus


def report(label: str, walls: list[float], cpus: list[float], target: float) -> None:
    median, worst = statistics.median(walls), max(walls)
    print(f"  {label}: round median {median:.3f} s, worst {worst:.3f} s, best {min(walls):.3f} s "
          f"({median / target:.2f}x / {worst / target:.2f}x of the {target:g} s target); "
          f"master CPU per host per round: median {statistics.median(cpus) * 1e3:.2f} ms, worst {max(cpus) * 1e3:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fixture", default="r535-a100x8", help="driver generation under tests/data/nvsmi")
    parser.add_argument("--target", type=float, default=None, help="round target in seconds (default: 1 s for 32 hosts, hosts/64 s above)")
    parser.add_argument("--compare", action="store_true", help="also time rounds by one command per poll (the way before)")
    parser.add_argument("--hogs", type=int, default=0, help="busy loops to run beside the measured rounds")
    args = parser.parse_args()
    target = args.target or max(1.0, args.hosts / 64)

    root = Path(tempfile.mkdtemp(prefix="gputui-bench-ssh-"))
    factory = SshdFactory(root)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(64)  # accepts TCP, never says a word
    hogs: list[subprocess.Popen[bytes]] = []
    sources: list[SshSource] = []
    try:
        # sshd listens on at most 16 sockets (MAX_LISTEN_SOCKS): 16 ports per sshd process
        servers = [factory(args.fixture, ports=min(16, args.hosts - n)) for n in range(0, args.hosts, 16)]
        ports = [p for server in servers for p in server.ports]
        known = root / "known_hosts"
        known.write_text("".join(servers[0].known_hosts_line(p) for p in ports))  # one host key for all
        options = SshOptions(known_hosts=(known,), gputui_known_hosts=root / "gputui_known_hosts", ssh_config=None)
        specs = [
            HostSpec(name=f"h{i:03d}", address="127.0.0.1", port=p, user="root", identity_file=factory.user_key,
                     connect_timeout=30.0, command_timeout=30.0)
            for i, p in enumerate(ports)
        ]
        specs.append(HostSpec(name="dead", address="127.0.0.1", port=int(dead.getsockname()[1]), user="root",
                              identity_file=factory.user_key, connect_timeout=120.0))
        source = SshSource(specs, options)
        sources.append(source)
        up = bring_up(source, args.hosts)
        print(f"{args.hosts} connections up in {up:.2f} s; pools: {source.pool.size} poll workers, "
              f"{source.connect_pool.size} connect workers, 1 reader")
        old = None
        if args.compare:
            old = SshSource(specs, options, oneshot=True)
            sources.append(old)
            bring_up(old, args.hosts)
        for _ in range(args.hogs):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if hogs:
            time.sleep(2)  # let them take the CPUs
        print(f"before the rounds ({len(hogs)} CPU hogs beside): {load()}")

        rounds(source, args.hosts, 2)  # warm up
        walls, cpus = rounds(source, args.hosts, args.rounds)
        threads = sum(1 for t in __import__("threading").enumerate() if t.name.startswith("gputui-ssh"))
        gpus = sum(len(h.snapshot.gpus) for h in source.hosts)
        print(f"round over {args.hosts} hosts ({gpus} GPUs) + 1 dead host, {args.rounds} rounds "
              f"({threads} gputui-ssh threads in this process):")
        report("poll channel", walls, cpus, target)
        if old is not None:
            rounds(old, args.hosts, 1)
            old_walls, old_cpus = rounds(old, args.hosts, args.rounds)
            report("one command per poll (before)", old_walls, old_cpus, target)
            print(f"  poll channel vs one command per poll: {statistics.median(old_walls) / statistics.median(walls):.1f}x "
                  f"faster, {statistics.median(old_cpus) / statistics.median(cpus):.1f}x less master CPU")

        t0 = time.perf_counter()
        for host in source.hosts[:-1]:
            assert host.poll_now().state == HostState.OK
        sequential = time.perf_counter() - t0
        median, worst = statistics.median(walls), max(walls)
        print(f"  sequential polling of the same {args.hosts} hosts on their poll channels: {sequential:.3f} s "
              f"({sequential / median:.1f}x the concurrent round)")
        print(f"  dead host: {source.hosts[-1].snapshot.state.value}: {source.hosts[-1].snapshot.message}")
        print(f"after the rounds: {load()}")
        ok = worst <= target and statistics.median(cpus) <= CPU_TARGET_S
        return 0 if ok else 1
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for source in sources:
            source.close()
        dead.close()
        factory.stop()
        shutil.rmtree(root, ignore_errors=True)  # nothing left in the temporary directory


if __name__ == "__main__":
    raise SystemExit(main())
