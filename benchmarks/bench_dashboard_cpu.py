"""The dashboard's CPU cost: idle, and with a run streaming 1,000 events/s into it.

Both run the real dashboard (`python -m gputui --demo`, 4 simulated hosts x 8 GPUs plus the
demo's dead host, hosts polled every second) in a real terminal: a tmux pane of 120x40 (the
dashboard process is the pane's process; tmux's own CPU is not counted). The figure is
user + system CPU time of the dashboard process (psutil `Process.cpu_times()`, all its
threads) over the window, after a warm-up, as a percentage of one core.

1. Idle: no run.
2. Streaming: a stand-in run, started by this script, is a live run of the dashboard's
   profile as any `gputui run` is (a run directory with run.pid naming its process and
   the profile, and events.jsonl) and appends 1,000 events/s to its events.jsonl: step
   events with a falling loss, an eval every 250 events, an epoch every 1,000 steps (events
   built with gputui.model.events.make, so they are what a run writes). The dashboard is told
   `t`: a live run of its profile exists, so it attaches to it and follows its events file,
   the way it follows any run on this machine.

   Redraws are counted from the screen itself: the pane is captured every 0.1 s and the
   curves (the training panel's rows below its text lines) and its progress line are compared
   with the previous capture; changes per second are a lower bound of the redraw rate
   (at most 10/s can be seen).

torch must never be loaded in the dashboard process: its memory map is checked for torch's
libraries at the end of each window.

    python benchmarks/bench_dashboard_cpu.py [--seconds 20] [--warmup 5] [--rate 1000]
    python benchmarks/bench_dashboard_cpu.py --only idle --hosts 256 --gpus 8   (a lab: the hosts
        panel shows its lab view, one line per host, at 120x40 from 5 hosts x 8 GPUs on)
    python benchmarks/bench_dashboard_cpu.py --hosts 64 --against /tmp/old --rounds 3   (idle, this
        tree against another checkout, alternated in one run: `git worktree add /tmp/old COMMIT`)
    python benchmarks/bench_dashboard_cpu.py --hosts 256 --floor --rounds 3   (idle, against the
        floor: a bare Textual app in the same pane that repaints a one-line clock every second and
        shows a page of static text, alternated in one run. What any 1 Hz Textual screen costs on
        this machine, its input thread and its repaint included: the dashboard's own share is the
        difference.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
IDLE_BUDGET_PCT = 3.0
STREAM_BUDGET_PCT = 15.0
REDRAW_MIN_HZ = 1.0
SIZE = (120, 40)


# the stand-in run ---------------------------------------------------------------------------------
def feed(rate: float, profile: Path) -> int:
    """Be a live run of `profile` under GPUTUI_HOME that appends `rate` events/s until SIGTERM."""
    from gputui.runs import store as runs
    from gputui.model.events import make

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    run = runs.create(None)
    shutil.copyfile(profile, run.path / runs.PROFILE)
    steps_per_epoch, epochs = 1000, 1000
    started = time.time()
    with open(run.events, "a", encoding="utf-8") as out:
        out.write(runs.encode(make("start", run_id=run.run_id, run_dir=str(run.path), model="seed", device="cuda:0",
                                   strategy="single", world_size=1, epochs=epochs, batch_size=512,
                                   steps_per_epoch=steps_per_epoch, total_steps=steps_per_epoch * epochs,
                                   train_samples=512 * steps_per_epoch, test_samples=10000, num_classes=10,
                                   params=3285, seed=0, resumed_from_step=None)) + "\n")
        out.flush()
        runs.write_pid(run, os.getpid(), profile)
        print(run.path, flush=True)
        written, step = 0, 0
        t0 = time.monotonic()
        while not stop:
            due = int((time.monotonic() - t0) * rate) - written
            lines = []
            for _ in range(max(0, due)):
                written += 1
                elapsed = time.time() - started
                epoch = step // steps_per_epoch + 1
                if written % 250 == 0:
                    lines.append(make("eval", epoch=epoch, step=step, elapsed_s=elapsed, test_loss=0.5 * loss(step),
                                      test_acc=99.0 - 50 * loss(step), eval_s=0.05))
                    continue
                step += 1
                if step % steps_per_epoch == 0:
                    lines.append(make("epoch", epoch=epoch, step=step, elapsed_s=elapsed, train_loss=loss(step),
                                      test_loss=0.5 * loss(step), test_acc=99.0 - 50 * loss(step), eval_s=0.05))
                else:
                    lines.append(make("step", epoch=epoch, step=step, elapsed_s=elapsed, loss=loss(step),
                                      samples_per_s=140_000.0 + 5_000 * math.sin(step / 50), lr=1e-3))
            if lines:
                out.write("".join(runs.encode(e) + "\n" for e in lines))
                out.flush()
            time.sleep(0.02)
    runs.clear_pid(run, os.getpid())
    print(f"wrote {written} events in {time.time() - started:.1f} s", file=sys.stderr, flush=True)
    return 0


def loss(step: int) -> float:
    return 0.05 + 2.25 * math.exp(-step / 4000) + 0.02 * math.sin(step / 7)


# the dashboard in tmux ----------------------------------------------------------------------------
class Tmux:
    def __init__(self) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            raise SystemExit("bench_dashboard_cpu: needs tmux (apt-get install tmux)")
        self.tmux = tmux
        self.socket = f"gputui-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True, text=True, timeout=20)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "dash")

    def wait(self, check: "re.Pattern[str] | str", timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if (re.search(check, screen) if isinstance(check, re.Pattern) else check in screen):
                return screen
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}; the screen:\n{screen}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


def start_dashboard(home: Path, hosts: int, gpus: int, profile: Path | None = None,
                    repo: Path = REPO) -> tuple[Tmux, psutil.Process]:
    """The demo dashboard of the gputui in `repo` (this tree, or another checkout with --against)."""
    env = {"GPUTUI_HOME": str(home), "GPUTUI_DEMO_HOSTS": str(hosts), "GPUTUI_DEMO_GPUS": str(gpus),
           "TERM": "xterm-256color"}
    command = (f"cd {shlex.quote(str(repo))} && exec env "
               + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
               + f" {shlex.quote(sys.executable)} -m gputui --demo"
               + (f" --profile {shlex.quote(str(profile))}" if profile is not None else ""))
    tmux = Tmux()
    tmux("new-session", "-d", "-s", "dash", "-x", str(SIZE[0]), "-y", str(SIZE[1]), command)
    tmux("set-option", "-t", "dash", "remain-on-exit", "on")
    pid = int(tmux("display-message", "-p", "-t", "dash", "#{pane_pid}").strip())
    tmux.wait("Hosts & GPUs", 60, "the dashboard's first frame")
    return tmux, psutil.Process(pid)


def own_runs(home: Path) -> list[psutil.Process]:
    """`gputui run` processes of this GPUTUI_HOME (the dashboard's own runs, wherever started)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        try:
            if "gputui" in cmd and "run" in cmd and p.environ().get("GPUTUI_HOME") == str(home):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def torch_mapped(proc: psutil.Process) -> list[str]:
    """torch's files in the process's memory map (there once torch is imported)."""
    try:
        return sorted({m.path for m in proc.memory_maps() if "/torch/" in m.path or "libtorch" in m.path})
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return ["(cannot read the memory map)"]


# what the screen shows ----------------------------------------------------------------------------
def training_panel(screen: str) -> list[str]:
    """The rows inside the training panel's border."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        at = line.find("Training")
        if at < 0 or "╭" not in line[:at]:
            continue
        left = line.rindex("╭", 0, at)
        right = line.find("╮", at)
        rows = []
        for below in lines[i + 1:]:
            if len(below) <= left or below[left] == "╰":
                break
            rows.append(below[left + 1:right if right > 0 else None])
        return rows
    return []


def curves(screen: str) -> str:
    """The plot part of the training panel: its rows from the first one that holds the plot's
    frame, an axis tick or a braille dot on (the lines above it are the run's text: step, loss,
    rate, ETA, the legend)."""
    rows = training_panel(screen)
    marks = re.compile(r"[┌└┤├⠁-⣿]")
    for i, row in enumerate(rows):
        if marks.search(row):
            return "\n".join(rows[i:])
    return ""


def progress_of(screen: str) -> str | None:
    """The training panel's progress line (epoch, steps or percentage, rate, ETA: what fits)."""
    return next((row.strip() for row in training_panel(screen) if re.search(r"\bepoch \d", row)), None)


def measure(proc: psutil.Process, tmux: Tmux, seconds: float) -> dict[str, Any]:
    """CPU of the dashboard over `seconds`, with the screen's changes counted at 10 Hz."""
    curve_changes = step_changes = samples = 0
    screen = tmux.screen()
    last_curve, last_step = hashlib.sha1(curves(screen).encode()).digest(), progress_of(screen)
    before, t0 = proc.cpu_times(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(0.1)
        screen = tmux.screen()
        samples += 1
        curve, step = hashlib.sha1(curves(screen).encode()).digest(), progress_of(screen)
        curve_changes += curve != last_curve
        step_changes += step != last_step
        last_curve, last_step = curve, step
    after, t1 = proc.cpu_times(), time.monotonic()
    used = (after.user - before.user) + (after.system - before.system)
    return {"cpu_pct": 100.0 * used / (t1 - t0), "window_s": t1 - t0, "curve_hz": curve_changes / (t1 - t0),
            "step_hz": step_changes / (t1 - t0), "samples": samples, "last_progress": last_step or "n/a"}


# the two measurements -----------------------------------------------------------------------------
def idle(home: Path, args: argparse.Namespace, repo: Path = REPO) -> dict[str, Any]:
    tmux, proc = start_dashboard(home, args.hosts, args.gpus, repo=repo)
    try:
        time.sleep(args.warmup)
        result = measure(proc, tmux, args.seconds)
        result["torch"] = len(torch_mapped(proc))
        return result
    finally:
        tmux.kill()


def streaming(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    tmux, proc = start_dashboard(home, args.hosts, args.gpus)
    profile = (REPO / "profiles" / "local.toml").resolve()
    env = dict(os.environ, GPUTUI_HOME=str(home))
    feeder = subprocess.Popen([sys.executable, __file__, "--feed", "--rate", str(args.rate), "--profile", str(profile)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert feeder.stdout is not None
        run_dir = feeder.stdout.readline().strip()
        if not run_dir:
            raise RuntimeError(f"the stand-in run did not start: {feeder.stderr.read() if feeder.stderr else ''}")
        tmux("send-keys", "-t", "dash", "t")  # a live run of this profile: t attaches to it
        run_id = Path(run_dir).name
        tmux.wait(re.compile(rf"running +{re.escape(run_id)}"), 60, "the dashboard to follow the stand-in run")
        if own_runs(home):
            raise RuntimeError("t started a training run of its own instead of attaching to the live one")
        time.sleep(args.warmup)
        result = measure(proc, tmux, args.seconds)
        result["torch"] = len(torch_mapped(proc))
        written = sum(1 for _ in open(Path(run_dir) / "events.jsonl", encoding="utf-8"))
        result["events"] = float(written)
        return result
    finally:
        feeder.send_signal(signal.SIGTERM)
        try:
            feeder.wait(10)
        except subprocess.TimeoutExpired:
            feeder.kill()
        tmux.kill()


REPORTER = """
import sys, time
from gputui import report
rate = float(sys.argv[1])
t0, step = time.monotonic(), 0
while True:
    due = int((time.monotonic() - t0) * rate)
    while step < due:
        step += 1
        report.log(step=step, epoch=step // 10000, loss=1.0 / (1 + step / 1000), acc=min(0.99, step / 20000))
    if report.should_stop():
        break
    time.sleep(0.005)
"""


def program(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A real `gputui run` of a program that reports `rate` times a second (gputui.report), followed
    by the dashboard (started with the program's profile: `t` attaches to its live run)."""
    home.mkdir(parents=True)
    prog = home / "reporter.py"
    prog.write_text(REPORTER)
    profile = home / "program.toml"
    profile.write_text(f'[run]\ncommand = ["python", "reporter.py", "{args.rate:g}"]\ndevice = "cpu"\n')
    env = dict(os.environ, GPUTUI_HOME=str(home))
    run = subprocess.Popen([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    tmux = None
    try:
        assert run.stdout is not None
        start = run.stdout.readline()
        if '"start"' not in start:
            raise RuntimeError(f"the program's run did not start: {start} {run.stderr.read() if run.stderr else ''}")
        run_dir = Path(json.loads(start)["run_dir"])
        threading.Thread(target=lambda: [None for _ in run.stdout], daemon=True).start()  # keep its pipe drained
        tmux, proc = start_dashboard(home, args.hosts, args.gpus, profile)
        tmux("send-keys", "-t", "dash", "t")  # a live run of this profile: t attaches to it
        tmux.wait(re.compile(r"loss"), 60, "the dashboard to follow the program's run")
        time.sleep(args.warmup)
        before = sum(1 for _ in open(run_dir / "reported.jsonl", "rb"))
        result = measure(proc, tmux, args.seconds)
        reported = sum(1 for _ in open(run_dir / "reported.jsonl", "rb")) - before
        result["torch"] = len(torch_mapped(proc))
        result["events"] = float(sum(1 for _ in open(run_dir / "events.jsonl", encoding="utf-8")))
        result["reports_per_s"] = reported / result["window_s"]
        return result
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(60)
        except subprocess.TimeoutExpired:
            run.kill()
        if tmux is not None:
            tmux.kill()


FLOOR_APP = """
import time
from textual.app import App
from textual.widget import Widget
from textual.widgets import Static

class Clock(Widget):
    def render(self):
        return "floor: " + time.strftime("%H:%M:%S")

class Floor(App):
    CSS = "Clock { height: 1; }"

    def compose(self):
        self.clock = Clock()
        yield self.clock
        yield Static("a page of static text " * 150)

    def on_mount(self):
        self.set_interval(1.0, self.clock.refresh)

Floor().run()
"""


def floor_idle(args: argparse.Namespace) -> dict[str, Any]:
    """The floor's CPU over the window: a bare Textual app repainting one line every second."""
    tmux = Tmux()
    command = f"exec env TERM=xterm-256color {shlex.quote(sys.executable)} -c {shlex.quote(FLOOR_APP)}"
    tmux("new-session", "-d", "-s", "dash", "-x", str(SIZE[0]), "-y", str(SIZE[1]), command)
    tmux("set-option", "-t", "dash", "remain-on-exit", "on")
    try:
        proc = psutil.Process(int(tmux("display-message", "-p", "-t", "dash", "#{pane_pid}").strip()))
        tmux.wait("floor:", 60, "the floor app's first frame")
        time.sleep(args.warmup)
        return measure(proc, tmux, args.seconds)
    finally:
        tmux.kill()


def floor_against(args: argparse.Namespace) -> int:
    """Idle CPU of this tree's dashboard and of the floor (FLOOR_APP), alternated in one run."""
    import statistics

    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs); idle, {args.hosts} sim hosts x "
          f"{args.gpus} GPUs, {args.seconds:g} s windows; floor = a bare Textual app repainting a clock at 1 Hz")
    floors: dict[str, list[float]] = {"floor": [], "dashboard": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for name in (("floor", "dashboard") if n % 2 == 0 else ("dashboard", "floor")):
                r = floor_idle(args) if name == "floor" else idle(Path(tmp) / f"d{n}", args)
                floors[name].append(r["cpu_pct"])
                print(f"  round {n + 1} {name}: {r['cpu_pct']:.2f}% of one core (load {os.getloadavg()[0]:.2f})")
    low, dash = statistics.median(floors["floor"]), statistics.median(floors["dashboard"])
    print(f"median floor {low:.2f}%, dashboard {dash:.2f}%: the dashboard's own {dash - low:.2f}% "
          f"(dashboard/floor {dash / low:.2f}); budget {IDLE_BUDGET_PCT:.0f}%")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


def against(args: argparse.Namespace) -> int:
    """Idle CPU of two trees' dashboards, alternated in one run (the order swapped every round),
    so that the machine's load and CPU accounting weigh on both alike."""
    import statistics

    other = args.against.resolve()
    if not (other / "gputui" / "__init__.py").is_file():
        raise SystemExit(f"bench_dashboard_cpu: --against {other}: not a gputui checkout (no gputui/__init__.py)")
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs); idle, {args.hosts} sim hosts x "
          f"{args.gpus} GPUs, {args.seconds:g} s windows; old = {other}, new = {REPO}")
    found: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            order = [("old", other), ("new", REPO)]
            for name, repo in (order if n % 2 == 0 else order[::-1]):
                r = idle(Path(tmp) / f"{name}{n}", args, repo)
                found[name].append(r["cpu_pct"])
                print(f"  round {n + 1} {name}: {r['cpu_pct']:.2f}% of one core (load {os.getloadavg()[0]:.2f})")
    old, new = statistics.median(found["old"]), statistics.median(found["new"])
    print(f"median old {old:.2f}%, new {new:.2f}%: new/old {new / old:.2f}; budget {IDLE_BUDGET_PCT:.0f}%")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="gputui dashboard: idle CPU, and CPU with a run streaming events")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window (default 20 s)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window (default 5)")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second of the stand-in run")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--only", choices=("idle", "stream", "program"), help="one of the measurements")
    parser.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)  # be the stand-in run
    parser.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--against", type=Path, metavar="TREE",
                        help="idle only: alternate this tree's dashboard with TREE's (another checkout, e.g. a "
                             "`git worktree add` of an older commit), --rounds times, and print new/old")
    parser.add_argument("--floor", action="store_true",
                        help="idle only: alternate this tree's dashboard with a bare Textual app repainting a clock "
                             "at 1 Hz (the floor any 1 Hz Textual screen costs here), --rounds times")
    parser.add_argument("--rounds", type=int, default=3, help="with --against or --floor: rounds of (TREE or floor, this tree)")
    args = parser.parse_args()
    if args.feed:
        return feed(args.rate, args.profile)
    if args.floor:
        return floor_against(args)
    if args.against is not None:
        return against(args)
    failed = False
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "idle"):
            r = idle(Path(tmp) / "idle", args)
            failed |= r["cpu_pct"] > IDLE_BUDGET_PCT or r["torch"] > 0
            print(f"idle, {args.hosts} sim hosts x {args.gpus} GPUs at 1 Hz: {r['cpu_pct']:.2f}% of one core over "
                  f"{r['window_s']:.0f} s; budget {IDLE_BUDGET_PCT:.0f}% (ratio {r['cpu_pct'] / IDLE_BUDGET_PCT:.2f}); "
                  f"torch loaded: {'yes' if r['torch'] else 'no'}")
        if args.only in (None, "stream"):
            r = streaming(Path(tmp) / "stream", args)
            failed |= r["cpu_pct"] > STREAM_BUDGET_PCT or r["curve_hz"] < REDRAW_MIN_HZ or r["torch"] > 0
            print(f"streaming {args.rate:.0f} events/s ({r['events']:.0f} written), same hosts: {r['cpu_pct']:.2f}% "
                  f"of one core over {r['window_s']:.0f} s; budget {STREAM_BUDGET_PCT:.0f}% "
                  f"(ratio {r['cpu_pct'] / STREAM_BUDGET_PCT:.2f}); curves changed {r['curve_hz']:.2f}/s, "
                  f"progress line {r['step_hz']:.2f}/s (screen sampled at 10 Hz; need >= {REDRAW_MIN_HZ:.0f}/s); "
                  f"last progress line {r['last_progress']!r}; torch loaded: {'yes' if r['torch'] else 'no'}")
        if args.only in (None, "program"):
            r = program(Path(tmp) / "program", args)
            failed |= r["cpu_pct"] > STREAM_BUDGET_PCT or r["torch"] > 0
            print(f"a program reporting {r['reports_per_s']:.0f} times/s through gputui.report ({r['events']:.0f} "
                  f"events written: at most 50/s), same hosts: {r['cpu_pct']:.2f}% of one core over "
                  f"{r['window_s']:.0f} s; budget {STREAM_BUDGET_PCT:.0f}% (ratio {r['cpu_pct'] / STREAM_BUDGET_PCT:.2f}); "
                  f"curves changed {r['curve_hz']:.2f}/s; torch loaded: {'yes' if r['torch'] else 'no'}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
