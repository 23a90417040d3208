"""benchmarks/gpu_check.sh, the one command a lent GPU runs first, dry-run on the CPU so that it
cannot rot: every step runs (small sizes) and summary.txt has every figure's line, each saying
"cpu dry run" where a GPU run says PASS or FAIL."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, cli_env

pytestmark = pytest.mark.integration


def _figure_keys() -> list[str]:
    spec = importlib.util.spec_from_file_location("gpu_check_summary", REPO / "benchmarks" / "gpu_check_summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [key for key, *_ in module.FIGURES]


def test_the_dry_run_writes_every_figure_line(small_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                            timeout=600, cwd=REPO,
                            env=cli_env(GPU_CHECK_DEVICE="cpu", GPU_CHECK_DATA=str(small_data), OUT=str(out),
                                        PY=sys.executable))
    assert result.returncode == 0, result.stderr
    steps = [line.split()[:2] for line in (out / "steps.txt").read_text(encoding="utf-8").splitlines()]
    assert [name for name, _ in steps] == ["env", "graph", "time_to_99", "seed_run", "fast_run", "seed_long_nvml",
                                           "pytest"]
    assert all(rc == "0" for _, rc in steps), steps
    lines = (out / "summary.txt").read_text(encoding="utf-8").splitlines()
    assert "cpu dry run" in lines[0]
    for key in _figure_keys():
        line = next((line for line in lines if line.startswith(f"{key}: ")), None)
        assert line is not None, f"summary.txt has no line for {key}:\n" + "\n".join(lines)
        assert "[cpu dry run]" in line and "(target " in line, line
    figures = {line.split(":")[0]: line for line in lines}
    assert "no figure" not in figures["fast_graph"] and "no figure" not in figures["time_to_99"], lines
    assert "1 fallback(s)" in figures["failed_capture"] and "trains after: True" in figures["failed_capture"]
