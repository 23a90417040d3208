"""What README promises for `gputui run`, through the real command: Ctrl-C checkpoints and
exits 0, the printed bare run id resumes the run where it stopped, and a failure that is
not the user's (a worker killed, a checkpoint the disk refuses) exits 1 with one line."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import psutil
import pytest

from gputui.cloud.ledger import Ledger

from .cluster_fixture import wait_no_leftovers
from .conftest import cli_env, json_lines, run_cli
from .proc_support import Child

STEPS_PER_EPOCH = 8  # small_data: 512 images at batch 64


def test_ctrl_c_checkpoints_exits_0_and_the_printed_run_id_resumes_it(small_data: Path, tmp_path: Path,
                                                                     gputui_home: Path) -> None:
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--data", str(small_data), "--epochs", "1000",
                "--batch-size", "64", "--threads", "1"], env=cli_env(), name="gputui run") as run:
        start = run.wait_for(lambda e: e["event"] == "start", 120, "the 'start' event")
        # After an epoch a checkpoint is on disk; Ctrl-C now stops the loop.
        run.wait_for(lambda e: e["event"] == "epoch", 120, "an 'epoch' event")
        run.proc.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in run.rest(120, "the end of the output after SIGINT")]
        said = run.stderr_rest(60)
        assert run.proc.wait(timeout=60) == 0
    stopped = rest[-1]
    assert stopped["event"] == "interrupted" and stopped["reason"] == "SIGINT", rest
    assert all(e["event"] in ("step", "epoch", "eval") for e in rest[:-1])  # no "done": it stopped early
    run_dir = gputui_home / "runs" / start["run_id"]
    assert Path(stopped["checkpoint"]) == run_dir / "ckpt.pt" and (run_dir / "ckpt.pt").is_file()
    resume_hint = f"resume with: gputui run --resume {start['run_id']}"
    assert any(line.startswith("interrupted: checkpoint saved in ") and line.endswith(resume_hint) for line in said), said

    # The bare id, from another directory (so it cannot be read as a path), finishes the epoch it was in.
    epochs = stopped["epoch"]
    result = run_cli("run", "--resume", start["run_id"], "--json", "--epochs", str(epochs), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    again = json_lines(result.stdout)
    assert again[0]["event"] == "start" and again[0]["run_id"] == start["run_id"]
    assert again[0]["resumed_from_step"] == stopped["step"]
    assert [e["epoch"] for e in again if e["event"] == "epoch"] == [epochs]  # nothing done before is redone
    steps = [e["step"] for e in again if e["event"] == "step"]
    assert not steps or steps[0] > stopped["step"]
    assert again[-1]["event"] == "done" and again[-1]["step"] == epochs * STEPS_PER_EPOCH


def test_a_ddp_worker_that_dies_fails_the_run_with_exit_1_and_one_line(small_data: Path, tmp_path: Path) -> None:
    """Not the user's input: a training process is killed (as the OOM killer would) mid-run."""
    run_dir = tmp_path / "r"
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--data", str(small_data), "--epochs", "1000",
                "--batch-size", "64", "--strategy", "ddp", "--nproc", "2", "--device", "cpu", "--run-dir", str(run_dir)],
               env=cli_env(), name="gputui run --strategy ddp") as run:
        run.wait_for(lambda e: e["event"] == "epoch", 180, "an 'epoch' event")
        workers = [p for p in psutil.Process(run.proc.pid).children(recursive=True)
                   if "gputui.train.distributed" in " ".join(p.cmdline()) and "gputui.train.launch" not in " ".join(p.cmdline())]
        assert len(workers) == 2, [w.cmdline() for w in workers]
        workers[-1].kill()
        kinds = [json.loads(line)["event"] for line in run.rest(120, "the end of the output after a worker died")]
        said = run.stderr_rest(60)
        assert run.proc.wait(timeout=60) == 1
    assert "done" not in kinds and "interrupted" not in kinds
    assert len(said) == 1 and said[0].startswith("gputui: error: ddp workers failed (torchrun exit "), said
    assert said[0].endswith(f"see {run_dir / 'launcher.log'}")
    assert wait_no_leftovers(str(run_dir)) == []  # the other rank and torchrun went too
    with Ledger() as ledger:
        assert [(run_id, status) for run_id, _c, _s, _e, status in ledger.runs()] == [("r", "failed")]


def test_a_checkpoint_the_disk_refuses_exits_1_with_one_line(small_data: Path, tmp_path: Path) -> None:
    """Not the user's input: the kernel refuses the write (a file-size limit, as a quota would;
    the fast model's checkpoint is about 1.3 MB, everything else the run writes is far smaller)."""
    import resource

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, 512 * 1024))

    run_dir = tmp_path / "r"
    # One epoch: its end is the run's first checkpoint (with checkpoint_every_s = 5, a second epoch's would be).
    result = run_cli("run", "--json", "--model", "fast", "--data", str(small_data), "--epochs", "1", "--batch-size", "64",
                     "--run-dir", str(run_dir), preexec_fn=limit_files)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"gputui: error: cannot write checkpoint {run_dir / 'ckpt.pt'}: File too large; ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    kinds = [e["event"] for e in json_lines(result.stdout)]
    assert kinds[0] == "start" and "epoch" not in kinds and "done" not in kinds
    assert not (run_dir / "ckpt.pt").exists() and not (run_dir / "ckpt.pt.tmp").exists()
    with Ledger() as ledger:
        assert [(run_id, status) for run_id, _c, _s, _e, status in ledger.runs()] == [("r", "failed")]


def test_a_closed_output_checkpoints_says_interrupted_in_the_log_and_resume_goes_on(small_data: Path,
                                                                                     tmp_path: Path) -> None:
    """`gputui run --json | head`: the reader goes away after an epoch; the next event that cannot
    be written stops the run as one SIGTERM does: a checkpoint at the next step and `interrupted`
    (reason `output closed`) in the events log; exit 1, nothing on stderr about the pipe."""
    import os
    import select
    import subprocess
    import time

    run_dir = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "run", "--json", "--data", str(small_data), "--epochs",
                             "1000", "--batch-size", "64", "--threads", "1", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    try:
        assert proc.stdout is not None and proc.stderr is not None
        seen, deadline = b"", time.monotonic() + 180
        while b'"event": "epoch"' not in seen:  # an epoch's checkpoint is on disk: the stop's must be a later one
            assert time.monotonic() < deadline and proc.poll() is None, f"no epoch event: {seen[-800:]!r}"
            if select.select([proc.stdout], [], [], 0.5)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        proc.stdout.close()
        assert proc.wait(120) == 1
        err = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    events = json_lines((run_dir / "events.jsonl").read_text(encoding="utf-8"))
    stopped = events[-1]
    assert stopped["event"] == "interrupted" and stopped["reason"] == "output closed", events[-3:]
    assert Path(stopped["checkpoint"]) == run_dir / "ckpt.pt" and (run_dir / "ckpt.pt").is_file()
    epochs = stopped["epoch"] + 1
    again = run_cli("run", "--resume", str(run_dir), "--json", "--epochs", str(epochs), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = json_lines(again.stdout)
    assert resumed[0]["resumed_from_step"] == stopped["step"] and resumed[-1]["event"] == "done"
