"""benchmarks/ddp_exit.py keeps running: one two-node launch of the example on each side,
counted, and nothing left in its temporary directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_the_exit_benchmark_launches_both_examples_and_counts_the_failed_ones(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    broken = tmp_path / "broken_ddp.py"  # a rank that fails as it ends (torchrun then exits 1): counted, with what it said
    broken.write_text((REPO / "examples" / "mnist_ddp.py").read_text().replace(
        "        os._exit(0)\n", "        print('RuntimeError: broken on purpose', flush=True)\n        os._exit(3)\n"))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ddp_exit.py"), "--runs", "1", "--against", str(broken)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "this: 0 of 1 launches failed" in done.stdout, done.stdout
    assert "against: 1 of 1 launches failed" in done.stdout, done.stdout
    assert re.search(r"run 1 \(against\): node \d exit 1: RuntimeError: broken on purpose", done.stdout), done.stdout
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
