"""The pieces of a program run that need no process: report lines checked, output lines matched,
reports paced, the clock, the command's parameters, the GPU choice, and `gputui.report` itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gputui.config.run import substitute
from gputui.jobs import gpus
from gputui.jobs.program import (
    MAX_REPORT_LINE, Clock, OutputMetrics, Pacer, Record, Reports, find_program,
)
from gputui.model.errors import UserError
from gputui.model.telemetry import GpuSample

# pytorch/examples' MNIST (mnist/main.py) prints these; README's metrics_regex parses them.
EXAMPLE_TRAIN = "Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.812345"
EXAMPLE_TEST = "Test set: Average loss: 0.0500, Accuracy: 9850/10000 (98%)"
EXAMPLE_REGEX = [
    r"Train Epoch: (?P<epoch>\d+) \[(?P<seen>\d+)/\d+ .*Loss: (?P<loss>[0-9.]+)",
    r"Test set: Average loss: (?P<test_loss>[0-9.]+), Accuracy: \d+/\d+ \((?P<test_acc>[0-9.]+)%\)",
]


def test_a_report_line_becomes_a_record() -> None:
    records = Reports().feed(b'{"step": 3, "epoch": 1, "values": {"loss": 0.5, "val_acc": 91}, "time": 12.5}\n')
    assert records == [Record({"loss": 0.5, "val_acc": 91}, step=3, epoch=1, time=12.5)]


def test_garbage_is_refused_counted_and_said_once() -> None:
    reports = Reports()
    got = reports.feed(b"not json\n[1, 2]\n{\"values\": 3}\n{\"values\": {\"x\": \"text\"}}\n"
                       b'{"values": {"ok": 1}}\n')
    assert [r.values for r in got] == [{"ok": 1}]
    assert reports.tally.refused == 4
    warning = reports.tally.warning()
    assert warning is not None and "GPUTUI_EVENTS" in warning
    assert reports.tally.warning() is None  # said once


def test_values_that_are_not_finite_numbers_under_a_name_are_dropped() -> None:
    reports = Reports()
    line = json.dumps({"values": {"good": 1.5, "bool": True, "big": 10**30, "bad name!": 1, "": 2,
                                  "x" * 65: 3, "nan": "NaN"}}).replace('"NaN"', "NaN")
    [record] = reports.feed(line.encode() + b"\n")
    assert record.values == {"good": 1.5}  # 10**30 is past 2**63: not a count or a number of ours
    assert reports.dropped == 6


@pytest.mark.parametrize("values, said", [
    ({"a b": 1}, "sent a metric named 'a b' (a name is a letter or _, then up to 63 letters, digits or _ . : / -)"),
    ({"\x1b[31mred": 1}, "sent a metric named 'red' (a name is"),
    ({"loss": "0.5"}, "sent a value of loss that is not a finite number"),
    ({f"m{i}": i for i in range(65)}, "sent more than 64 values in one line (m64 and the rest)"),
])
def test_the_warning_says_what_was_wrong_with_a_value(values: dict[str, object], said: str) -> None:
    reports = Reports()
    reports.feed(json.dumps({"values": values}).encode() + b"\n")
    warning = reports.tally.warning()
    assert warning is not None and said in warning, warning
    assert "\x1b" not in warning


def test_huge_numbers_and_hostile_places_do_not_pass() -> None:
    [record] = Reports().feed(b'{"step": 1e300, "epoch": -1, "rank": "0", "values": {"a": 1e308}, "time": "x"}\n')
    assert record.values == {"a": 1e308}
    assert (record.step, record.epoch, record.rank, record.time) == (None, None, None, None)


def test_a_line_too_long_is_dropped_whole_and_the_next_is_read(tmp_path: Path) -> None:
    reports = Reports()
    got = []
    chunk = b"x" * (1 << 20)
    for _ in range(3):  # 3 MiB without a newline, in pieces
        got += reports.feed(chunk)
    got += reports.feed(b'\n{"values": {"after": 1}}\n')
    assert [r.values for r in got] == [{"after": 1}]
    assert reports.lines.held <= MAX_REPORT_LINE
    assert reports.tally.refused == 1


def test_metrics_regex_reads_pytorch_examples_lines() -> None:
    out = OutputMetrics(EXAMPLE_REGEX)
    train = out.match(EXAMPLE_TRAIN)
    assert train is not None and train.values == {"seen": 640, "loss": 0.812345} and train.epoch == 1
    test = out.match(EXAMPLE_TEST)
    assert test is not None and test.values == {"test_loss": 0.05, "test_acc": 98}
    assert out.match("Epoch 1 went fine") is None
    assert train.source == "output"


def test_a_group_that_is_not_a_number_gives_nothing() -> None:
    out = OutputMetrics([r"loss=(?P<loss>\S+)"])
    assert out.match("loss=nan") is None and out.match("loss=0x1f") is None
    assert out.match("loss=1e-3") is not None and out.match("loss=1e-3").values == {"loss": 0.001}


def test_reports_are_paced_and_merged_never_lost() -> None:
    pacer = Pacer(per_s=10)  # one event per 0.1 s
    first = pacer.add(Record({"loss": 1.0}, step=1), now=0.0)
    assert [(r.values, c) for r, c in first] == [({"loss": 1.0}, 1)]
    assert pacer.add(Record({"loss": 0.9}, step=2), now=0.01) == []
    assert pacer.add(Record({"acc": 0.5}, step=3), now=0.02) == []
    assert pacer.due(now=0.05) == []  # not yet
    [(merged, count)] = pacer.due(now=0.11)
    assert merged.values == {"loss": 0.9, "acc": 0.5} and merged.step == 3 and count == 2
    pacer.add(Record({"loss": 0.8}, step=4), now=0.12)
    assert [r.step for r, _ in pacer.due(now=0.13, flush=True)] == [4]  # the end: whatever is held


def test_a_merged_record_counts_the_reports_of_the_objective() -> None:
    pacer = Pacer(per_s=10, objective="acc")
    first = Record({"loss": 1.0}, step=1)
    assert pacer.add(first, now=0.0) == [(first, 1)] and first.said is None  # alone: no count needed
    for record in (Record({"loss": 0.9, "acc": 0.1}), Record({"acc": 0.2}), Record({"acc": 0.3}),
                   Record({"loss": 0.8})):
        assert pacer.add(record, now=0.01) == []
    [(merged, count)] = pacer.due(now=0.2)
    assert count == 4 and merged.values == {"loss": 0.8, "acc": 0.3} and merged.said == 3
    plain = Pacer(per_s=10)  # no objective: nothing counted
    plain.add(Record({"acc": 0.1}), now=0.0)
    plain.add(Record({"acc": 0.2}), now=0.01)
    plain.add(Record({"acc": 0.3}), now=0.02)
    [(merged, count)] = plain.due(now=0.2)
    assert count == 2 and merged.said is None


def test_ranks_are_paced_apart() -> None:
    pacer = Pacer(per_s=10)
    assert len(pacer.add(Record({"x": 1}, rank=0), now=0.0)) == 1
    assert len(pacer.add(Record({"x": 2}, rank=1), now=0.0)) == 1


def test_the_clock_goes_on_from_a_resumed_run_and_never_back() -> None:
    clock = Clock(before_s=100.0, started_wall=1000.0, started=0.0)
    import time as _time

    clock.started = _time.monotonic() - 5.0  # five seconds into this attempt
    assert 104.9 <= clock.elapsed(said_wall=1004.95) <= 105.5
    assert clock.elapsed(said_wall=1001.0) >= 104.9  # an earlier time said later: never back
    assert clock.elapsed(said_wall=10**12) <= 106.0  # the future: now, not then
    assert clock.elapsed(said_wall=5.0) <= 106.0  # before the attempt: now


def test_parameters_are_substituted_into_the_command() -> None:
    command = ["python", "train.py", "--lr", "{lr}", "--name=run-{width}", "{unknown}", "{{lr}}"]
    assert substitute(command, {"lr": 0.001, "width": 64}) == [
        "python", "train.py", "--lr", "0.001", "--name=run-64", "{unknown}", "{0.001}"]
    assert substitute(command, {}) == command


def test_a_missing_program_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such program on PATH"):
        find_program("surely-not-a-program-xyz", tmp_path, os.environ.get("PATH", ""))
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    with pytest.raises(UserError, match="not executable"):
        find_program("./train.sh", tmp_path, "")
    (tmp_path / "train.sh").chmod(0o700)
    assert find_program("./train.sh", tmp_path, "") == str(tmp_path / "train.sh")
    with pytest.raises(UserError, match="does not exist"):
        find_program("./nope.sh", tmp_path, "")
    (tmp_path / "code").mkdir()  # said "does not exist" of a directory that does
    with pytest.raises(UserError, match=r"^\./code: is a directory, not a program"):
        find_program("./code", tmp_path, "")


def sample(index: int, used: float, util: float, total: float = 80000) -> GpuSample:
    return GpuSample(index=index, mem_used_mib=used, mem_total_mib=total, util_pct=util)


def test_auto_takes_the_least_used_gpus() -> None:
    found = [sample(0, 70000, 90), sample(1, 500, 5), sample(2, 500, 50), sample(3, 40000, 0)]
    choice = gpus.choose("auto", None, 2, {}, read=lambda: (found, None))
    assert choice.visible == (1, 2) and "least-used" in choice.why
    assert choice.env() == {"CUDA_VISIBLE_DEVICES": "1,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_named_gpus_and_cpu_and_the_environment_win() -> None:
    never = lambda: pytest.fail("NVML read although the choice was given")  # noqa: E731
    assert gpus.choose("auto", (3, 1), 2, {}, read=never).visible == (3, 1)
    assert gpus.choose("cuda:2", None, 1, {}, read=never).visible == (2,)
    cpu = gpus.choose("cpu", None, 1, {}, read=never)
    assert cpu.visible == () and cpu.env()["CUDA_VISIBLE_DEVICES"] == "" and cpu.device == "cpu"
    kept = gpus.choose("auto", None, 1, {"CUDA_VISIBLE_DEVICES": "5"}, read=never)
    assert kept.visible is None and kept.env() == {} and "kept" in kept.why


def test_no_gpu_runs_as_it_would_and_too_many_is_one_line() -> None:
    none = gpus.choose("auto", None, 1, {}, read=lambda: ([], "no NVIDIA driver"))
    assert none.visible is None and none.device == "cpu" and "no NVIDIA driver" in none.why
    with pytest.raises(UserError, match="no GPU found"):
        gpus.choose("cuda", None, 1, {}, read=lambda: ([], "no NVIDIA driver"))
    with pytest.raises(UserError, match="--nproc 1 or fewer"):
        gpus.choose("auto", None, 2, {}, read=lambda: ([sample(0, 0, 0)], None))


# -- gputui.report, in a process of its own (its environment is read at import) ----------------------

def run_report(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def test_report_imports_neither_torch_nor_the_rest_of_gputui(tmp_path: Path) -> None:
    done = run_report("import sys\nfrom gputui import report\n"
                      "print(sorted(m for m in sys.modules if m.startswith(('gputui', 'torch', 'numpy', 'psutil'))))",
                      {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['gputui', 'gputui.report']"


def test_report_writes_lines_gputui_reads(tmp_path: Path) -> None:
    events = tmp_path / "reported.jsonl"
    code = ("from gputui import report\n"
            "report.log(step=1, epoch=0, loss=0.5, acc=1)\n"
            "report.log(loss=float('nan'), ok=2.0)\n"
            "try:\n    report.log(loss='low')\nexcept TypeError as e:\n    print('refused', e)\n"
            "try:\n    report.log(step=1.5, x=1)\nexcept TypeError as e:\n    print('refused', e)\n")
    done = run_report(code, {"GPUTUI_EVENTS": str(events)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("refused") == 2
    records = Reports().feed(events.read_bytes())
    assert [(r.values, r.step, r.epoch) for r in records] == [({"loss": 0.5, "acc": 1}, 1, 0), ({"ok": 2.0}, None, None)]


def test_numpy_scalars_are_numbers_and_other_objects_are_not(tmp_path: Path) -> None:
    events = tmp_path / "reported.jsonl"
    code = ("import numpy as np\nfrom gputui import report\n"
            "report.log(step=np.int64(2), a=np.float32(0.5), b=np.int64(7), c=np.float64('inf'))\n"
            "class Tensorish:\n    def __float__(self): return 1.0\n"
            "try:\n    report.log(x=Tensorish())\nexcept TypeError as e:\n    print('refused', e)\n")
    done = run_report(code, {"GPUTUI_EVENTS": str(events)})
    assert done.returncode == 0, done.stderr
    assert "refused report.log: x=" in done.stdout and "loss.item()" in done.stdout
    [record] = Reports().feed(events.read_bytes())
    assert (record.values, record.step) == ({"a": 0.5, "b": 7}, 2)


def test_only_rank_0_reports_unless_all_ranks(tmp_path: Path) -> None:
    events = tmp_path / "reported.jsonl"
    code = "from gputui import report\nreport.log(x=1)\nreport.log(y=2, all_ranks=True)\n"
    for rank in ("0", "1"):
        assert run_report(code, {"GPUTUI_EVENTS": str(events), "RANK": rank}).returncode == 0
    records = Reports().feed(events.read_bytes())
    assert [(r.values, r.rank) for r in records] == [({"x": 1}, None), ({"y": 2}, 0), ({"y": 2}, 1)]


def test_report_outside_gputui_is_harmless(tmp_path: Path) -> None:
    code = ("from gputui import report\nreport.log(x=1)\n"
            "print(report.resuming(), report.trial(), report.should_stop(), report.checkpoint_dir())")
    env = {k: "" for k in ("GPUTUI_EVENTS", "GPUTUI_TRIAL", "GPUTUI_RESUME", "GPUTUI_STOP_FILE", "GPUTUI_CHECKPOINT_DIR")}
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "{}", "False", "checkpoints"]
    assert (tmp_path / "checkpoints").is_dir() and list(tmp_path.iterdir()) == [tmp_path / "checkpoints"]


def test_trial_resuming_and_checkpoint_dir_come_from_gputui(tmp_path: Path) -> None:
    code = ("from gputui import report\n"
            "print(report.resuming(), report.trial()['lr'], report.checkpoint_dir())")
    done = run_report(code, {"GPUTUI_RESUME": "1", "GPUTUI_TRIAL": '{"lr": 0.01}',
                             "GPUTUI_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert done.stdout.split() == ["True", "0.01", str(tmp_path / "ck")]
    assert run_report("from gputui import report\nprint(report.trial())", {"GPUTUI_TRIAL": "[1]"}).stdout.strip() == "{}"


def test_should_stop_turns_true_on_sigterm_and_on_the_stop_file(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    code = ("import os, signal, sys, time\nfrom gputui import report\n"
            "print(report.should_stop(), flush=True)\n"
            "if sys.argv[1] == 'signal':\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "else:\n    open(os.environ['GPUTUI_STOP_FILE'], 'w').close()\n"
            "deadline = time.monotonic() + 30\n"
            "while not report.should_stop() and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
            "print(report.should_stop())\n")
    env = {**os.environ, "GPUTUI_EVENTS": str(tmp_path / "r.jsonl"), "GPUTUI_STOP_FILE": str(stop)}
    for how in ("signal", "file"):
        stop.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-c", code, how], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr  # SIGTERM did not end it: it asked it to stop
        assert done.stdout.split() == ["False", "True"], how


def test_a_sigterm_while_the_program_exits_does_not_end_it_with_143(tmp_path: Path) -> None:
    """A program stops by itself on `should_stop()` (the stop file comes before gputui's SIGTERM);
    the SIGTERM lands as Python shuts down, after it put SIGTERM's default back: the program's own
    status stays (a sweep's pruned trial once ended `interrupted` with exit_code 143 this way).
    The signal is sent from a module global's __del__, which runs after that point (a kill of
    oneself is delivered before os.kill returns)."""
    code = ("import os, signal, sys\nfrom gputui import report\n"
            "class Late:\n    def __del__(self):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n        os.write(1, b'still here')\n"
            "late = Late()\n")
    env = {"GPUTUI_EVENTS": str(tmp_path / "r.jsonl")}
    # The hazard itself, shown with a program's own handler (gputui leaves that one alone):
    control = run_report("import signal\nsignal.signal(signal.SIGTERM, lambda *_: None)\n" + code, env)
    if control.returncode != -signal.SIGTERM:
        pytest.skip(f"this Python keeps SIGTERM's handler through its module teardown ({control.returncode})")
    done = run_report(code, env)
    assert (done.returncode, done.stdout) == (0, "still here"), done.stderr


def test_a_report_the_disk_refuses_costs_the_report_never_the_program(tmp_path: Path) -> None:
    """/dev/full refuses every write (ENOSPC): report.log goes on without raising, says it once
    on stderr, and nothing is left to fail as Python exits."""
    code = ("from gputui import report\nfor i in range(5):\n    report.log(step=i, loss=0.5)\n"
            "print('went on')\n")
    done = run_report(code, {"GPUTUI_EVENTS": "/dev/full"})
    assert (done.returncode, done.stdout.strip()) == (0, "went on"), done.stderr
    assert done.stderr.splitlines() == ["gputui.report: cannot write /dev/full: No space left on device; "
                                        "reports are lost until it can be written (the program goes on)"]


def test_a_short_write_leaves_the_next_report_on_a_line_of_its_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from gputui import report

    path = tmp_path / "reported.jsonl"
    monkeypatch.setenv("GPUTUI_EVENTS", str(path))
    reporter = report._Reporter()
    monkeypatch.setattr(report, "_reporter", reporter)
    real_write = os.write
    short = [True]

    def write(fd: int, data: bytes) -> int:
        if short and fd == reporter.fd:
            short.pop()
            return real_write(fd, data[:5])  # a disk that took only five bytes
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    report.log(step=1, loss=0.5)
    report.log(step=2, loss=0.25)
    monkeypatch.undo()
    os.close(reporter.fd)
    lines = path.read_text().splitlines()
    assert lines == ['{"val', '{"values":{"loss":0.25},"step":2}'], lines
    assert "a short write (5 of " in capsys.readouterr().err
    assert path.stat().st_mode & 0o777 == 0o600  # gputui's file, whatever the program's umask


def test_a_forked_child_still_ends_on_sigterm(tmp_path: Path) -> None:
    """A data loader's worker forked after `import gputui.report` must not keep the stop handler."""
    code = ("import os, signal, sys\nfrom gputui import report\n"
            "r, w = os.pipe()\npid = os.fork()\n"
            "if pid == 0:\n    os.write(w, b'up')\n    while True:\n        signal.pause()\n"
            "os.read(r, 2)\n"  # the child runs Python code: the signal is not lost in the fork itself
            "os.kill(pid, signal.SIGTERM)\n_, status = os.waitpid(pid, 0)\n"
            "print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)\n")
    done = run_report(code, {"GPUTUI_EVENTS": str(tmp_path / "r.jsonl")})
    assert done.stdout.strip() == "True", done.stderr


def test_the_terminal_view_of_a_program_has_one_status_line() -> None:
    import io

    from gputui.model.events import make
    from gputui.views.program import ProgramView, TerminalView

    view = TerminalView()
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[1, 3], device="cuda",
                   strategy="single", world_size=1))
    inner = view.inner
    assert isinstance(inner, ProgramView)
    inner.console.file = io.StringIO()  # not a terminal: no live line
    view.show(make("metrics", step=10, epoch=1, values={"loss": 0.25, "val_acc": 0.9}, elapsed_s=65.0))
    view.show(make("metrics", step=20, values={"loss\x1b[31m": 0.125}, elapsed_s=66.0))
    line = inner.status_text()
    assert line.startswith("step 20 · epoch 1 · ")
    assert "\x1b" not in line and "0.125" in line  # a hostile name is cleaned, never a terminal escape
    assert "val_acc 0.9" in line and "loss 0.25" in line and "GPU 1,3" in line and "1m" in line
    net = TerminalView()
    net.show(make("start", run_id="r2", model="seed", device="cpu", strategy="single", world_size=1, epochs=1,
                  total_steps=10, steps_per_epoch=10))
    assert not isinstance(net.inner, ProgramView)  # a built-in net keeps its progress bar
    net.close()


def test_a_checkpoint_report_is_marked_and_survives_merging(tmp_path: Path) -> None:
    events = tmp_path / "reported.jsonl"
    code = "from gputui import report\nreport.log(step=5, loss=0.5)\nreport.log(step=6, checkpoint=True)\n"
    assert run_report(code, {"GPUTUI_EVENTS": str(events)}).returncode == 0
    first, second = Reports().feed(events.read_bytes())
    assert (first.checkpoint, second.checkpoint, second.values, second.step) == (False, True, {}, 6)
    pacer = Pacer(per_s=10)
    pacer.add(first, now=0.0)
    assert pacer.add(second, now=0.01) == []
    [(merged, count)] = pacer.due(now=0.2)
    assert merged.checkpoint and merged.values == {} and count == 1


def test_off_a_terminal_each_line_of_the_view_is_one_line() -> None:
    """A log or `| cat` gets whole lines: the header and a long warning were folded at 80 columns."""
    import io

    from gputui.views.program import ProgramView

    out = io.StringIO()
    view = ProgramView(stderr=out)
    view.show({"event": "start", "run_id": "20261207-060306-252b", "program": "python train.py " + "--flag " * 20})
    warning = "the program's GPUTUI_EVENTS sent a metric named 'a b' (a name is a letter or _, then up to 63 letters)"
    view.show({"event": "warning", "message": warning})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("run 20261207-060306-252b: python train.py --flag")
    assert lines[0].endswith(" on CPU") and lines[1] == f"warning: {warning}", lines


def test_a_progress_bar_is_split_as_a_terminal_shows_it_and_never_cut() -> None:
    """tqdm redraws "\r" + the bar thousands of times before its newline: each redraw comes out on
    its own ("\r"), what a terminal shows of the frame not yet ended comes after each chunk (""),
    and the last frame is a line; nothing is cut at 64 KiB, and output.log gets every byte."""
    import io
    import threading

    from gputui.jobs.program import _Pump

    frames = [f"\rtrain {i}/3000 loss={1 / (i + 1):.6f} {'#' * 20}" for i in range(3000)]
    data = ("".join(frames) + "\nval_acc=0.97\n").encode()
    assert len(data) > 2 * 64 * 1024
    seen: list[tuple[str, str, str]] = []
    log = io.BytesIO()
    pump = _Pump(io.BytesIO(data), "stderr", log, threading.Lock(), lambda text, stream, end: seen.append((text, stream, end)))
    pump.run()
    assert log.getvalue() == data
    redraws = [text for text, _, end in seen if end == "\r"]
    lines = [text for text, _, end in seen if end == "\n"]
    assert redraws == [f[1:] for f in frames[:-1]] and lines == [frames[-1][1:], "val_acc=0.97"]
    shown = [text for text, _, end in seen if end == ""]
    assert shown and all(text.startswith("train ") or text == "" for text in shown)  # frames cut by a chunk's end
    assert not any("[...]" in text for text, _, _ in seen) and pump.last == "val_acc=0.97"


def test_on_a_terminal_a_bar_is_one_line_above_the_status_and_off_it_passes_through(
        capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from rich.console import Console

    from gputui.model.events import make
    from gputui.views.program import ProgramView

    view = ProgramView()
    screen = io.StringIO()
    view.console = Console(file=screen, force_terminal=True, width=100)
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="single", world_size=1))
    assert view.live is not None

    def drawn() -> str:
        out = Console(file=io.StringIO(), width=100)
        out.print(view._status())
        return out.file.getvalue()  # type: ignore[attr-defined]

    view.output("train 5/10 \x1b[31mloss=0.2", "stderr", "\r")
    assert view.progress == ("stderr", "train 5/10 loss=0.2") and "train 5/10 loss=0.2" in drawn()
    view.output("val_acc=0.9", "stdout", "\n")  # a line of the other stream leaves the bar where it is
    assert view.progress is not None
    view.output("train 10/10 loss=0.1", "stderr", "\n")  # the bar's last frame, printed for good
    assert view.progress is None and "train" not in drawn()
    view.output("Loading", "stdout", "")  # a line not yet ended shows too, and a blank redraw clears it
    assert view.progress == ("stdout", "Loading")
    view.output("  ", "stdout", "\r")
    assert view.progress is None
    view.close()
    printed = screen.getvalue()
    assert "val_acc=0.9" in printed and "train 10/10 loss=0.1" in printed

    off = ProgramView(stderr=io.StringIO())  # not a terminal: the bytes as they came, no "" frames
    off.output("train 1/2", "stderr", "\r")
    off.output("Load", "stderr", "")
    off.output("train 2/2", "stderr", "\n")
    assert capsys.readouterr().err == "train 1/2\rtrain 2/2\n"


def test_on_a_terminal_a_burst_of_lines_is_printed_in_batches_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each line printed alone redrew the live status line: a program printing 20,000 lines was
    held back 30x (its pipe full). A burst is now printed together: at once for a line after a
    pause, then at most PRINT_LINES at a time, the rest at the runner's next tick; a warning and
    the end print what is held first. The clock stands still here: only the count lets lines out."""
    import io

    from rich.console import Console

    from gputui.model.events import make
    from gputui.views import program as shown

    monkeypatch.setattr(shown.time, "monotonic", lambda: 1000.0)
    view = shown.ProgramView()
    screen = io.StringIO()
    view.console = Console(file=screen, force_terminal=True, width=100)
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="single", world_size=1))
    from rich.text import Text

    prints: list[int] = []  # the lines of each Text printed (the live display's own refreshes print Controls)
    real_print = view.live.console.print
    monkeypatch.setattr(view.live.console, "print", lambda text, **kw: (
        prints.append(str(text).count("\n") + 1) if isinstance(text, Text) else None, real_print(text, **kw))[1])
    for i in range(2500):
        view.output(f"line {i}", "stdout", "\n")
    assert prints == [1, shown.PRINT_LINES, shown.PRINT_LINES]  # the first at once, then full batches
    view.tick()
    assert prints[-1] == 2500 - 1 - 2 * shown.PRINT_LINES
    view.output("late", "stdout", "\n")
    view.show(make("warning", reason="bad_report", message="a warning"))
    view.close()
    text = screen.getvalue()
    numbers = [int(word) for word in text.replace("\r", "\n").split() if word.isdigit()]
    assert numbers == list(range(2500)), "every line once, in order"
    assert text.index("late") < text.index("a warning")


def test_the_status_lines_clock_runs_between_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that only prints sent no elapsed time: the status line said 0s for the whole run.
    It counts on from the last time the run said (not for a resumed run before its first report,
    whose clock goes on from where it was), and the run's own figure wins at the end."""
    import io

    from rich.console import Console

    from gputui.model.events import make
    from gputui.views import program as shown

    now = [100.0]
    monkeypatch.setattr(shown.time, "monotonic", lambda: now[0])
    view = shown.ProgramView()
    view.console = Console(file=io.StringIO(), force_terminal=True, width=100)
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="single", world_size=1))
    drawn = view._drawn
    now[0] = 105.0
    assert " 5s " in f" {view.status_text()} "
    view.tick()
    assert view._drawn == 105.0 > drawn  # redrawn by the runner's tick, with nothing reported
    view.show(make("metrics", step=1, values={"loss": 1.0}, elapsed_s=3.0))
    now[0] = 109.0
    assert " 7s " in f" {view.status_text()} "
    view.show(make("done", exit_code=0, elapsed_s=12.5))
    now[0] = 200.0
    assert " 12s " in f" {view.status_text()} "
    resumed = shown.ProgramView()
    resumed.console = Console(file=io.StringIO(), force_terminal=True, width=100)
    resumed.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                      strategy="single", world_size=1, resumed=True))
    now[0] = 230.0
    assert " 0s " in f" {resumed.status_text()} "
    resumed.close()


def test_a_clusters_events_before_the_start_wait_for_it_to_pick_the_view() -> None:
    """A cluster run says what its nodes do before its start event; the first of them picked the
    built-in net's progress bar, so a program on a cluster showed an empty bar ("epoch 1/0 ...
    loss n/a") and none of its output."""
    from gputui.model.events import make
    from gputui.views.program import ProgramView, TerminalView

    view = TerminalView()
    view.show(make("node", node="n0", kind="ready", message="n0 ready"))
    assert view.inner is None and len(view.pending) == 1
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="ddp", world_size=2))
    assert isinstance(view.inner, ProgramView) and view.pending == []
    view.close()
    ended = TerminalView()  # stopped during the bring-up: the end still has a view to say it
    ended.show(make("node", node="n0", kind="ready", message="n0 ready"))
    ended.show(make("interrupted", reason="SIGINT", elapsed_s=1.0))
    assert ended.inner is not None and not isinstance(ended.inner, ProgramView)
    ended.close()


def test_the_programs_streams_share_a_pipe_where_they_meet_and_are_copied_where_not_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where gputui's stdout and stderr are one place (a terminal, `> log 2>&1`) the program gets
    one pipe for both, so their order is its own; a stream the view does not draw is copied as
    the program wrote it: off a terminal both, on a terminal a stdout sent elsewhere (`> out.txt`)."""
    from gputui.views.program import ProgramView

    log = (tmp_path / "log").open("w")
    other = (tmp_path / "other").open("w")
    again = (tmp_path / "log").open("a")  # the same file, opened twice
    view = ProgramView(stderr=log)

    def placed(stdout: object, live: bool) -> list[tuple[str, bool]]:
        monkeypatch.setattr(sys, "stdout", stdout)
        view.live = object() if live else None
        return [(name, copy is not None) for name, copy in view.program_streams()]

    assert placed(log, live=False) == [("output", True)]
    assert placed(again, live=False) == [("output", True)]
    assert placed(other, live=False) == [("stdout", True), ("stderr", True)]
    assert placed(log, live=True) == [("output", False)]  # one pipe, drawn line by line
    assert placed(other, live=True) == [("stdout", True), ("stderr", False)]
    from gputui.views.program import TerminalView

    # Only output.log has it (a view not yet picked; --json, the dashboard and sweeps have no
    # program_streams): one pipe, in order.
    assert TerminalView().program_streams() == [("output", None)]

    view.live = None
    copy = dict(view.program_streams())["stdout"]
    assert copy is not None
    other.write("gputui's own line\n")  # what gputui wrote first stays first
    copy(b"\xff\x00 not text" + b"x" * 100_000)
    assert (tmp_path / "other").read_bytes() == b"gputui's own line\n\xff\x00 not text" + b"x" * 100_000
    other.close()
    copy(b"more")  # a stream that refuses (closed, its reader gone) costs nothing, and is let be
    assert getattr(copy, "broken") is True
    copy(b"more")
    log.close()
    again.close()


def test_two_streams_sharing_output_log_never_write_inside_each_others_lines() -> None:
    """With two pipes (--json, the dashboard, sweeps) each pump wrote its chunks as they came:
    a stdout line landed inside a tqdm frame of stderr ("epoch 0:  90%|...|epoch 0 val_acc:
    0.90"), and the dashboard's output view showed it so. Each now writes whole lines and
    redraws. Here stderr's pump is held after its first chunk (a frame not yet ended) while
    stdout's line is written: the line comes between the frames, not inside one."""
    import io
    import threading

    from gputui.jobs.program import _at_segment_end, _Pump

    assert _at_segment_end(b"a\nb\rc") == (b"a\nb\r", b"c")
    assert _at_segment_end(b"a\nb\r") == (b"a\n", b"b\r")  # maybe the first half of a CRLF
    assert _at_segment_end(b"x" * (70 * 1024)) == (b"x" * (70 * 1024), b"")  # too long to hold: written

    asked, go = threading.Event(), threading.Event()

    class Held:
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def read1(self, size: int) -> bytes:
            if len(self.chunks) == 1:  # stderr's first chunk has been written: let stdout in
                asked.set()
                assert go.wait(30), "the test never let stderr's pump go on"
            return self.chunks.pop(0) if self.chunks else b""

        read = read1

    log, lock = io.BytesIO(), threading.Lock()
    seen: list[str] = []
    stderr = _Pump(Held([b"\repoch 0:  90%|#########", b"\repoch 0: 100%|##########\n"]), "stderr", log, lock,
                   lambda text, stream, end: seen.append(text), whole_segments=True)
    stdout = _Pump(io.BytesIO(b"epoch 0 val_acc: 0.90\n"), "stdout", log, lock,
                   lambda text, stream, end: seen.append(text), whole_segments=True)
    stderr.start()
    assert asked.wait(30), "stderr's pump did not read its first chunk"
    stdout.run()
    go.set()
    stderr.join(30)
    assert not stderr.is_alive()
    written = log.getvalue()
    assert sorted(written) == sorted(b"\repoch 0:  90%|#########\repoch 0: 100%|##########\nepoch 0 val_acc: 0.90\n")
    segments = written.replace(b"\r", b"\n").split(b"\n")
    assert b"epoch 0 val_acc: 0.90" in segments and b"epoch 0:  90%|#########" in segments, written


def test_on_a_terminal_a_clusters_stdout_lines_go_to_stdout_when_it_is_not_that_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's rank 0 gives its lines to the view (one stream from its node): under
    `> out.txt` they were drawn on the terminal and out.txt stayed empty, as a local program's
    stdout was. They now go where gputui's stdout goes; the terminal keeps the status line."""
    from rich.console import Console

    from gputui.model.events import make
    from gputui.views.program import ProgramView

    screen = (tmp_path / "screen").open("w")
    out = (tmp_path / "out.txt").open("w")
    monkeypatch.setattr(sys, "stdout", out)
    view = ProgramView()
    view.console = Console(file=screen, force_terminal=True, width=100)
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="single", world_size=1))
    assert view.live is not None
    view.output("train 1/2", "stdout", "\r")
    view.output("val_acc=0.97", "stdout", "\n")
    view.output("a warning of gputui's own stream", "stderr", "\n")
    view.close()
    out.close()
    screen.close()
    assert (tmp_path / "out.txt").read_bytes() == b"train 1/2\rval_acc=0.97\n"
    drawn = (tmp_path / "screen").read_text()
    assert "val_acc" not in drawn and "a warning of gputui's own stream" in drawn


def test_a_sweep_profile_run_alone_needs_a_value_for_each_parameter_in_its_command(tmp_path: Path,
                                                                                  gputui_home: Path) -> None:
    """`gputui run --profile SWEEP.toml`: a {name} of [sweep.params] that [run] trial does not give
    is one line before anything starts (the program got "{lr}" as its lr); given, it is filled."""
    import re

    from gputui.config.run import RunSettings
    from gputui.jobs.run import RunRequest, prepare

    profile = tmp_path / "s.toml"
    text = ('[run]\ncommand = ["python", "t.py", "--lr", "{lr}", "{act}"]\ntrial = {act = "gelu"}\n\n'
            '[sweep]\nobjective = "val_acc"\n\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n'
            'act = ["relu", "gelu"]\n')
    profile.write_text(text)
    with pytest.raises(UserError, match=re.escape(
            f"{profile}: [run] command has {{lr}}, a [sweep.params] parameter with no value outside a sweep: run it "
            f"with `gputui sweep {profile}`, or give it one in [run] trial, e.g. trial = {{lr = 0.0001}}")):
        prepare(RunRequest(profile, RunSettings(), run_dir=tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    profile.write_text(text.replace('trial = {act = "gelu"}', 'trial = {act = "gelu", lr = 0.01}'))
    _run, cfg, resumed = prepare(RunRequest(profile, RunSettings(), run_dir=tmp_path / "run"))
    assert cfg.command == ("python", "t.py", "--lr", "0.01", "gelu") and not resumed
