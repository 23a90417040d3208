"""DDP through torchrun: 2 CPU processes with gloo give the same weights as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import json_lines, run_cli


def test_single_and_ddp_on_two_cpu_processes_agree(small_data: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # what the runs leave in it: nothing
    common = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "64",
              "--seed", "3", "--device", "cpu"]
    single = run_cli(*common, "--threads", "1", "--run-dir", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    ddp = run_cli(*common, "--strategy", "ddp", "--nproc", "2", "--run-dir", str(tmp_path / "ddp"))
    assert ddp.returncode == 0, ddp.stderr + (tmp_path / "ddp" / "launcher.log").read_text()

    # torchrun's per-rank directories (a torchelastic_* each launch) went with it; torch's own cache
    # (torchinductor_USER, one for all runs) may stay.
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    events = json_lines(ddp.stdout)  # the launcher shows rank 0's events, nothing else
    assert events[0]["event"] == "start"
    assert events[0]["strategy"] == "ddp" and events[0]["world_size"] == 2
    assert events[-1]["event"] == "done" and events[-1]["step"] == 8
    # The same weights report the same loss: the mean over the whole world, not rank 0's half-batch.
    alone = json_lines(single.stdout)
    for kind, key in (("step", "loss"), ("step", "l1"), ("epoch", "train_loss")):
        one = {e["step"]: e[key] for e in alone if e["event"] == kind}
        two = {e["step"]: e[key] for e in events if e["event"] == kind}
        assert one.keys() & two.keys(), (kind, one, two)
        for step in one.keys() & two.keys():
            assert two[step] == pytest.approx(one[step], rel=1e-4, abs=2e-5), (kind, key, step)

    a = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 8
    moved = False
    first = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)["model"]
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    # The weights really trained (not two untouched initialisations that trivially agree).
    torch.manual_seed(3)
    from gputui.train import nets

    init = nets.build("seed", (28, 28), 10).state_dict()
    moved = any(not torch.allclose(init[k], first[k]) for k in init)
    assert moved


def test_ddp_batch_must_split_evenly_and_says_so_before_anything_starts(
        small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.cli import main
    from gputui.config.run import uneven_batch
    from gputui.train import distributed

    def launch(*args: object, **kwargs: object) -> str:
        raise AssertionError("torchrun was started for a batch that cannot be split")

    monkeypatch.setattr(distributed, "launch", launch)
    assert main(["run", "--data", str(small_data), "--epochs", "1", "--batch-size", "63", "--strategy", "ddp",
                 "--nproc", "2", "--device", "cpu", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == ("gputui: error: batch_size 63 does not split evenly over 2 ddp processes; use a multiple of 2, "
                   "e.g. --batch-size 62\n")
    assert not (tmp_path / "r").exists()  # refused before its run directory, or any process, exists
    assert uneven_batch(64, 2) is None and uneven_batch(5, 1) is None
    assert (uneven_batch(3, 4) or "").endswith("use a multiple of 4, e.g. --batch-size 4")


# A rank ends without Python's interpreter teardown (gputui.train.distributed.exit_rank): torch's
# gloo threads, which outlive the group, could otherwise abort a finished rank with SIGABRT as they
# release the last collective's tensors (pytorch/pytorch#190489). The race itself cannot be forced
# here; what can: the exit skips teardown (an atexit hook never runs), flushes what was printed,
# and both rank entry points end through it.
_ATEXIT = ("import atexit, sys\n"
           "marker = sys.argv[1]\n"
           "atexit.register(lambda: open(marker, 'w').write('teardown ran'))\n")


def _run_python(code: str, marker: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ATEXIT + code, str(marker), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_exit_rank_flushes_what_was_printed_and_skips_python_teardown(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    done = _run_python("print('half a line', end='')\nprint('to stderr', end='', file=sys.stderr)\n"
                       "from gputui.train.distributed import exit_rank\nexit_rank(3)\n", marker)
    assert (done.returncode, done.stdout, done.stderr) == (3, "half a line", "to stderr")
    assert not marker.exists()
    # The hook itself works: a plain exit runs it.
    plain = _run_python("raise SystemExit(3)\n", marker)
    assert plain.returncode == 3 and marker.read_text() == "teardown ran"


@pytest.mark.parametrize("module, flag", [("gputui.train.distributed", "--run-dir"),
                                          ("gputui.cluster.worker", "--gputui-run-dir")])
def test_each_rank_entry_point_ends_through_exit_rank(module: str, flag: str, tmp_path: Path) -> None:
    marker, run_dir = tmp_path / "marker", tmp_path / "run"
    run_dir.mkdir()  # no profile in it: the rank says so and ends with the error's code
    extra = ["--gputui-node", "n0"] if module == "gputui.cluster.worker" else []
    done = _run_python("import runpy\nsys.argv = sys.argv[1:]\n"
                       f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n",
                       marker, flag, str(run_dir), *extra,
                       env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "GPUTUI_HOME": str(tmp_path / "home")})
    assert done.returncode not in (0, 1), done.stderr  # the error's own code, not a traceback's
    assert "Traceback" not in done.stderr, done.stderr
    assert not marker.exists(), done.stderr
