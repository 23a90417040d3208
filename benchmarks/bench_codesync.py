"""Syncing a program's workdir to a node (gputui.cluster.codesync) over one SSH connection.

A real OpenSSH sshd on 127.0.0.2 (tests/cluster_fixture.py, as bench_cluster.py does) stands
in for the node. The workdir: `--files` files of `--kb` KB of random data (default 200 x 250 KB
= 50 MB). Timed, `--repeat` times each on a fresh remote_dir, the connection already open:

1. first sync (everything sent);
2. second sync, nothing changed (the manifest is read, nothing sent);
3. one file touched (mtime only: hashed here, nothing sent);
4. one file changed (one file sent);
5. a new run's first sync on the same node (the last run's code copied there and checked,
   only the changed file sent);
and, for scale, right after the first sync, the same files sent one by one with SlaveConnection.put (paramiko's
sftp.put, what the bootstrap copies the wheel and the data set with).

Each line gives seconds, MB/s of what was sent, and the load average around it (the machine
may be shared: say so beside the figures). Usage: python benchmarks/bench_codesync.py
[--files 200] [--kb 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.cluster.codesync import SyncStats, sync_workdir, workdir_files  # noqa: E402
from gputui.cluster.sshnode import SlaveConnection, sh  # noqa: E402
from gputui.config.hosts import HostSpec  # noqa: E402
from tests.cluster_fixture import ClusterNodes, trust  # noqa: E402


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--kb", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-codesync-"))
    os.environ["GPUTUI_HOME"] = str(root / "home")
    work = root / "work"
    for i in range(args.files):
        path = work / f"pkg{i % 10}" / f"part{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(args.kb * 1000))
    total = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    nodes = ClusterNodes(root)
    try:
        node = nodes.node(0)
        trust(root / "home", node)
        assert node.home is not None
        conn = SlaveConnection(HostSpec("n0", node.address, node.port, "root", nodes.user_key)).open_or_raise()
        print(f"workdir: {args.files} files, {total / 1e6:.1f} MB of random data; node: sshd on {node.address} "
              f"(loopback); {os.cpu_count()} CPUs; load before {load()}")
        results: dict[str, list[tuple[float, SyncStats, str]]] = {}

        def timed(name: str, remote_dir: Path, run: str, before: Callable[[], object] = lambda: None) -> None:
            before()
            files = workdir_files(work)
            t0 = time.perf_counter()
            stats = sync_workdir(conn, files, work, f"{remote_dir}/runs/{run}/code", str(remote_dir))
            seconds = time.perf_counter() - t0
            results.setdefault(name, []).append((seconds, stats, load()))

        victim = work / "pkg3" / "part0003.bin"
        for i in range(args.repeat):
            remote_dir = node.home / f"rd{i}"
            (remote_dir / "venv" / "bin").mkdir(parents=True)
            (remote_dir / "venv" / "bin" / "python").symlink_to(sys.executable)  # as the bootstrap leaves it
            timed("first sync", remote_dir, "r1")
            base = remote_dir / "put"
            files = workdir_files(work)
            conn.check("mkdir -p " + sh(*sorted({str(base / Path(f.path).parent) for f in files})))
            t0 = time.perf_counter()
            for f in files:
                conn.put(work / f.path, f"{base}/{f.path}")
            results.setdefault("baseline: SlaveConnection.put", []).append(
                (time.perf_counter() - t0, SyncStats(sent_files=len(files), sent_bytes=sum(f.size for f in files)), load()))
            timed("second sync, nothing changed", remote_dir, "r1")
            timed("one file touched (mtime only)", remote_dir, "r1", lambda: os.utime(victim))
            timed("one file changed", remote_dir, "r1", lambda: victim.write_bytes(os.urandom(args.kb * 1000)))
            timed("a new run, one file changed", remote_dir, "r2", lambda: victim.write_bytes(os.urandom(args.kb * 1000)))
        conn.close()
        for name, rows in results.items():
            times = [t for t, _, _ in rows]
            last = rows[-1][1]
            sent = statistics.median(s.sent_bytes for _, s, _ in rows)
            med = statistics.median(times)
            extra = f", {last.seeded_files} copied on the node" if last.seeded_files else ""
            print(f"{name:<32} median {med:7.3f} s ({', '.join(f'{t:.3f}' for t in times)}); sent {last.sent_files} "
                  f"files, {sent / 1e6:.1f} MB ({sent / 1e6 / med:,.1f} MB/s){extra}; load {', '.join(r[2] for r in rows)}")
        return 0
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)  # nothing left in the temporary directory


if __name__ == "__main__":
    raise SystemExit(main())
