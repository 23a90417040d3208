"""The remote poll script and its parser: every recorded driver generation, run through the
real script with `sh` (no SSH), and the odd cases of nvidia-smi's CSV."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gputui.model.telemetry import HostState
from gputui.sources.nvsmi import (
    GPU_FIELDS,
    parse_apps,
    parse_gpu_rows,
    parse_ps,
    parse_report,
    parse_value,
    remote_command,
    split_row,
)
from tests.sshd_fixture import NVSMI_DATA

FIELDS = tuple(GPU_FIELDS)


def run_script(tmp_path: Path, fixture: str | None, fields: tuple[str, ...] = FIELDS) -> str:
    """Run the exact command a poll sends, locally, with the fake nvidia-smi on PATH."""
    bin_dir = tmp_path / f"bin-{fixture}"
    if not bin_dir.exists():
        bin_dir.mkdir()
        if fixture is not None:
            (bin_dir / "nvidia-smi").symlink_to(NVSMI_DATA / "fake-nvidia-smi")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    if fixture is not None:
        env["NVSMI_FIXTURE"] = str(NVSMI_DATA / fixture)
    out = subprocess.run(["/bin/sh", "-c", remote_command(fields)], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_parse_value_maps_missing_markers_to_none() -> None:
    for text in ("[N/A]", "N/A", " [Not Supported] ", "[Unknown Error]", "[GPU requires reset]", "", "   "):
        assert parse_value(text) is None, text
    assert parse_value("  94 ") == "94" and parse_value("P0  ") == "P0"


def test_rows_with_missing_columns_commas_and_units() -> None:
    fields = ("index", "name", "utilization.gpu", "memory.used", "power.draw")
    gpus, driver = parse_gpu_rows("0, Tesla, K80 (rev, b), 45 %, 1234 MiB, 80.5 W\n1, GPU\n\n", fields)
    assert driver is None
    a, b = gpus
    assert (a.index, a.name, a.util_pct, a.mem_used_mib, a.power_w) == (0, "Tesla, K80 (rev, b)", 45, 1234, 80.5)
    assert (b.index, b.name, b.util_pct, b.power_w) == (1, "GPU", None, None)
    assert split_row("a,b", 4) == ["a", "b", None, None]
    gpus, _ = parse_gpu_rows("[N/A], x\n", ("index", "name"))
    assert gpus[0].index == 0  # no index: position


def test_apps_and_ps() -> None:
    apps = parse_apps("GPU-1, 42, /usr/bin/python, 1000\nGPU-2, 43, a, b, [Not Supported]\nNo running processes found\nGPU-3, x, y, 1\n")
    assert [(u, p.pid, p.name, p.gpu_memory_mib) for u, p in apps] == [("GPU-1", 42, "/usr/bin/python", 1000), ("GPU-2", 43, "a, b", None)]
    assert parse_ps("    1 root     /sbin/init splash\n  42 ann python -m x\n junk\n") == {1: ("root", "/sbin/init splash"), 42: ("ann", "python -m x")}


@pytest.mark.parametrize(
    ("fixture", "n_gpus", "driver"),
    [("r470-k80", 2, "470.239.06"), ("r535-a100x8", 8, "535.183.01"), ("r550-rtx4090", 1, "550.90.07"), ("r390-gtx1080", 1, "390.157")],
)
def test_each_driver_generation_through_the_real_script(tmp_path: Path, fixture: str, n_gpus: int, driver: str) -> None:
    reading = parse_report(run_script(tmp_path, fixture), FIELDS)
    assert reading.state == HostState.OK and reading.message is None and reading.driver == driver
    assert len(reading.gpus) == n_gpus and [g.index for g in reading.gpus] == list(range(n_gpus))
    assert reading.mem_total_mib and reading.mem_used_mib is not None
    assert reading.cpu_before is not None and reading.cpu_after is not None
    for gpu in reading.gpus:
        assert gpu.name and gpu.uuid and gpu.mem_total_mib and gpu.pstate and gpu.pstate.startswith("P")
        assert gpu.pstate == gpu.pstate.strip()
        assert gpu.pcie_rx_kib_s is None  # nvidia-smi's query has no PCIe throughput
    on_first = reading.gpus[0].processes
    assert on_first and on_first[0].pid == 1 or fixture == "r550-rtx4090"
    if on_first and on_first[0].pid == 1:
        assert on_first[0].user == "root" and on_first[0].name  # resolved by the remote ps


def test_na_and_not_supported_fields_read_as_none(tmp_path: Path) -> None:
    k80 = parse_report(run_script(tmp_path, "r470-k80"), FIELDS).gpus
    assert all(g.fan_pct is None for g in k80) and k80[0].ecc_corrected == 0 and k80[0].power_w == 142.31
    gtx = parse_report(run_script(tmp_path, "r390-gtx1080"), FIELDS).gpus[0]
    assert gtx.power_limit_w is None and gtx.ecc_corrected is None and gtx.fan_pct == 27 and gtx.power_w == 8.93
    assert gtx.processes[0].gpu_memory_mib is None
    a100 = parse_report(run_script(tmp_path, "r535-a100x8"), FIELDS).gpus
    assert a100[3].util_pct == 94 and a100[5].temperature_c == 68 and a100[7].pstate == "P0"  # padded cells
    assert sum(len(g.processes) for g in a100) == 7 and a100[6].processes == ()


def test_old_driver_rejects_fields_one_at_a_time(tmp_path: Path) -> None:
    fields = FIELDS
    rejected = []
    for _ in range(len(FIELDS)):
        reading = parse_report(run_script(tmp_path, "r340-quadro", fields), fields)
        if not reading.invalid_fields:
            break
        assert reading.state == HostState.ERROR and "rejects" in (reading.message or "")
        rejected += reading.invalid_fields
        fields = tuple(f for f in fields if f not in reading.invalid_fields)
    assert sorted(rejected) == ["ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total", "power.limit"]
    gpu = reading.gpus[0]
    assert reading.state == HostState.OK and gpu.name == "Quadro K2200" and gpu.mem_util_pct is None and gpu.power_w is None
    assert gpu.processes == ()  # "No running processes found"


def test_zero_gpus_no_driver_and_no_nvidia_smi(tmp_path: Path) -> None:
    zero = parse_report(run_script(tmp_path, "zero"), FIELDS)
    assert zero.state == HostState.OK and zero.gpus == () and zero.message == "no GPU"
    nodriver = parse_report(run_script(tmp_path, "nodriver"), FIELDS)
    assert nodriver.state == HostState.NO_DRIVER and "driver" in (nodriver.message or "")
    missing = parse_report(run_script(tmp_path, None), FIELDS)
    assert missing.state == HostState.NO_NVIDIA_SMI and missing.mem_total_mib


def test_garbage_and_cut_short_answers() -> None:
    assert parse_report("bash: sh: command not found\n", FIELDS).state == HostState.ERROR
    cut = parse_report("@@gputui 1\n@@meminfo\nMemTotal: 1024 kB\n", FIELDS)
    assert cut.state == HostState.ERROR and "cut short" in (cut.message or "") and cut.mem_total_mib == 1.0
    failed = parse_report("@@gputui 1\n@@gpu\nFailed to initialize NVML: Driver/library version mismatch\n@@rc 18\n", FIELDS)
    assert failed.state == HostState.ERROR and "version mismatch" in (failed.message or "") and "exit 18" in (failed.message or "")


def test_script_is_posix_and_quoted_for_any_login_shell() -> None:
    command = remote_command(FIELDS)
    assert command.startswith("sh -c '") and command.endswith("'")
    assert os.path.exists("/bin/sh")
