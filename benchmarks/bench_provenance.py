"""What recording a run's code (gputui.runs.provenance: `git rev-parse` and `git status`) costs a
program's start.

Two sides in one run, interleaved, the order alternating: `gputui run --json -- python -c pass`
in a git work tree (`--files` small files, committed, then one changed: the git calls run and
find a change) and in a plain directory holding the same files (rev-parse
fails at once: no status). Measured: the wall time of each command, from its launch to its end.
Also the in-process time of `code_version` on the same two directories. Prints the medians and
the ratio repo/plain. `--hogs N` runs the same beside N busy-looping processes.

    .venv/bin/python benchmarks/bench_provenance.py [--rounds 10] [--hogs 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputui.runs.provenance import code_version  # noqa: E402
from hogs import busy_loops  # noqa: E402 - beside this script


def _git(repo: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@example.org", *args],
                   check=True, capture_output=True, env=env)


def _tree(target: Path, files: int) -> None:
    """`files` small source files in 20 folders (a project's size; nothing importable as gputui)."""
    for i in range(files):
        path = target / f"pkg{i % 20}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {i}\n" + "x = 1\n" * 200, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--files", type=int, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gputui-bench-provenance-") as top:
        repo, plain, home = Path(top) / "repo", Path(top) / "plain", Path(top) / "home"
        repo.mkdir()
        _tree(repo, args.files)
        shutil.copytree(repo, plain)
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "bench")
        with open(repo / "pkg0" / "mod0.py", "a", encoding="utf-8") as fh:
            fh.write("changed\n")
        env = {**os.environ, "GPUTUI_HOME": str(home)}
        walls: dict[str, list[float]] = {"repo": [], "plain": []}
        inproc: dict[str, list[float]] = {"repo": [], "plain": []}
        with busy_loops(args.hogs):
            for k in range(args.rounds):
                for side in (("repo", "plain") if k % 2 == 0 else ("plain", "repo")):
                    where = repo if side == "repo" else plain
                    began = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "gputui", "run", "--json", "--device", "cpu", "--",
                                    sys.executable, "-c", "pass"], cwd=where, env=env, check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    walls[side].append(time.perf_counter() - began)
                    began = time.perf_counter()
                    version = code_version(where)
                    inproc[side].append(time.perf_counter() - began)
                    assert (version is not None) == (side == "repo") and (version is None or version.dirty), version
    load = os.getloadavg()[0]
    print(f"{args.files} files; {args.rounds} rounds; {args.hogs} hog(s); load {load:.1f} at the end")
    for side in ("repo", "plain"):
        print(f"{side:5}: command {statistics.median(walls[side]) * 1000:7.1f} ms, "
              f"code_version {statistics.median(inproc[side]) * 1000:6.1f} ms (medians)")
    ratio = statistics.median(walls["repo"]) / statistics.median(walls["plain"])
    added = (statistics.median(inproc["repo"]) - statistics.median(inproc["plain"])) * 1000
    print(f"ratio repo/plain (command): {ratio:.3f}x; git's calls add {added:.1f} ms in process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
