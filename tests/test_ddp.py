"""DDP through torchrun: 2 CPU processes with gloo give the same weights as one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import json_lines, run_cli


def test_single_and_ddp_on_two_cpu_processes_agree(small_data: Path, tmp_path: Path) -> None:
    common = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "64",
              "--seed", "3", "--device", "cpu"]
    single = run_cli(*common, "--threads", "1", "--run-dir", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    ddp = run_cli(*common, "--strategy", "ddp", "--nproc", "2", "--run-dir", str(tmp_path / "ddp"))
    assert ddp.returncode == 0, ddp.stderr + (tmp_path / "ddp" / "launcher.log").read_text()

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


def test_ddp_batch_must_split_evenly(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--data", str(small_data), "--epochs", "1", "--batch-size", "63",
                     "--strategy", "ddp", "--nproc", "2", "--device", "cpu", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert "does not split evenly over 2 ddp processes" in result.stderr
    assert "Traceback" not in result.stderr
