"""Multi-node training on one machine: sshd "nodes" on 127.0.0.2/.3, a wheel-bootstrapped
venv on each, torchrun with gloo and a c10d rendezvous served by the master."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from .cluster_fixture import ClusterNodes, cluster_profile, cluster_nodes, trust, wait_no_leftovers  # noqa: F401
from .conftest import cli_env, json_lines, run_cli

COMMON = ["--data", "{data}", "--epochs", "1", "--batch-size", "64", "--seed", "3", "--device", "cpu"]


def args(data: Path, *more: str) -> list[str]:
    return [a.replace("{data}", str(data)) for a in COMMON] + list(more)


def test_two_nodes_train_to_the_same_weights_as_one_process(
    cluster_nodes: ClusterNodes, small_data: Path, tmp_path: Path, gputui_home: Path
) -> None:
    node = cluster_nodes.node(0)
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key, {"threads": 1})

    single = run_cli("run", "--json", *args(small_data, "--threads", "1", "--run-dir", str(tmp_path / "single")))
    assert single.returncode == 0, single.stderr
    run_dir = tmp_path / "multi"
    multi = run_cli("run", "--json", "--profile", str(profile), *args(small_data, "--run-dir", str(run_dir)), timeout=240)
    assert multi.returncode == 0, multi.stderr + _logs(run_dir)

    events = json_lines(multi.stdout)
    kinds = [e["event"] for e in events]
    nodes = [e for e in events if e["event"] == "node"]
    assert [n["node"] for n in nodes] == ["n0"] and not nodes[0]["skipped"]
    assert "gputui 0.1.0 installed" in nodes[0]["steps"][-1] or any("installed" in s for s in nodes[0]["steps"])
    cluster = next(e for e in events if e["event"] == "cluster")
    assert cluster["nodes"] == ["master", "n0"] and cluster["world_size"] == 2
    start = next(e for e in events if e["event"] == "start")
    assert start["world_size"] == 2 and start["nodes"] == 2 and start["strategy"] == "ddp"
    assert kinds[-1] == "done" and events[-1]["step"] == 8
    # The master's run directory holds the relayed events and a checkpoint.
    assert [e["event"] for e in json_lines((run_dir / "events.jsonl").read_text())] == kinds
    a = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)
    b = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 8
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    init = _initial_weights(3)
    assert any(not torch.allclose(init[k], a["model"][k]) for k in init)  # it really trained
    # The slave's copy (its local rank 0 keeps one) agrees too.
    remote = next((node.home / ".gputui-cluster" / "runs").glob("*/ckpt.pt"))
    torch.testing.assert_close(torch.load(remote, weights_only=True)["model"]["fc2.weight"], b["model"]["fc2.weight"])
    assert wait_no_leftovers(str(run_dir)) == []

    # A second run bootstraps nothing: the marker matches.
    again = run_cli("run", "--json", "--profile", str(profile), *args(small_data, "--run-dir", str(tmp_path / "again")), timeout=240)
    assert again.returncode == 0, again.stderr
    node_event = next(e for e in json_lines(again.stdout) if e["event"] == "node")
    assert node_event["skipped"] and node_event["bootstrap_s"] < 2.0


def _initial_weights(seed: int) -> dict[str, torch.Tensor]:
    from gputui.train import nets

    torch.manual_seed(seed)
    return nets.build("seed", (28, 28), 10).state_dict()


def _logs(run_dir: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((run_dir / "nodes").glob("*.log"))) \
        if (run_dir / "nodes").is_dir() else ""
