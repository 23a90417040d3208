"""`gputui run -- PROGRAM`: a user's program as a run, end to end through the command line.

The program here is a small Python script written per test (the shipped examples have their own
tests in test_program_examples.py). It notes the pid of itself and of every process it starts
in `pids`, so each test can check that nothing of the run is left once the command ended,
whichever way it ended (issue 18's stop matrix, for programs). Every signal follows an event
of the run (its first `metrics` event, or gputui's stop file for the second Ctrl-C).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import cli_env
from .proc_support import Child, Terminal, terminal_env, wait_until
from .test_program_parts import EXAMPLE_REGEX

pytestmark = pytest.mark.timeout(240)
GONE_S = 30.0  # the whole tree ends within this once the command has (a slow machine's scheduling)

PROGRAM = r'''
import os, signal, subprocess, sys, time
from pathlib import Path
from gputui import report

mode = sys.argv[1]
pids = Path(sys.argv[2])
kids = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)"]),
        subprocess.Popen([sys.executable, "-c",  # a grandchild of its own session that ignores SIGTERM
                          "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "while True: time.sleep(0.2)"], start_new_session=True)]
pids.write_text(" ".join(str(p) for p in [os.getpid(), *(k.pid for k in kids)]))
if mode == "stubborn":  # ignores every stop request: only SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
ck = report.checkpoint_dir() / "step.txt"
step = int(ck.read_text()) if report.resuming() and ck.exists() else 0
print("starting at", step, "resuming", report.resuming(), flush=True)
end = step + (5 if mode == "short" else 10**9)
while step < end:
    if mode != "stubborn" and report.should_stop():
        ck.write_text(str(step))
        print("saved at", step, flush=True)
        sys.exit(0)
    report.log(step=step, epoch=step // 10, loss=1.0 / (step + 1))
    step += 1
    time.sleep(0.02)
ck.write_text(str(step))
if mode == "short":
    print("oops: the last line of stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("EXIT_WITH", "0")))
'''


def program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM, encoding="utf-8")
    return path


def argv(*words: str) -> list[str]:
    return [sys.executable, "-m", "gputui", *words]


def pids_of(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    wait_until(lambda: path.exists() and path.read_text().strip(), 60, "the program to note its pids")
    return [int(p) for p in path.read_text().split()]


def assert_none_left(pids: list[int], what: str) -> None:
    def alive() -> list[int]:
        out = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    wait_until(lambda: not alive(), GONE_S, f"every process of the program to end after {what}", detail=alive)


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def start(tmp_path: Path, mode: str, *flags: str, env: dict[str, str] | None = None) -> Child:
    return Child(argv("run", "--json", "--run-dir", str(tmp_path / "run"), *flags, "--", "python",
                      str(program(tmp_path)), mode, str(tmp_path / "pids")),
                 env=cli_env(**(env or {})), cwd=tmp_path, start_new_session=True)


def test_a_program_run_ends_done_with_its_metrics_and_output(tmp_path: Path) -> None:
    with start(tmp_path, "short", "--device", "cpu") as child:
        code = child.finish(120)
    assert code == 0, child._seen()
    first = child.events[0]
    assert first["event"] == "start" and first["program"].startswith("python ") and first["program"].endswith("pids")
    assert first["workdir"] == str(tmp_path) and first["gpus"] == [] and first["device"] == "cpu"
    metrics = [e for e in child.events if e["event"] == "metrics"]
    assert metrics and all(set(e["values"]) == {"loss"} for e in metrics)
    assert metrics[-1]["step"] == 4 and metrics[-1]["values"]["loss"] == pytest.approx(0.2)
    assert child.events[-1]["event"] == "done" and child.events[-1]["exit_code"] == 0
    assert events_of(tmp_path / "run") == child.events  # the same events are in the run's file
    output = (tmp_path / "run" / "output.log").read_text()
    assert "starting at 0 resuming False" in output and "oops: the last line of stderr" in output
    assert_none_left(pids_of(tmp_path), "the program ended by itself (its children did not)")


def test_the_program_sees_gputuis_environment(tmp_path: Path) -> None:
    code = ("import json, os\nkeys = ['GPUTUI_RUN_DIR', 'GPUTUI_EVENTS', 'GPUTUI_CHECKPOINT_DIR', 'GPUTUI_RESUME',"
            " 'GPUTUI_TRIAL', 'CUDA_VISIBLE_DEVICES', 'MINE']\n"
            "print(json.dumps({k: os.environ.get(k) for k in keys}))\n")
    (tmp_path / "env.py").write_text(code)
    done = subprocess.run(argv("run", "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--", "python", "env.py"),
                          cwd=tmp_path, env=cli_env(MINE="yes"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][0])
    run = tmp_path / "run"
    assert seen == {"GPUTUI_RUN_DIR": str(run), "GPUTUI_EVENTS": str(run / "reported.jsonl"),
                    "GPUTUI_CHECKPOINT_DIR": str(run / "checkpoints"), "GPUTUI_RESUME": "0", "GPUTUI_TRIAL": "{}",
                    "CUDA_VISIBLE_DEVICES": "", "MINE": "yes"}


def test_run_trial_fills_the_command_and_report_trial_and_a_resume_keeps_both(tmp_path: Path) -> None:
    """A profile's [run] trial (what `gputui sweep show --run` writes): {name} in the command and
    report.trial(), on the first run and on its resume alike."""
    (tmp_path / "show.py").write_text("import sys\nfrom gputui import report\nprint(sys.argv[1:], report.trial())\n")
    (tmp_path / "p.toml").write_text('[run]\ncommand = ["python", "show.py", "--lr", "{lr}", "{act}"]\n'
                                     'device = "cpu"\ntrial = {lr = 0.005, act = "gelu", deep = true}\n')
    expected = "['--lr', '0.005', 'gelu'] {'act': 'gelu', 'deep': True, 'lr': 0.005}"
    for times, args in enumerate((["--profile", "p.toml", "--run-dir", str(tmp_path / "run")],
                                  ["--resume", str(tmp_path / "run")]), start=1):
        done = subprocess.run(argv("run", "--json", *args), cwd=tmp_path, env=cli_env(), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "run" / "output.log").read_text().splitlines() == [expected] * times, args


def test_a_non_zero_exit_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with start(tmp_path, "short", env={"EXIT_WITH": "3"}) as child:
        code = child.finish(120)
        stderr = child.stderr_rest(10)
    assert code == 1
    error = child.events[-1]
    assert error["event"] == "error" and error["exit_code"] == 3
    assert error["message"] == "python exited with code 3: oops: the last line of stderr"
    said = [line for line in stderr if line.startswith("gputui:")]
    assert said == ["gputui: error: python exited with code 3: oops: the last line of stderr"]
    assert "Traceback" not in "\n".join(stderr)


def test_a_missing_program_is_one_line_and_leaves_no_run(tmp_path: Path) -> None:
    done = subprocess.run(argv("run", "--run-dir", str(tmp_path / "run"), "--", "no-such-program-here", "--x"),
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gputui: error: no-such-program-here: no such program on PATH (give its path, e.g. ./no-such-program-here, "
        "or python no-such-program-here)"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_stop_lets_the_program_save_then_resume_continues(tmp_path: Path, how: str) -> None:
    with start(tmp_path, "forever") as child:
        child.wait_for(lambda e: e.get("event") == "metrics" and e.get("step", 0) >= 3, 120, "a few metrics")
        pids = pids_of(tmp_path)
        child.proc.send_signal(getattr(signal, how))
        code = child.finish(120)
    assert code == 0, child._seen()
    end = child.events[-1]
    assert end["event"] == "interrupted" and end["reason"] == how
    assert end["checkpoint"] == str(tmp_path / "run" / "checkpoints")
    saved = int((tmp_path / "run" / "checkpoints" / "step.txt").read_text())
    assert saved >= 3
    assert_none_left(pids, f"{how} (the grandchild ignores SIGTERM: it is SIGKILLed)")
    if how == "SIGTERM":
        return
    (tmp_path / "pids").unlink()
    with Child(argv("run", "--json", "--resume", str(tmp_path / "run")), env=cli_env(), cwd="/") as again:
        again.wait_for(lambda e: e.get("event") == "metrics", 120, "a metrics event after the resume")
        again.proc.send_signal(signal.SIGINT)
        assert again.finish(120) == 0, again._seen()
    start_again = again.events[0]
    assert start_again["event"] == "start" and start_again["resumed"] is True
    first = next(e for e in again.events if e["event"] == "metrics")
    assert first["step"] == saved  # the program's own checkpoint: it went on where it stopped
    assert first["elapsed_s"] >= end["elapsed_s"]  # the clock goes on
    output = (tmp_path / "run" / "output.log").read_text()
    assert f"starting at {saved} resuming True" in output
    assert [e["event"] for e in events_of(tmp_path / "run")].count("start") == 2  # one file, both attempts


def test_a_second_ctrl_c_kills_a_program_that_ignores_the_first(tmp_path: Path) -> None:
    with start(tmp_path, "stubborn") as child:
        child.wait_for(lambda e: e.get("event") == "metrics", 120, "the first metrics event")
        pids = pids_of(tmp_path)
        child.proc.send_signal(signal.SIGINT)
        wait_until(lambda: (tmp_path / "run" / "stop").exists(), 60, "gputui to ask the program to stop")
        child.proc.send_signal(signal.SIGINT)
        code = child.finish(60)
        stderr = "\n".join(child.stderr_rest(10))
    assert code == 130 and "Traceback" not in stderr
    assert_none_left(pids, "two Ctrl-C")


def test_a_program_that_ignores_stop_is_killed_after_stop_grace_s(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(f'[run]\ncommand = ["python", "prog.py", "stubborn", "{tmp_path / "pids"}"]\nstop_grace_s = 2\n')
    program(tmp_path)
    with Child(argv("run", "--json", "--profile", str(profile), "--run-dir", str(tmp_path / "run")), env=cli_env(),
               cwd="/") as child:
        child.wait_for(lambda e: e.get("event") == "metrics", 120, "the first metrics event")
        assert child.events[0]["workdir"] == str(tmp_path)  # the profile's directory
        pids = pids_of(tmp_path)
        child.proc.send_signal(signal.SIGTERM)
        code = child.finish(60)
    assert code == 0 and child.events[-1]["event"] == "interrupted"
    assert child.events[-1]["exit_code"] == 128 + signal.SIGKILL
    assert "checkpoint" not in child.events[-1]  # it saved nothing
    assert_none_left(pids, "SIGTERM and the grace")


def test_sigkill_of_the_command_leaves_nothing(tmp_path: Path) -> None:
    """The keeper gets SIGTERM when gputui dies (its parent-death signal), passes it on, and
    SIGKILLs what is left after [run] stop_grace_s (2 s here)."""
    profile = tmp_path / "p.toml"
    profile.write_text(f'[run]\ncommand = ["python", "prog.py", "stubborn", "{tmp_path / "pids"}"]\nstop_grace_s = 2\n')
    program(tmp_path)
    with Child(argv("run", "--json", "--profile", str(profile), "--run-dir", str(tmp_path / "run")), env=cli_env(),
               cwd="/") as child:
        child.wait_for(lambda e: e.get("event") == "metrics", 120, "the first metrics event")
        pids = pids_of(tmp_path)
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(30)
    assert_none_left(pids, "the command was SIGKILLed")


def test_stdout_closed_by_its_reader_leaves_nothing(tmp_path: Path) -> None:
    proc = subprocess.Popen(argv("run", "--json", "--run-dir", str(tmp_path / "run"), "--", "python",
                                 str(program(tmp_path)), "forever", str(tmp_path / "pids")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), cwd=tmp_path)
    try:
        assert proc.stdout is not None
        for _ in range(3):  # the start event and two metrics: then the reader goes away (`| head -3`)
            assert proc.stdout.readline()
        pids = pids_of(tmp_path)
        proc.stdout.close()
        proc.wait(120)
        assert b"Traceback" not in proc.stderr.read() if proc.stderr else True
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_none_left(pids, "its reader closed stdout")


GARBAGE = r'''
import json, os, sys
path = os.environ["GPUTUI_EVENTS"]
with open(path, "a") as fh:
    fh.write("not json at all\n")
    fh.write('{"values": {"loss": NaN, "x": 1e999}}\n')
    fh.write('{"values": {"big": 123456789012345678901234567890}}\n')
    fh.write('[1, 2, 3]\n')
    chunk = "a" * (1 << 20)
    for _ in range(int(sys.argv[1])):  # a line of that many MiB, then its newline
        fh.write(chunk)
    fh.write("\n")
    fh.write(json.dumps({"step": 7, "values": {"good": 0.5}}) + "\n")
print("wrote")
'''


def test_garbage_and_a_gigabyte_line_are_survived_with_one_warning(tmp_path: Path) -> None:
    (tmp_path / "garbage.py").write_text(GARBAGE)
    with Child(argv("run", "--json", "--run-dir", str(tmp_path / "run"), "--", "python", "garbage.py", "1024"),
               env=cli_env(), cwd=tmp_path) as child:
        code = child.finish(200)
    assert code == 0, child._seen()
    warnings = [e for e in child.events if e["event"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["reason"] == "bad_report", warnings
    metrics = [e for e in child.events if e["event"] == "metrics"]
    assert [(e["step"], e["values"]) for e in metrics] == [(7, {"good": 0.5})]
    assert child.events[-1]["event"] == "done"
    assert (tmp_path / "run" / "events.jsonl").stat().st_size < 64 * 1024  # nothing of the flood was copied


def test_metrics_regex_turns_output_lines_into_metrics(tmp_path: Path) -> None:
    code = ("for epoch in (1, 2):\n"
            "    for seen in (0, 640):\n"
            "        print(f'Train Epoch: {epoch} [{seen}/60000 ({seen // 600}%)]\\tLoss: {1 / (epoch + seen + 1):.6f}',"
            " flush=True)\n"
            "    print(f'Test set: Average loss: 0.05{epoch}0, Accuracy: 98{epoch}0/10000 (9{epoch}%)', flush=True)\n"
            "    import time; time.sleep(0.05)\n")
    (tmp_path / "print_only.py").write_text(code)
    regexes = ", ".join(json.dumps(r) for r in EXAMPLE_REGEX)
    profile = tmp_path / "p.toml"
    profile.write_text(f'[run]\ncommand = ["python", "print_only.py"]\nmetrics_regex = [{regexes}]\n')
    with Child(argv("run", "--json", "--profile", str(profile), "--run-dir", str(tmp_path / "run")), env=cli_env(),
               cwd="/") as child:
        assert child.finish(120) == 0, child._seen()
    metrics = [e for e in child.events if e["event"] == "metrics"]
    assert all(e["source"] == "output" for e in metrics)
    merged: dict[str, list] = {}
    for e in metrics:
        for name, value in e["values"].items():
            merged.setdefault(name, []).append(value)
    assert merged["loss"][-1] == pytest.approx(round(1 / 643, 6))
    assert merged["test_acc"][-1] == 92 and merged["test_loss"][-1] == pytest.approx(0.052)
    assert max(e.get("epoch", 0) for e in metrics) == 2


def test_a_progress_bar_passes_through_whole_and_its_redraws_are_metrics(tmp_path: Path) -> None:
    """A tqdm-style bar: 3,000 redraws ("\r" + the bar) before one newline, 150 KB. Before, gputui
    held it as one line, showed nothing until the newline, then cut it at 64 KiB (" [...]"), and
    metrics_regex saw only its first frame."""
    code = ("import sys\n"
            "for i in range(3000):\n"
            "    sys.stderr.write(f'\\rtrain {i}/3000 loss={1 / (i + 1):.6f} ' + '#' * 20)\n"
            "    sys.stderr.flush()\n"
            "sys.stderr.write('\\n')\n"
            "sys.stderr.flush()\n"
            "print('val_acc=0.97', flush=True)\n")
    (tmp_path / "bar.py").write_text(code)
    profile = tmp_path / "p.toml"
    regexes = [r"train (?P<step>\d+)/3000 loss=(?P<loss>[0-9.]+)", r"val_acc=(?P<val_acc>[0-9.]+)"]
    profile.write_text('[run]\ncommand = ["python", "bar.py"]\nmetrics_regex = [' +
                       ", ".join(json.dumps(r) for r in regexes) + "]\n")
    run_dir = tmp_path / "run"
    done = subprocess.run(argv("run", "--profile", str(profile), "--run-dir", str(run_dir)), env=cli_env(),
                          cwd="/", capture_output=True, timeout=180)  # bytes: text mode would turn "\r" into "\n"
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr[-2000:]
    bar = "".join(f"\rtrain {i}/3000 loss={1 / (i + 1):.6f} " + "#" * 20 for i in range(3000)) + "\n"
    assert "[...]" not in stderr and bar in stderr  # the program's bytes as it wrote them
    assert stderr.count("\r") == 3000 and done.stdout == b"val_acc=0.97\n"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["event"] == "metrics"]
    last: dict[str, float] = {}
    for e in metrics:
        last.update(e["values"])
    assert last["loss"] == pytest.approx(0.000333) and last["val_acc"] == pytest.approx(0.97)
    assert max(e.get("step", 0) for e in metrics) == 2999
    assert sum(e.get("merged", 1) for e in metrics) == 3000 + 1  # every frame and the line read, paced
    output = (run_dir / "output.log").read_bytes()
    # The bytes as the program wrote them (print() writes "val_acc=0.97" and its newline apart, and
    # the two streams' chunks land in output.log as each is read: the stderr's may come between).
    written = bar + "val_acc=0.97\n"
    assert output.count(b"\r") == 3000 and b"val_acc=0.97" in output and len(output) == len(written.encode())


INTERLEAVED = r'''
import sys
for i in range(300):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
sys.stdout.buffer.write(b"\xff\xfe not utf-8 " + b"x" * 200_000 + b" and no newline")
'''
INTERLEAVED_BYTES = ("".join(f"out {i}\nerr {i}\n" for i in range(300)).encode()
                     + b"\xff\xfe not utf-8 " + b"x" * 200_000 + b" and no newline")


@pytest.mark.parametrize("json_view", [False, True])
def test_the_program_reads_the_commands_stdin(tmp_path: Path, json_view: bool) -> None:
    """`gputui run -- python train.py < params.txt` (or a pipe) gives the program that stdin, as a
    shell would: it got /dev/null, and input() raised EOFError."""
    code = "import sys\nprint('got', sys.stdin.read().upper().strip(), flush=True)\n"
    run_dir = tmp_path / "run"
    words = ["run", *(["--json"] if json_view else []), "--run-dir", str(run_dir), "--", "python", "-c", code]
    done = subprocess.run(argv(*words), env=cli_env(), cwd=tmp_path, input="lr = 0.01\n", capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "output.log").read_text() == "got LR = 0.01\n"


def test_an_objective_reported_faster_than_events_is_counted_report_by_report(tmp_path: Path) -> None:
    """A step-less objective reported 500 times between 500 other reports, as fast as the program
    can: events merge them (50 a second at most), and each event says how many reports of the
    objective it holds, so a sweep's pruner counts 500 evaluations on any machine. Before, it
    counted events: as many evaluations as the machine's speed let through."""
    from gputui.sweep.programs import Relay

    (tmp_path / "fast.py").write_text("from gputui import report\n"
                                      "for i in range(500):\n"
                                      "    report.log(loss=1.0 / (i + 1))\n"
                                      "    report.log(acc=i / 500)\n")
    profile = tmp_path / "p.toml"
    profile.write_text('[run]\ncommand = ["python", "fast.py"]\nobjective = "acc"\n')
    run_dir = tmp_path / "run"
    done = subprocess.run(argv("run", "--profile", str(profile), "--run-dir", str(run_dir)), env=cli_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [e for e in events_of(run_dir) if e["event"] == "metrics"]
    assert sum(e.get("merged", 1) for e in metrics) == 1000 and len(metrics) < 1000  # paced: merged
    assert sum(e.get("objective_reports", 1) for e in metrics if "acc" in e["values"]) == 500
    assert all("objective_reports" not in e or e["objective_reports"] > 1 for e in metrics)
    marks: list[dict[str, Any]] = []
    relay = Relay(0, "acc", marks.append, 0.0)
    for event in metrics:
        relay.show(event)
    evals = [m["eval"] for m in marks if "eval" in m]
    assert evals[-1] == 500 and evals == sorted(set(evals)) and relay.last == pytest.approx(499 / 500)


@pytest.mark.parametrize("how", ["2>&1", "--json"])
def test_stdout_and_stderr_keep_the_order_they_were_written_in(tmp_path: Path, how: str) -> None:
    """`gputui run -- prog > log 2>&1`: the two streams came through two pipes, so a tqdm bar's
    end (stderr) and the epoch's line after it (stdout) were swapped about every other time, in
    the log and in output.log (which the dashboard's `o` shows: its runs are `--json`). They now
    share one pipe: the order is the program's, and so are the bytes (not cut at 64 KiB, not
    decoded)."""
    (tmp_path / "inter.py").write_text(INTERLEAVED)
    log = tmp_path / "log"
    flags = ["--json"] if how == "--json" else []
    with log.open("wb") as out:
        done = subprocess.run(argv("run", *flags, "--run-dir", str(tmp_path / "run"), "--", "python", "inter.py"),
                              env=cli_env(), cwd=tmp_path, stdout=out, timeout=180,
                              stderr=subprocess.STDOUT if how == "2>&1" else subprocess.PIPE)
    shown = log.read_bytes()
    assert done.returncode == 0, shown[-2000:] + (done.stderr or b"")[-2000:]
    if how == "2>&1":
        assert INTERLEAVED_BYTES in shown  # gputui's own lines come before and after it
    assert (tmp_path / "run" / "output.log").read_bytes() == INTERLEAVED_BYTES


def on_a_terminal(tmp_path: Path, stdout: Any) -> tuple[int, bytes]:
    """`gputui run -- python inter.py` with stderr on a pseudo-terminal (read as it comes) and
    stdout where the test says: its exit code and what the terminal got."""
    (tmp_path / "inter.py").write_text(INTERLEAVED)
    terminal = Terminal()
    try:
        done = subprocess.run(argv("run", "--run-dir", str(tmp_path / "run"), "--", "python", "inter.py"),
                              env=terminal_env(cli_env()), cwd=tmp_path, stdout=stdout, stderr=terminal.slave,
                              stdin=subprocess.DEVNULL, timeout=180)
    finally:
        screen = terminal.close()
    return done.returncode, screen


INTERLEAVED_STDOUT = "".join(f"out {i}\n" for i in range(300)).encode() + b"\xff\xfe not utf-8 " + b"x" * 200_000 \
    + b" and no newline"


def test_stdout_sent_to_a_file_from_a_terminal_gets_the_programs_bytes(tmp_path: Path) -> None:
    """`gputui run -- prog > out.txt` on a terminal: the program's stdout went to the terminal
    (drawn above the status line with its stderr) and out.txt stayed empty. It now goes to
    out.txt unchanged; the terminal shows the program's stderr and gputui's status."""
    with (tmp_path / "out.txt").open("wb") as out:
        code, screen = on_a_terminal(tmp_path, out)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))  # the status line's styles
    assert code == 0, text[-2000:]
    assert (tmp_path / "out.txt").read_bytes() == INTERLEAVED_STDOUT
    assert b"\x1b[?25l" in screen, "gputui did not take stderr for a terminal (no live status line)"
    assert "err 299" in text and "done:" in text and "out 1" not in text


def test_stdout_piped_from_a_terminal_gets_no_live_display_that_would_erase_what_its_reader_prints(
        tmp_path: Path) -> None:
    """`gputui run -- prog | tee log`: tee prints the program's stdout on the terminal where the
    live status line is drawn, and each redraw erased tee's last lines (the epochs' val_acc lines
    vanished from the screen). With stdout a pipe beside the terminal, gputui prints as off a
    terminal: the program's stderr as it came, a status line at the start and at the end."""
    import threading

    read_end, write_end = os.pipe()
    piped = bytearray()

    def read_pipe() -> None:
        while data := os.read(read_end, 65536):
            piped.extend(data)

    reader = threading.Thread(target=read_pipe, daemon=True)
    reader.start()
    try:
        code, screen = on_a_terminal(tmp_path, write_end)
    finally:
        os.close(write_end)
    reader.join(30)
    assert not reader.is_alive(), "the pipe was not closed after gputui ended"
    os.close(read_end)
    assert code == 0, screen[-2000:]
    assert bytes(piped) == INTERLEAVED_STDOUT
    assert b"\x1b[?25l" not in screen, "a live display was drawn beside a pipe's reader"
    assert "".join(f"err {i}\r\n" for i in range(300)).encode() in screen  # the terminal's own newlines
    assert "done: " in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))


@pytest.mark.integration
def test_metrics_of_output_read_after_the_program_ended_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pumps can still be reading a program's last output when it has exited (a busy machine):
    what metrics_regex finds then, held back by the pacer, still goes into the run. Here the view
    holds the stderr pump at the second frame until gputui waits for its pumps (the run's loop has
    ended), so that is what happens."""
    import threading

    from gputui.config.profile import parse_profile
    from gputui.jobs import program
    from gputui.runs import store as runs

    (tmp_path / "bar.py").write_text("import sys\nsys.stderr.write('\\rtrain 1 loss=0.5\\rtrain 2 loss=0.25\\rtrain 3 loss=0.125\\n')\n")
    profile = parse_profile('[run]\ncommand = ["python", "bar.py"]\n'
                            f'workdir = "{tmp_path}"\n'
                            r"metrics_regex = ['train (?P<step>\d+) loss=(?P<loss>[0-9.]+)']" + "\n")
    joining = threading.Event()

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        joining.set()
        threading.Thread.join(self, timeout)

    monkeypatch.setattr(program._Pump, "join", join)

    class HoldingView:
        def show(self, event: dict) -> None:
            pass

        def output(self, text: str, stream: str, end: str) -> None:
            if text.startswith("train 2") and end == "\r":
                assert joining.wait(60), "gputui never waited for its pumps"

    run = runs.create(tmp_path / "run")
    assert program.execute_program(run, profile.run.resolve(), False, HoldingView()) == "done"
    events = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["event"] == "metrics"]
    assert metrics and metrics[-1]["step"] == 3 and metrics[-1]["values"] == {"loss": 0.125}, metrics
    assert events[-1]["event"] == "done"


def test_ddp_runs_the_program_through_torchrun(tmp_path: Path) -> None:
    code = ("import os\nimport torch.distributed as dist\nfrom gputui import report\n"
            "dist.init_process_group('gloo')\nimport torch\nt = torch.ones(1) * (dist.get_rank() + 1)\n"
            "dist.all_reduce(t)\nreport.log(step=1, total=float(t.item()), rank=float(dist.get_rank()))\n"
            "report.log(step=1, seen=float(dist.get_rank()), all_ranks=True)\n"
            # one write(2) a line: both ranks share the output pipe, and print() writes its pieces apart
            "os.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} {os.environ['MASTER_ADDR']}\\n\".encode())\n"
            "dist.destroy_process_group()\n")
    (tmp_path / "ddp.py").write_text(code)
    with Child(argv("run", "--json", "--strategy", "ddp", "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--",
                    "python", "ddp.py"), env=cli_env(), cwd=tmp_path) as child:
        assert child.finish(200) == 0, child._seen()
    assert child.events[0]["strategy"] == "ddp" and child.events[0]["world_size"] == 2
    metrics = [e for e in child.events if e["event"] == "metrics"]
    kept = [e["values"] for e in metrics if "total" in e["values"]]
    assert kept == [{"total": 3.0, "rank": 0.0}]  # rank 0's alone
    assert sorted(e["rank"] for e in metrics if "seen" in e["values"]) == [0, 1]
    output = (tmp_path / "run" / "output.log").read_text()
    assert "rank 0 of 2 127.0.0.1" in output and "rank 1 of 2 127.0.0.1" in output


def test_dataparallel_and_net_flags_are_refused_in_one_line(tmp_path: Path) -> None:
    for flags, said in ((["--strategy", "dataparallel"], "strategy dataparallel is for the built-in nets"),
                        (["--epochs", "3"], "--epochs: a setting of the built-in nets")):
        done = subprocess.run(argv("run", *flags, "--", "python", "x.py"), cwd=tmp_path, env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and said in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_fifo_as_the_reports_file_is_one_warning_not_a_hang(tmp_path: Path) -> None:
    code = ("import os\nos.unlink(os.environ['GPUTUI_EVENTS']) if os.path.exists(os.environ['GPUTUI_EVENTS']) else None\n"
            "os.mkfifo(os.environ['GPUTUI_EVENTS'])\nprint('made a fifo', flush=True)\n"
            "import time\ndeadline = time.monotonic() + 600\n"  # lives until gputui asks it to stop (a bound only)
            "while not os.path.exists(os.environ['GPUTUI_STOP_FILE']) and time.monotonic() < deadline:\n"
            "    time.sleep(0.01)\n")
    (tmp_path / "fifo.py").write_text(code)
    with Child(argv("run", "--json", "--run-dir", str(tmp_path / "run"), "--", "python", "fifo.py"), env=cli_env(),
               cwd=tmp_path) as child:
        warning = child.wait_for(lambda e: e.get("event") == "warning", 120, "the warning about the FIFO")
        child.proc.send_signal(signal.SIGINT)
        assert child.finish(60) == 0, child._seen()
    assert "is not a regular file" in warning["message"] and warning["reason"] == "bad_report"
    assert [e["event"] for e in child.events].count("warning") == 1


def test_an_output_log_the_disk_refuses_is_one_warning_and_the_run_goes_on(tmp_path: Path) -> None:
    """output.log is /dev/full (every write: ENOSPC): the program runs to its end, its reports
    still arrive, one `warning` says the log misses output, and nothing raises at the end (a
    buffered log once did, as a traceback, when it was closed)."""
    (tmp_path / "loud.py").write_text("from gputui import report\nfor i in range(200):\n"
                                      "    print('x' * 200, flush=True)\n    report.log(step=i, loss=1.0)\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "output.log").symlink_to("/dev/full")
    with Child(argv("run", "--json", "--run-dir", str(run), "--", "python", "loud.py"), env=cli_env(),
               cwd=tmp_path) as child:
        assert child.finish(120) == 0, child._seen()
    warnings = [e for e in child.events if e["event"] == "warning"]
    assert [w["reason"] for w in warnings] == ["output_log"], warnings
    assert "No space left on device" in warnings[0]["message"]
    assert [e for e in child.events if e["event"] == "metrics"][-1]["step"] == 199
    assert child.events[-1]["event"] == "done"
    assert "Traceback" not in child.stderr


def test_the_program_makes_its_files_with_the_users_umask(tmp_path: Path) -> None:
    (tmp_path / "mask.py").write_text("import os\nmask = os.umask(0)\nprint(f'umask {mask:03o}')\n")
    done = subprocess.run(argv("run", "--run-dir", str(tmp_path / "run"), "--", "python", "mask.py"), cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(0o022))
    assert done.returncode == 0, done.stderr
    assert "umask 022" in done.stdout  # gputui's own 077 is gputui's: the program makes files as the user would
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700  # ... inside a run directory of this account's


def test_a_keeper_killed_under_a_live_run_takes_the_program_with_it(tmp_path: Path) -> None:
    with start(tmp_path, "forever") as child:
        child.wait_for(lambda e: e.get("event") == "metrics", 120, "the first metrics event")
        pids = pids_of(tmp_path)
        [keeper] = [p for p in psutil.Process(child.proc.pid).children() if "gputui.jobs.keeper" in p.cmdline()]
        keeper.kill()  # e.g. the OOM killer: the program is orphaned to init, out of the keeper's reach
        code = child.finish(120)
    assert code == 1 and child.events[-1]["event"] == "error"
    assert_none_left(pids, "the keeper died (gputui remembered the program's processes)")
