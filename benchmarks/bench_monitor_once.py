"""`gputui monitor --once --json` against an older gputui and `nvitop --once`, all cold starts.

Each command runs as a fresh process (`python -m ...` with this interpreter, so none pays
for a shim), in turn, `--repeat` times; prints the median and best wall time of each, their
exit codes and the ratios. `--ref REF` times the gputui of a git commit too (extracted with
`git archive` into a temporary directory), so a change is compared with what came before on
the same machine at the same time. nvitop is only measured, never a dependency of gputui:
`python -m pip install nvitop` first, or `--nvitop-path DIR` for a `pip install --target DIR
--no-deps nvitop`. Usage:
    python benchmarks/bench_monitor_once.py [--repeat 15] [--ref HEAD~3] [--nvitop-path DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3
REPO = Path(__file__).resolve().parent.parent


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env)
    return time.perf_counter() - t0, out.returncode, out.stdout


def extract(ref: str, into: Path) -> Path:
    """The gputui package of commit `ref`, under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "gputui"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--ref", help="also time the gputui of this git commit (the 'before')")
    parser.add_argument("--nvitop-path", type=Path, help="a directory holding nvitop (pip install --target DIR --no-deps nvitop)")
    args = parser.parse_args()
    env = dict(os.environ)
    commands: dict[str, tuple[list[str], Path, dict[str, str]]] = {
        "gputui": ([sys.executable, "-m", "gputui", "monitor", "--once", "--json"], REPO, env),
    }
    temp = tempfile.TemporaryDirectory(prefix="gputui-before-")
    if args.ref:
        before = extract(args.ref, Path(temp.name))
        commands[f"gputui@{args.ref}"] = ([sys.executable, "-m", "gputui", "monitor", "--once", "--json"], before, env)
    nvitop_env = dict(env, PYTHONPATH=str(args.nvitop_path)) if args.nvitop_path else env
    if args.nvitop_path or importlib.util.find_spec("nvitop") is not None:
        commands["nvitop"] = ([sys.executable, "-m", "nvitop", "--once"], Path(temp.name), nvitop_env)
    else:
        print("nvitop is not installed (python -m pip install nvitop, or --nvitop-path): timing gputui only")
    for argv, cwd, cenv in commands.values():
        timed(argv, cwd, cenv)  # warm the page cache
    walls: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    states: list[str] = []
    for _ in range(args.repeat):
        for name, (argv, cwd, cenv) in commands.items():
            wall, code, stdout = timed(argv, cwd, cenv)
            walls[name].append(wall)
            codes[name].add(code)
            if name == "gputui":
                states = [h["state"] for h in json.loads(stdout)["hosts"]]
    temp.cleanup()
    ours = statistics.median(walls["gputui"])
    for name in walls:
        median = statistics.median(walls[name])
        ratio = "" if name == "gputui" else f"; gputui/{name}: {ours / median:.2f}"
        print(f"{name:16s} median {median:.3f} s, best {min(walls[name]):.3f} s, exit codes {sorted(codes[name])}{ratio}")
    print(f"target {TARGET_S} s: gputui median is {ours / TARGET_S:.2f}x of it; gputui saw: {states}")
    return 0 if ours <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
