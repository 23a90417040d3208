"""SSH timeouts: how long the bounds that tests/test_telemetry_ssh.py checks by state really take.

Against real OpenSSH sshd processes on loopback (tests/sshd_fixture.py):
1. a silent host (accepts TCP, never says a word) with connect_timeout 1 s: time to its
   UNREACHABLE verdict ("no SSH handshake"); target: under 3 s;
2. a hung command (the "hang" fixture's nvidia-smi never answers) with command_timeout
   1 s: time to the ERROR snapshot, the connection kept; target: under 3 s;
3. a round of `SshSource.poll()` over a good host beside a silent one (still connecting)
   and a closed port: time of each round once the good host is connected; target: under
   1 s (benchmarks/bench_ssh_poll.py measures the same over 32 hosts).

Prints median and worst of each over `--repeat` tries and exits 1 if a worst passes its
target. Usage:
    python benchmarks/bench_ssh_timeouts.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import shutil
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.config.hosts import HostSpec  # noqa: E402
from gputui.model.telemetry import HostState  # noqa: E402
from gputui.sources.hostkeys import SshOptions  # noqa: E402
from gputui.sources.ssh import SshHost, SshSource  # noqa: E402
from tests.sshd_fixture import SshdFactory, free_port  # noqa: E402

TARGETS = {"silent host verdict (connect_timeout 1 s)": 3.0, "hung command verdict (command_timeout 1 s)": 3.0,
           "round beside a dead host": 1.0}


def spec(factory: SshdFactory, port: int, name: str = "h", **more: object) -> HostSpec:
    values: dict[str, object] = dict(name=name, address="127.0.0.1", port=port, user="root", identity_file=factory.user_key,
                                     connect_timeout=2.0, command_timeout=5.0)
    values.update(more)
    return HostSpec(**values)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gputui-bench-ssh-timeouts-"))
    factory = SshdFactory(root)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    silent_port = int(silent.getsockname()[1])
    times: dict[str, list[float]] = {name: [] for name in TARGETS}
    try:
        good, hang = factory("r535-a100x8"), factory("hang")
        known = root / "known_hosts"
        known.write_text(good.known_hosts_line() + hang.known_hosts_line())
        options = SshOptions(known_hosts=(known,), gputui_known_hosts=root / "gputui_known_hosts", ssh_config=None)

        for _ in range(args.repeat):
            t0 = time.perf_counter()
            snap = SshHost(spec(factory, silent_port, connect_timeout=1.0), options).poll_now()
            times["silent host verdict (connect_timeout 1 s)"].append(time.perf_counter() - t0)
            assert snap.state == HostState.UNREACHABLE, snap.message

            host = SshHost(spec(factory, hang.port, command_timeout=1.0), options)
            assert host.connect(), host.snapshot.message  # the connection is not what is timed
            t0 = time.perf_counter()
            snap = host.poll_now()
            times["hung command verdict (command_timeout 1 s)"].append(time.perf_counter() - t0)
            assert snap.state == HostState.ERROR and host.connected, snap.message
            host.close()

        source = SshSource([spec(factory, good.port, name="good"),
                            spec(factory, silent_port, name="silent", connect_timeout=120.0),
                            spec(factory, free_port(), name="closed")], options)
        deadline = time.monotonic() + 30
        while source.poll()[0].state != HostState.OK:
            if time.monotonic() > deadline:
                print("the good host did not connect:", source.hosts[0].snapshot.message)
                return 1
            time.sleep(0.05)
        for _ in range(args.repeat * 4):
            t0 = time.perf_counter()
            snaps = source.poll()
            times["round beside a dead host"].append(time.perf_counter() - t0)
            assert snaps[0].state == HostState.OK and snaps[1].state == HostState.CONNECTING
        source.close()
    finally:
        silent.close()
        factory.stop()
        shutil.rmtree(root, ignore_errors=True)  # nothing left in the temporary directory

    worst_ok = True
    for name, values in times.items():
        target = TARGETS[name]
        worst = max(values)
        worst_ok &= worst < target
        print(f"{name}: median {statistics.median(values):.3f} s, worst {worst:.3f} s over {len(values)} "
              f"(target < {target:g} s)")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
