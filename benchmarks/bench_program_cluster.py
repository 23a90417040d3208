"""A program's cluster run (issue 32): checkpoint pulls, and a spot notice to training again.

1. Checkpoint pull (gputui.cluster.checkpoints.pull over RemoteSource, the SSH connection
   already open): a `--ckpt-mb` MB checkpoint directory (`--ckpt-files` files of random data,
   default 4 x 5 MB) on a loopback sshd node (tests/cluster_fixture.py, as bench_codesync.py
   starts one) pulled to the master: the first pull, a second with nothing changed (the
   listing only), and one with one file rewritten. `--repeat` times, each on fresh directories.
2. Spot notice to training again, on the simulated cloud (SimProvider, loopback sshd nodes as
   the instances, the fake instance metadata service): the run of
   tests/test_cluster_program.py::test_a_spot_notice_stops_the_program_pulls_its_checkpoint_
   replaces_the_slave_and_resumes, driven in-process (ClusterRun), `--repeat` times on fresh
   nodes (so the replacement slave is bootstrapped from nothing, as a new instance is). The
   program (the test's) waits at step 3 until it is asked to stop; the notice is armed then.
   Times are taken as each event reaches the run's view (time.monotonic()); the notice's
   time is when the slave's watcher took it from the metadata service (it polls every 5 s,
   so the wait for the notice itself is not counted). Milestones:
   `stopping` (the master hears of it), `checkpoint_pulled` (rank 0 saved when should_stop()
   turned True), the program's exit on every node (the first attempt's end), `node_replaced`
   (the new instance up and bootstrapped), `resumed`, the first `metrics` after it (training
   again): each run's in the order they came, then the medians since the notice, and the
   two intervals the issue names (notice -> exit, exit -> training again).

Each figure comes with the load average around it (the machine may be shared: say so beside
the figures). Usage: .venv/bin/python benchmarks/bench_program_cluster.py [--repeat 3]
[--ckpt-files 4] [--ckpt-mb 20] [--only pull|spot] [--story]
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
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.cluster import checkpoints as ckpts  # noqa: E402
from gputui.cluster.sshnode import SlaveConnection  # noqa: E402
from gputui.config.hosts import HostSpec  # noqa: E402
from tests.cluster_fixture import ClusterNodes, trust  # noqa: E402

COMMAND = " ".join([os.path.relpath(sys.executable), os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float], digits: int = 3) -> str:
    return f"median {statistics.median(values):.{digits}f} s ({', '.join(f'{v:.{digits}f}' for v in values)})"


# -- 1. checkpoint pulls ------------------------------------------------------------------
def bench_pull(root: Path, nodes: ClusterNodes, repeat: int, files: int, mb: float) -> None:
    node = nodes.node(0)
    trust(root / "home", node)
    assert node.home is not None
    size = int(mb * 1e6 / files)
    conn = SlaveConnection(HostSpec("n0", node.address, node.port, "root", nodes.user_key)).open_or_raise()
    print(f"\n1. checkpoint pull: {files} files of {size / 1e6:.1f} MB of random data ({files * size / 1e6:.0f} MB) "
          f"from an sshd on {node.address} (loopback) to the master; load before {load()}")
    results: dict[str, list[tuple[float, int, int, str]]] = {}

    def timed(name: str, source: Any, dest: Path, pulled: ckpts.Pulled, fetched: int) -> ckpts.Pulled:
        t0 = time.perf_counter()
        got = ckpts.pull(source, dest, pulled)
        seconds = time.perf_counter() - t0
        count, sent = (got[1], got[2]) if got is not None else (0, 0)
        assert count == fetched, (name, count, fetched)
        results.setdefault(name, []).append((seconds, count, sent, load()))
        return got[0] if got is not None else pulled

    for i in range(repeat):
        remote = node.home / f"ckpt{i}"  # the node's checkpoint directory (the loopback node shares this disk)
        remote.mkdir()
        for j in range(files):
            (remote / f"part{j}.pt").write_bytes(os.urandom(size))
        dest = root / f"master{i}" / "checkpoints"
        dest.parent.mkdir()
        source = ckpts.RemoteSource(conn, str(remote))
        pulled = timed("first pull", source, dest, ckpts.Pulled(), files)
        pulled = timed("second pull, nothing changed", source, dest, pulled, 0)
        (remote / "part0.pt").write_bytes(os.urandom(size))
        pulled = timed("one file changed", source, dest, pulled, 1)
        assert (dest / "part0.pt").read_bytes() == (remote / "part0.pt").read_bytes()
    conn.close()
    for name, rows in results.items():
        med = statistics.median(t for t, _, _, _ in rows)
        sent = rows[-1][2]
        rate = f", {sent / 1e6 / med:,.1f} MB/s" if sent else ""
        count = rows[-1][1]
        print(f"   {name:<30} {spread([t for t, _, _, _ in rows])}; fetched {count} file{'' if count == 1 else 's'}, "
              f"{sent / 1e6:.1f} MB{rate}; load {', '.join(r[3] for r in rows)}")


# -- 2. a spot notice to training again ---------------------------------------------------
STEPS = ("notice", "stopping", "program exited", "checkpoint_pulled", "node_replaced", "resumed", "training again")


def spot_once(root: Path, nodes: ClusterNodes, wheel: Path, story: bool) -> dict[str, float]:
    """One spot run (tests/test_cluster_program.py's, in-process); the time of each of STEPS."""
    from gputui.cloud.context import CloudContext
    from gputui.cloud.ledger import Ledger
    from gputui.cloud.sim import SimProvider, SimScript
    from gputui.cluster.launch import ClusterRun
    from gputui.cluster.manager import SlaveManager
    from gputui.cluster.settings import cluster_settings
    from gputui.config.profile import parse_profile
    from gputui.config.run import RunSettings
    from gputui.model.cloud import InstanceInfo
    from gputui.runs import store as runs
    from tests.moto_fixture import public_key_line
    from tests.test_cluster_cloud import FakeImds
    from tests.test_cluster_program import PROGRAM

    root.mkdir()
    home = root / "home"
    os.environ["GPUTUI_HOME"] = str(home)
    os.environ["GPUTUI_WHEEL"] = str(wheel)
    machines = [nodes.node(0), nodes.node(1)]  # the first instance and its replacement, fresh
    imds = FakeImds()
    os.environ["GPUTUI_IMDS_URL"] = imds.url
    key = root / "id.pub"
    key.write_text(public_key_line() + "\n")
    text = f"""
[cloud]
budget_usd = 5.0
zones = ["us-east-1a"]
ssh_cidr = "198.51.100.7/32"
public_key = "{key}"
[cluster]
name = "spot"
cloud_slaves = 1
master_addr = "127.0.0.1"
rdzv_port = 0
socket_ifname = "lo"
join_timeout = 60
"""
    settings = cluster_settings(parse_profile(text, root / "p.toml"))
    assert settings is not None
    provider = SimProvider(script=SimScript(seed=1, launch_delay_s=0.5, shutdown_delay_s=0.2,
                                            host_keys=(machines[0].host_public_key(),)))
    ctx = CloudContext(settings.cloud, provider, Ledger(home / "ledger.sqlite3"), "spot", "me")  # type: ignore[arg-type]
    assigned: dict[str, HostSpec] = {}
    times: dict[str, float] = {}
    seen: list[tuple[float, dict[str, Any]]] = []

    def host_spec(info: InstanceInfo) -> HostSpec:
        if info.instance_id not in assigned:
            machine = machines[len(assigned)]
            assigned[info.instance_id] = HostSpec(info.instance_id, machine.address, machine.port, "root",
                                                  nodes.user_key)
        return assigned[info.instance_id]

    def interrupt_now() -> None:  # the watcher's poll takes the notice: the instance goes away
        times["notice"] = time.monotonic()
        with provider._state("bench") as state:
            state["instances"][next(iter(assigned))]["interrupt_at"] = time.time()

    class View:
        def show(self, event: dict[str, Any]) -> None:
            now = time.monotonic()
            seen.append((now, event))
            name = event["event"]
            if name == "metrics" and event.get("step") == 3 and not imds.armed.is_set():
                imds.on_notice = interrupt_now
                times["armed"] = now
                imds.armed.set()
            if name in ("stopping", "checkpoint_pulled", "node_replaced", "resumed") and name not in times:
                times[name] = now
            if name == "metrics" and "resumed" in times and "training again" not in times:
                times["training again"] = now

        def close(self) -> None:
            pass

    code, gates = root / "code", root / "gates"
    code.mkdir()
    gates.mkdir()
    (code / "prog.py").write_text(PROGRAM)
    command = ("python", "prog.py", "--steps", "6", "--gate-at", "3", "--gates", str(gates))
    cfg = RunSettings(command=command, workdir=str(code), env=(("OMP_NUM_THREADS", "1"),), device="cpu",
                      checkpoint_pull_s=3600.0, stop_grace_s=10.0).resolve()
    run = runs.create(root / "run")
    from gputui.cluster import programrun

    # The program's exit on every node: the end of the first attempt (its monitor returns once
    # no node runs it; the relaunch follows).
    original: Callable[..., Any] = programrun.ProgramAttempts._attempt

    def attempt(self: Any, number: int, resume: bool) -> Any:
        outcome = original(self, number, resume)
        if number == 0:
            times["program exited"] = time.monotonic()
        return outcome

    programrun.ProgramAttempts._attempt = attempt  # type: ignore[method-assign,assignment]
    try:
        outcome = ClusterRun(run, cfg, settings, View(), manager=SlaveManager(settings, ctx, host_spec=host_spec)
                             ).execute(False)
    finally:
        programrun.ProgramAttempts._attempt = original  # type: ignore[method-assign]
        imds.server.shutdown()
        for machine in machines:
            machine.stop()
    if story or outcome != "done" or set(STEPS) - times.keys():
        t0 = seen[0][0] if seen else 0.0
        for at, event in seen:
            if event["event"] != "metrics" or story:
                print(f"   {at - t0:8.3f} {event['event']:<18} {event.get('step', '')!s:>4} "
                      f"{str(event.get('message', ''))[:110]}")
    assert outcome == "done", outcome
    missing = set(STEPS) - times.keys()
    assert not missing, f"no time for {sorted(missing)}"
    return times


def bench_spot(root: Path, nodes: ClusterNodes, repeat: int, story: bool) -> None:
    from gputui.cluster.wheel import build_wheel

    wheel = build_wheel(root / "wheels").path
    print(f"\n2. spot notice to training again (simulated cloud, loopback sshd instances, the master trains as "
          f"rank 0, the slave is the spot instance); load before {load()}")
    rows: list[tuple[dict[str, float], str]] = []
    for i in range(repeat):
        times = spot_once(root / f"spot{i}", nodes, wheel, story)
        rows.append((times, load()))
        order = sorted(STEPS, key=times.__getitem__)
        deltas = ", ".join(f"{b} +{times[b] - times[a]:.2f}" for a, b in zip(order, order[1:]))
        print(f"   run {i + 1}: notice, {deltas} s; load {rows[-1][1]}")
    print(f"   (the notice armed at step 3 -> the watcher's poll took it: "
          f"{spread([t['notice'] - t['armed'] for t, _ in rows], 2)}; not counted below)")
    print("   since the notice (medians of the runs):")
    for step in STEPS[1:]:
        print(f"     {step:<42} {spread([t[step] - t['notice'] for t, _ in rows], 2)}")
    for a, b, what in (("notice", "program exited", "notice -> the program's exit on every node"),
                       ("program exited", "training again", "exit -> training again on the replacement"),
                       ("notice", "training again", "notice -> training again, in all")):
        print(f"   {what:<44} {spread([t[b] - t[a] for t, _ in rows], 2)}")
    print(f"   load per run: {', '.join(r for _, r in rows)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ckpt-files", type=int, default=4)
    parser.add_argument("--ckpt-mb", type=float, default=20.0)
    parser.add_argument("--only", choices=("pull", "spot"))
    parser.add_argument("--story", action="store_true", help="print every event of each spot run with its time")
    args = parser.parse_args()
    if args.repeat < 1 or args.ckpt_files < 1 or not args.ckpt_mb > 0:
        parser.error("--repeat and --ckpt-files must be >= 1 and --ckpt-mb > 0")
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-program-cluster-"))
    os.environ["GPUTUI_HOME"] = str(root / "home")
    print(f"command: {COMMAND}; {os.cpu_count()} CPUs; load {load()}")
    nodes = ClusterNodes(root)
    try:
        if args.only in (None, "pull"):
            bench_pull(root, nodes, args.repeat, args.ckpt_files, args.ckpt_mb)
        if args.only in (None, "spot"):
            bench_spot(root, nodes, args.repeat, args.story)
        print(f"\nload after: {load()}")
        return 0
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)  # nothing left in the temporary directory


if __name__ == "__main__":
    raise SystemExit(main())
