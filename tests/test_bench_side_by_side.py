"""benchmarks/bench_side_by_side.py runs two trees' monitors at once and prints a ratio (a dry run
against this very tree, so the script cannot rot)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def test_the_side_by_side_benchmark_measures_both_trees_and_prints_the_ratio() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_side_by_side.py"), "--against", str(REPO),
                           "--rounds", "2", "--seconds", "1", "--warmup", "0.5", "monitor", "--sim", "2", "--sim-gpus", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rounds = re.findall(r"round (\d) \((old|new) started first\): old ([\d.]+)%  new ([\d.]+)%", done.stdout)
    assert [(r[0], r[1]) for r in rounds] == [("1", "old"), ("2", "new")], done.stdout  # the order swapped
    assert all(float(old) >= 0 and float(new) >= 0 for *_, old, new in rounds), done.stdout  # a tiny fleet may read 0.00%
    assert re.search(r"median new/old ([\d.]+|inf) over 2 rounds", done.stdout), done.stdout
