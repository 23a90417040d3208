"""`gputui run` end to end: the --json event stream, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gputui.cli import main
from gputui.train.meter import MIN_STEP_EVENTS

from .conftest import json_lines, run_cli

# What this machine has, as the test process sees it: the expectations below follow it, so
# the suite means the same on a laptop, on CI (no GPU) and on a GPU machine.
CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0
MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def auto_device() -> str:
    """The device `--device auto` must pick here: CUDA, then MPS, then the CPU."""
    return "cuda:0" if CUDA_COUNT else ("mps" if MPS else "cpu")


def cuda_beyond(count: int) -> tuple[str, str]:
    """A cuda:N past the last visible device, and the message it must give with `count` devices."""
    spec = f"cuda:{max(count, 3)}"
    if count == 0:
        return spec, f"--device {spec}: no CUDA device is available"
    from gputui.model.units import plural

    return spec, f"--device {spec}: only {plural(count, 'CUDA device')} visible (cuda:0..cuda:{count - 1})"


def test_json_stream_has_only_events(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--json", "--data", str(small_data), "--epochs", "2", "--batch-size", "64",
                     "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)  # every stdout line is JSON
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done"
    assert kinds.count("epoch") == 2 and "step" in kinds
    start = events[0]
    for key in ("run_id", "model", "device", "strategy"):
        assert key in start
    assert start["model"] == "seed" and start["device"] == auto_device() and start["strategy"] == "single"
    step = next(e for e in events if e["event"] == "step")
    assert set(step) >= {"epoch", "step", "loss", "samples_per_s", "lr"}
    epoch = [e for e in events if e["event"] == "epoch"][-1]
    assert set(epoch) >= {"epoch", "step", "train_loss", "test_loss", "test_acc", "elapsed_s", "eval_s"}
    assert epoch["epoch"] == 2 and epoch["step"] == 16
    assert 1.0 < epoch["test_acc"] <= 100.0  # a percentage
    done = events[-1]
    assert set(done) >= {"test_acc", "elapsed_s", "epochs"}
    assert done["epochs"] == 2 and done["test_acc"] == epoch["test_acc"]
    # The file holds the same events.
    on_disk = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert on_disk == events
    profile = (tmp_path / "r" / "profile.toml").read_text()
    assert 'model = "seed"' in profile and "epochs = 2" in profile


def test_step_events_are_rate_bounded(small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2 s timer on a training clock the test drives (each reading of it 0.25 s later, a 70 s
    # run): the same events on a fast or a busy machine; far fewer events than steps, and the timer
    # fires several times between the events every 32nd step brings.
    from gputui.train import loop, meter

    ticks = iter(range(10**9))
    monkeypatch.setattr(meter, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.25))
    monkeypatch.setattr(loop, "STEP_EVENT_INTERVAL_S", 2.0)
    code = main(["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "2",
                 "--run-dir", str(tmp_path / "r")])
    assert code == 0
    events = json_lines(capsys.readouterr().out)
    steps = [e for e in events if e["event"] == "step"]
    total = events[0]["total_steps"]
    assert total == 256 and events[-1]["elapsed_s"] > 60
    assert len(steps) < total / 4  # far fewer events than steps
    span = events[-1]["elapsed_s"]
    # One per 2 s of training, and every 64th step (8 an epoch).
    assert len(steps) <= span / loop.STEP_EVENT_INTERVAL_S + MIN_STEP_EVENTS + 2


def test_human_output_without_json(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--data", str(small_data), "--epochs", "1", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0
    assert "done: test acc" in result.stderr
    assert "epoch 1/1" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--epochs", "0"], "--epochs 0: expected a whole number >= 1"),
        (["--epochs", "x"], "--epochs x: expected a whole number >= 1"),
        (["--model", "vgg"], "--model vgg: expected one of 'seed', 'fast'"),
        (["--device", "tpu"], "--device tpu: expected 'auto', 'cpu'"),
        (["--device", cuda_beyond(CUDA_COUNT)[0]], cuda_beyond(CUDA_COUNT)[1]),
        (["--data", "/nonexistent/dir"], "/nonexistent/dir: no such data directory"),
        (["--profile", "/nonexistent.toml"], "/nonexistent.toml: profile not found"),
        (["--resume", "last"], "--resume last: no runs in"),
        (["--resume", "nope"], "--resume nope: no such run"),
        (["--strategy", "dataparallel", "--device", "cpu"], "strategy dataparallel needs CUDA GPUs"),
        (["--nproc", "2"], "--nproc goes with --strategy ddp"),
        (["--batch-size", "100000"], "larger than the 512 training images"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    args: list[str], message: str, small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", "--data", str(small_data), "--run-dir", str(tmp_path / "r")]
    if "--data" in args:
        base = ["run", "--run-dir", str(tmp_path / "r")]
    if "--resume" in args:
        base = ["run"]
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("count", [0, 1, 2])
def test_cuda_index_past_the_visible_devices_says_how_many(
    count: int, small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message for each GPU count (the parametrised test above sees only this machine's)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    spec, message = cuda_beyond(count)
    code = main(["run", "--data", str(small_data), "--run-dir", str(tmp_path / "r"), "--device", spec])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_broken_profile_in_a_real_process(tmp_path: Path) -> None:
    profile = tmp_path / "bad.toml"
    profile.write_text("[run]\nepochs = -1\n")
    result = run_cli("run", "--profile", str(profile))
    assert result.returncode == 2
    assert result.stderr.strip() == f"gputui: error: {profile}:2: [run] epochs: expected a whole number >= 1 and <= 100000, got -1"
    assert result.stdout == ""


def test_reusing_a_run_dir_is_refused(small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_version_and_help() -> None:
    result = run_cli("--help")
    assert result.returncode == 0 and "run" in result.stdout
    result = run_cli("run", "--help")
    assert "--resume" in result.stdout and "--json" in result.stdout


def test_same_seed_same_weights(small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    for name in ("a", "b"):
        args = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--seed", "11", "--threads", "1"]
        assert main(args + ["--run-dir", str(tmp_path / name)]) == 0
    capsys.readouterr()
    a = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_headless_output_off_a_terminal_keeps_whole_lines(small_data: Path, tmp_path: Path) -> None:
    """stderr to a pipe (CI logs, `| cat`): no line folded at 80 columns, data shown as text
    (a run dir named `[cloud]...` is not markup), and the end says where the run is and how to see it."""
    import subprocess
    import sys

    from .conftest import cli_env

    run_dir = tmp_path / ("[cloud]x-" + "long-" * 20 + "name")
    result = subprocess.run([sys.executable, "-m", "gputui", "run", "--data", str(small_data), "--epochs", "1",
                             "--batch-size", "64", "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=300, env=cli_env(COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert f"run {run_dir.name}: model seed on {auto_device()} (single, 1 process)" in lines, result.stderr
    assert any(line.startswith("epoch 1/1: train loss ") and line.endswith(" s training)") for line in lines), lines
    assert (f"run saved in {run_dir}; see it with: gputui runs --dir {tmp_path}, "
            f"gputui runs export '{run_dir}' --csv") in lines, lines


def test_resuming_a_finished_run_says_it_is_complete(small_data: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "1", "--run-dir", str(run_dir)]) == 0
    done = json_lines(capsys.readouterr().out)[-1]
    before = (run_dir / "events.jsonl").read_text()
    assert main(["run", "--json", "--resume", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert out == ""  # no events: nothing ran
    assert err == f"run {run_dir} is already complete (1 epoch); resume with --epochs M (more than 1) to train more\n"
    assert (run_dir / "events.jsonl").read_text() == before
    # More epochs train on from where it ended.
    assert main(["run", "--json", "--resume", str(run_dir), "--epochs", "2"]) == 0
    events = json_lines(capsys.readouterr().out)
    assert events[0]["resumed_from_step"] == done["step"] and events[-1]["event"] == "done" and events[-1]["epochs"] == 2
