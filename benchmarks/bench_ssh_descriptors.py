"""File descriptors SSH polling holds: this tree's SshSource against an older commit's, each in a
process of its own, over the same loopback sshd processes (16 ports each).

Every host connected and polled, the process's `/proc/self/fd` is counted. Under a common
default soft limit of 1,024 descriptors (`ulimit -n`) this says how many hosts one gputui can
watch. Usage:
    .venv/bin/python benchmarks/bench_ssh_descriptors.py [--hosts 64] [--old 616e0dd]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def count(hosts_file: Path) -> int:
    """In a side's own process: connect to every host listed, poll them all, return the descriptors added."""
    from gputui.config.hosts import HostSpec
    from gputui.model.telemetry import HostState
    from gputui.sources.hostkeys import SshOptions
    from gputui.sources.ssh import SshSource

    lines = hosts_file.read_text().split("\n")
    key, known, ports = Path(lines[0]), Path(lines[1]), [int(p) for p in lines[2:] if p]
    specs = [HostSpec(name=f"h{i}", address="127.0.0.1", port=p, user="root", identity_file=key, connect_timeout=60.0,
                      command_timeout=60.0) for i, p in enumerate(ports)]
    before = len(os.listdir("/proc/self/fd"))
    source = SshSource(specs, SshOptions(known_hosts=(known,), gputui_known_hosts=hosts_file.with_suffix(".g"),
                                         ssh_config=None))
    began = time.monotonic()
    while not all(h.state == HostState.OK for h in source.poll(settle=True)):
        if time.monotonic() - began > 300:
            raise SystemExit("the hosts did not all answer within 300 s")
    source.poll(settle=True)
    added = len(os.listdir("/proc/self/fd")) - before
    source.close()
    return added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--old", default="616e0dd", help="the commit whose SshSource is the baseline")
    parser.add_argument("--side", nargs=2, metavar=("TREE", "HOSTS_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        sys.path.insert(0, args.side[0])
        print(count(Path(args.side[1])))
        return 0
    sys.path.insert(0, str(REPO))
    from tests.sshd_fixture import SshdFactory

    with tempfile.TemporaryDirectory(prefix="gputui-bench-fds-") as top:
        old = Path(top) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.old, "gputui"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        (Path(top) / "sshd").mkdir()
        factory = SshdFactory(Path(top) / "sshd")
        try:
            servers = [factory("r535-a100x8", ports=min(16, args.hosts - n)) for n in range(0, args.hosts, 16)]
            known = Path(top) / "known_hosts"
            known.write_text("".join(s.known_hosts_line(p) for s in servers for p in s.ports))
            hosts_file = Path(top) / "hosts.txt"
            hosts_file.write_text("\n".join([str(factory.user_key), str(known), *(str(p) for s in servers for p in s.ports)]))
            added = {}
            for name, tree in (("old", old), ("new", REPO)):
                out = subprocess.run([sys.executable, __file__, "--side", str(tree), str(hosts_file)], capture_output=True,
                                     text=True, timeout=600)
                if out.returncode != 0:
                    raise SystemExit(f"{name}: {out.stderr.strip()[-500:]}")
                added[name] = int(out.stdout.split()[-1])
        finally:
            factory.stop()
    for name, n in added.items():
        label = f"old {args.old}" if name == "old" else "new"
        print(f"{label:12}: {n} descriptors for {args.hosts} hosts ({n / args.hosts:.1f} a host; "
              f"a soft limit of 1,024 holds about {int(1000 * args.hosts / max(1, n))} hosts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
