"""`gputui bench`: real short runs per configuration, speedup and efficiency, rows kept in the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gputui.jobs.bench import BenchRow, add_speedups, plan, table
from gputui.cluster.store import ClusterStore

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, trust, wait_no_leftovers,
)
from .conftest import run_cli


def test_bench_measures_cpu_ddp_and_the_cluster_and_keeps_the_rows(
    cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path
) -> None:
    node = cluster_nodes.shared_node(0)
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key, {"device": "cpu", "threads": 1})
    result = run_cli("bench", "--json", "--steps", "12", "--batch-size", "64", "--models", "seed",
                     "--profile", str(profile), timeout=300)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = {r["label"]: r for r in doc["rows"]}
    cpu, ddp = rows["seed cpu x1"], rows["seed cpu ddp x2"]
    cluster = rows["seed cluster 2 nodes x1"]
    for row in (cpu, ddp, cluster):
        assert row["status"] == "ok", row
        assert row["samples_per_s"] > 0
        assert row["s_per_epoch"] == pytest.approx(60000 / row["samples_per_s"], rel=0.01)
        assert row["extra"]["steps"] == 11  # the first step (warm-up) is left out
    assert cpu["speedup"] == 1.0 and cpu["efficiency"] == 1.0
    assert ddp["extra"]["world_size"] == 2 and cluster["extra"]["world_size"] == 2 and cluster["workers"] == 2
    assert ddp["speedup"] == pytest.approx(ddp["samples_per_s"] / cpu["samples_per_s"], rel=0.01)
    assert cluster["efficiency"] == pytest.approx(cluster["speedup"] / 2, rel=0.01)
    # The GPU rows follow what this machine has: measured when CUDA devices are visible,
    # one skipped row per configuration with the reason when none is (stated, not invented).
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = max(gpus, 1)
    gpu_rows = [r for r in doc["rows"] if "cuda" in r["label"] or "GPU" in r["label"]]
    assert [r["label"] for r in gpu_rows] == [f"seed cuda:{i}" for i in range(n)] + [
        "seed cuda:0 graph", f"seed dataparallel x{n} GPU", f"seed ddp x{n} GPU"]
    for row in gpu_rows:
        if gpus:
            assert row["status"] == "ok" and row["samples_per_s"] > 0 and row["detail"] == "", row
            assert str(row["extra"]["device"]).startswith("cuda"), row
        else:
            assert (row["status"], row["detail"], row["samples_per_s"], row["speedup"]) == (
                "skipped", "no GPU (CUDA) visible here", None, None), row
    with ClusterStore(gputui_home / "ledger.sqlite3") as store:
        kept = store.bench_history()
    assert [r["label"] for r in kept] == [r["label"] for r in doc["rows"]]
    assert kept[0]["samples_per_s"] == cpu["samples_per_s"]
    assert wait_no_leftovers("gputui-bench-") == []


def test_plan_covers_each_gpu_dataparallel_ddp_and_the_cluster() -> None:
    class Cluster:
        nodes, nproc_per_node = 3, 2

    rows = plan(["seed", "fast"], gpu_count=2, cpu_procs=2, cluster=Cluster(), cluster_profile=Path("c.toml"))
    labels = [r.label for r in rows if r.model == "seed"]
    assert labels == ["seed cpu x1", "seed cpu ddp x2", "seed cuda:0", "seed cuda:1", "seed cuda:0 graph",
                      "seed dataparallel x2 GPU", "seed ddp x2 GPU", "seed cluster 3 nodes x2"]
    graph = rows[4]
    assert (graph.device, graph.strategy, graph.cuda_graph, graph.baseline) == ("cuda:0", "single", True, "seed cuda:0")
    assert [r.cuda_graph for r in rows[2:4]] == [False, False]  # the per-GPU rows are the eager step
    cluster = rows[7]
    assert (cluster.workers, cluster.baseline, cluster.strategy) == (6, "seed cuda:0", "cluster")
    assert all(r.skip is None for r in rows)
    assert [r.baseline for r in rows if r.model == "fast"][:3] == ["fast cpu x1", "fast cpu x1", "fast cuda:0"]


def test_speedup_efficiency_and_table() -> None:
    rows = [BenchRow("a", "seed", "cpu", "single", 1, "a", "ok", 1000.0, 60.0),
            BenchRow("b", "seed", "cpu", "ddp", 2, "a", "ok", 1500.0, 40.0),
            BenchRow("c", "seed", "cuda:0", "single", 1, "c", "skipped", detail="no GPU (CUDA) visible here")]
    add_speedups(rows)
    assert (rows[1].speedup, rows[1].efficiency) == (1.5, 0.75)
    assert rows[2].speedup is None
    text = table(rows).splitlines()
    assert text[0].split()[:3] == ["configuration", "workers", "samples/s"]
    assert text[3].split() == ["b", "2", "1,500", "40.0", "1.50x", "75%", "a"]
    assert text[4].endswith("no GPU (CUDA) visible here") and " - " in text[4]


def test_bad_bench_arguments() -> None:
    result = run_cli("bench", "--models", "resnet")
    assert result.returncode == 2 and "expected names among seed, fast" in result.stderr
    result = run_cli("bench", "--batch-size", "63")
    assert result.returncode == 2 and "does not split evenly over --nproc 2" in result.stderr
