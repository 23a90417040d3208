"""benchmarks/bench_program_cluster.py keeps running: a dry run of its checkpoint-pull part
(one small pull from a loopback sshd node), and the names its spot part borrows from the
tests and the cluster code still there (that part itself takes a cluster run: too slow here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_program_cluster.py"


def test_the_pull_benchmark_pulls_all_then_nothing_then_the_one_changed_file(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "pull", "--repeat", "1", "--ckpt-files", "2",
                           "--ckpt-mb", "0.2"], capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split("median")[0].strip(): line for line in done.stdout.splitlines() if " median " in line}
    assert "fetched 2 files, 0.2 MB" in lines["first pull"], done.stdout
    assert "fetched 0 files" in lines["second pull, nothing changed"], done.stdout
    assert "fetched 1 file, 0.1 MB" in lines["one file changed"], done.stdout
    assert "load " in done.stdout and "command: " in done.stdout
    assert list(temp.iterdir()) == []  # its nodes, keys and checkpoints removed at the end


def test_what_the_spot_benchmark_borrows_is_there() -> None:
    from gputui.cluster.programrun import ProgramAttempts

    from .test_cluster_cloud import FakeImds
    from .test_cluster_program import PROGRAM

    assert callable(getattr(ProgramAttempts, "_attempt", None)) and "--gate-at" in PROGRAM
    imds = FakeImds()
    try:
        assert hasattr(imds, "on_notice") and imds.url.startswith("http://127.0.0.1:")
    finally:
        imds.server.shutdown()
