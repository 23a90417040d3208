"""How often a finished two-node gloo run of examples/mnist_ddp.py fails as its ranks exit.

torch's gloo threads outlive `destroy_process_group` (DDP keeps the group); one still releasing
the last collective's tensors as Python shuts down aborts the rank with SIGABRT ("terminate
called without an active exception", pytorch/pytorch#190489). The example now ends its ranks
with os._exit. This script launches the example as two torchrun nodes of one process each on
loopback (one epoch of 512 images, batch 32 a rank: what tests/test_cluster_program.py runs),
`--runs` times, alternating with a second copy of the example (`--against`, e.g. the old one:
`git show 187f816:examples/mnist_ddp.py > /tmp/old_ddp.py`), and counts the launches in which a
rank failed, with what it printed last. A race this rare needs many runs and a busy machine:
`--hogs 2` runs two busy loops beside it. Usage:
    python benchmarks/ddp_exit.py [--runs 40] [--hogs 2] [--against /tmp/old_ddp.py]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "mnist_ddp.py"
ARGS = ["--data", str(REPO / "assets" / "mnist"), "--limit", "512", "--test-limit", "256", "--epochs", "1",
        "--log-every", "2", "--seed", "1", "--lr", "0.01", "--batch-size", "32"]
LAUNCH_S = 180  # a launch takes 10-20 s here; one that passes this hangs (killed, counted as failed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """torchrun and its workers (each in a session of its own)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for each in tree:
        try:
            each.kill()
        except psutil.NoSuchProcess:
            pass


def launch(code_dir: Path, work: Path) -> tuple[bool, str]:
    """One two-node run; (whether both nodes exited 0, the last line of a failed node). A node
    still there after LAUNCH_S (a hang) is killed with its workers and counted as failed."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TMPDIR": str(work)}  # torchrun's dirs too
    procs: list[subprocess.Popen[bytes]] = []
    codes: list[int] = []
    deadline = time.monotonic() + LAUNCH_S
    try:
        for rank in (0, 1):
            with (work / f"node{rank}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                     "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                     "mnist_ddp.py", *ARGS],
                    cwd=code_dir, env=env, stdout=log, stderr=subprocess.STDOUT))
        for proc in procs:
            try:
                codes.append(proc.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                codes.append(proc.wait())
    finally:  # also when the benchmark is stopped: no node or worker outlives it
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc)
                proc.wait()
    said = ""
    for rank, code in enumerate(codes):
        if code != 0:
            lines = [ln for ln in (work / f"node{rank}.log").read_text(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith(("frame #", " "))]
            said = said or f"node {rank} exit {code}: " + next((ln for ln in lines if "terminate" in ln or "Error" in ln),
                                                           lines[-1] if lines else "no output")[:160]
    return all(code == 0 for code in codes), said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="launches of each example")
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the runs")
    parser.add_argument("--against", type=Path, default=None, help="a second copy of the example, run alternately")
    args = parser.parse_args()
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be >= 1 and --hogs >= 0")
    if args.against is not None and not args.against.is_file():
        parser.error(f"--against: no file {args.against}")
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-ddp-exit-"))
    sides = {"this": EXAMPLE, **({"against": args.against} if args.against else {})}
    dirs = {}
    for name, example in sides.items():
        dirs[name] = root / name
        dirs[name].mkdir()
        shutil.copy(example, dirs[name] / "mnist_ddp.py")
        shutil.copy(REPO / "examples" / "mnist_plain.py", dirs[name] / "mnist_plain.py")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cleanup below runs when stopped
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.hogs)]
    failed: dict[str, list[str]] = {name: [] for name in sides}
    done = dict.fromkeys(sides, 0)
    print(f"{args.runs} two-node launches of each of {', '.join(f'{n} = {p}' for n, p in sides.items())}; "
          f"{args.hogs} CPU hogs; load {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            for name in (sides if i % 2 == 0 else reversed(list(sides))):
                ok, said = launch(dirs[name], root)
                done[name] += 1
                if not ok:
                    failed[name].append(said)
                    print(f"  run {i + 1} ({name}): {said}", flush=True)
            print(f"  {i + 1} of {args.runs}: " + ", ".join(f"{n} {len(failed[n])} failed" for n in sides), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        shutil.rmtree(root, ignore_errors=True)
    for name in sides:
        print(f"{name}: {len(failed[name])} of {done[name]} launches failed")
    print(f"{time.monotonic() - t0:.0f} s; load after {os.getloadavg()[0]:.2f}")
    return 1 if failed["this"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
