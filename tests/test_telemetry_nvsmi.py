"""The remote poll script and its parser: each driver generation of tests/data/nvsmi, run
through the real script with `sh` (no SSH), and the odd cases of nvidia-smi's CSV.

The driver generations are hand-written from nvidia-smi's output formats (see
tests/data/nvsmi/README.md); `h100-r580-recorded` is what a real H100 printed, checked here
against nvidia-smi's own CSV and XML answers from the same machine."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from gputui.model.telemetry import GpuProcess, HostState
from gputui.sources.nvsmi import (
    GPU_FIELDS,
    MAX_KNOWN_PIDS,
    PsRow,
    RemoteReading,
    parse_apps,
    parse_gpu_rows,
    parse_ps,
    parse_report,
    parse_ps_full,
    parse_reasons,
    parse_value,
    poll_request,
    remote_command,
    remote_loop_command,
    retry_fields,
    split_row,
)
from tests.sshd_fixture import NVSMI_DATA, logging_ps

FIELDS = tuple(GPU_FIELDS)
# The fields of the poll that was recorded on the H100 (gputui d005117: no throttle reasons yet).
RECORDED_FIELDS = tuple(f for f in GPU_FIELDS if f != "clocks_event_reasons.active")


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


def read(tmp_path: Path, fixture: str | None, fields: tuple[str, ...] = FIELDS) -> tuple[RemoteReading, tuple[str, ...]]:
    """A poll as SshHost makes it: fields the driver rejects are dropped (or renamed) and asked again."""
    for _ in range(len(FIELDS) + 1):
        reading = parse_report(run_script(tmp_path, fixture, fields), fields)
        retry = retry_fields(fields, reading.invalid_fields)
        if retry == fields:
            return reading, fields
        fields = retry
    raise AssertionError("the fields never settled")


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
    reading, _ = read(tmp_path, fixture)
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
    k80 = read(tmp_path, "r470-k80")[0].gpus
    assert all(g.fan_pct is None for g in k80) and k80[0].ecc_corrected == 0 and k80[0].power_w == 142.31
    gtx = read(tmp_path, "r390-gtx1080")[0].gpus[0]
    assert gtx.power_limit_w is None and gtx.ecc_corrected is None and gtx.fan_pct == 27 and gtx.power_w == 8.93
    assert gtx.processes[0].gpu_memory_mib is None and gtx.throttle is None
    a100 = read(tmp_path, "r535-a100x8")[0].gpus
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
        fields = retry_fields(fields, reading.invalid_fields)
    assert sorted(rejected) == ["clocks_event_reasons.active", "clocks_throttle_reasons.active",
                                "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total", "power.limit"]
    gpu = reading.gpus[0]
    assert reading.state == HostState.OK and gpu.name == "Quadro K2200" and gpu.mem_util_pct is None and gpu.power_w is None
    assert gpu.processes == ()  # "No running processes found"


def test_zero_gpus_no_driver_and_no_nvidia_smi(tmp_path: Path) -> None:
    zero = read(tmp_path, "zero")[0]
    assert zero.state == HostState.OK and zero.gpus == () and zero.message == "no GPU"
    nodriver = parse_report(run_script(tmp_path, "nodriver"), FIELDS)
    assert nodriver.state == HostState.NO_DRIVER and "driver" in (nodriver.message or "")
    missing = parse_report(run_script(tmp_path, None), FIELDS)
    assert missing.state == HostState.NO_NVIDIA_SMI and missing.mem_total_mib
    # a CPU-only host still gets two CPU readings, so its CPU % is known from the first poll
    assert missing.cpu_before is not None and missing.cpu_after is not None


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


H100 = NVSMI_DATA / "h100-r580-recorded"
H100_UUID = "GPU-61f4664a-d5ab-ee54-2be5-cad87b574eb8"


def test_a_real_h100_poll_parses_to_what_nvidia_smi_itself_reported() -> None:
    """The poll's output on a real H100 during training, against nvidia-smi -q -x taken then."""
    reading = parse_report((H100 / "ssh-poll-output.txt").read_text(), RECORDED_FIELDS)
    assert reading.state == HostState.OK and reading.message is None and reading.invalid_fields == ()
    assert reading.driver == "580.159.04" and reading.cpu_before is not None and reading.cpu_after is not None
    assert reading.mem_total_mib == 131981020 / 1024  # MemTotal, kB
    (gpu,) = reading.gpus
    xml = ET.parse(H100 / "nvidia-smi-q.xml").getroot()
    assert xml.findtext("driver_version") == reading.driver
    card = xml.find("gpu")
    assert card is not None

    def number(path: str) -> float:
        return float(str(card.findtext(path)).split()[0])

    assert (gpu.index, gpu.name, gpu.uuid) == (0, card.findtext("product_name"), card.findtext("uuid")) == (
        0, "NVIDIA H100 80GB HBM3", H100_UUID)
    assert (gpu.mem_used_mib, gpu.mem_total_mib) == (number("fb_memory_usage/used"), number("fb_memory_usage/total")) == (
        621, 81559)
    assert gpu.temperature_c == number("temperature/gpu_temp") == 35
    assert gpu.power_limit_w == number("gpu_power_readings/current_power_limit") == 700
    assert gpu.power_w == 117.75 and abs(gpu.power_w - number("gpu_power_readings/average_power_draw")) < 1
    assert gpu.fan_pct is None and card.findtext("fan_speed") == "N/A"  # an SXM board has no fan of its own
    assert (gpu.clock_sm_mhz, gpu.clock_mem_mhz) == (number("clocks/sm_clock"), number("clocks/mem_clock")) == (1980, 2619)
    assert gpu.pstate == card.findtext("performance_state") == "P0"
    assert (gpu.util_pct, gpu.mem_util_pct, gpu.ecc_corrected, gpu.ecc_uncorrected) == (0, 0, 0, 0)
    assert gpu.pcie_rx_kib_s is None  # nvidia-smi's query has no PCIe throughput
    xml_proc = card.find("processes/process_info")
    assert xml_proc is not None
    assert gpu.processes == (GpuProcess(int(str(xml_proc.findtext("pid"))), user="root", gpu_memory_mib=number(
        "processes/process_info/used_memory"), name="python3 -m gputui run --device cuda --epochs 40 --json --run-dir runs/RUN_ID"),)
    assert xml_proc.findtext("process_name") == "python3"  # the remote ps gave the whole command line


def test_nvml_counts_the_driver_reserve_as_used_and_nvidia_smi_does_not() -> None:
    """Why `gputui monitor` (NVML) said 1100.8 MiB where the SSH poll says 621 on that H100."""
    nvml = json.loads((H100 / "monitor-once-training.json").read_text())["hosts"][0]["gpus"][0]
    ssh = parse_report((H100 / "ssh-poll-output.txt").read_text(), RECORDED_FIELDS).gpus[0]
    reserved = float(str(ET.parse(H100 / "nvidia-smi-q.xml").getroot().findtext("gpu/fb_memory_usage/reserved")).split()[0])
    assert nvml["uuid"] == ssh.uuid and nvml["mem_total_mib"] == ssh.mem_total_mib
    assert ssh.mem_used_mib is not None and reserved == 480
    assert abs(nvml["mem_used_mib"] - (ssh.mem_used_mib + reserved)) < 1
    assert [p["pid"] for p in nvml["processes"]] == [p.pid for p in ssh.processes] == [425]
    assert nvml["processes"][0]["gpu_memory_mib"] == ssh.processes[0].gpu_memory_mib == 612


def test_nvidia_smis_own_csv_answers_from_the_h100_parse() -> None:
    """With header and units, as `--format=csv` prints them (the poll asks for neither)."""
    header, *rows = (H100 / "nvidia-smi-query-gpu.csv").read_text().splitlines()
    names = [cell.split(" [")[0] for cell in header.split(", ")]  # "power.draw [W]" -> "power.draw"
    aliases = {"clocks.current.sm": "clocks.sm", "clocks.current.memory": "clocks.mem"}
    fields = tuple(aliases.get(n, n) for n in names)
    assert set(fields) <= set(FIELDS)
    (gpu,), driver = parse_gpu_rows("\n".join(rows), fields)
    assert (gpu.name, driver, gpu.pstate) == ("NVIDIA H100 80GB HBM3", "580.159.04", "P0")
    assert (gpu.util_pct, gpu.mem_used_mib, gpu.mem_total_mib, gpu.temperature_c) == (0, 0, 81559, 43)  # idle
    assert (gpu.power_w, gpu.power_limit_w, gpu.fan_pct) == (127.24, 700, None)
    assert (gpu.clock_sm_mhz, gpu.clock_mem_mhz, gpu.ecc_corrected) == (1980, 2619, 0)
    apps = parse_apps((H100 / "nvidia-smi-compute-apps.csv").read_text())
    assert [(uuid, p.pid, p.name, p.gpu_memory_mib) for uuid, p in apps] == [(H100_UUID, 425, "python3", 612)]
    reasons_header, reasons = (H100 / "nvidia-smi-clocks-event-reasons.csv").read_text().splitlines()
    cells = dict(zip(reasons_header.split(", "), split_row(reasons, len(reasons_header.split(", ")))))
    assert cells["clocks_event_reasons.active"] == "0x0000000000000000"  # nothing slows the clocks down
    xml = ET.parse(H100 / "nvidia-smi-q.xml").getroot()
    for field in ("hw_slowdown", "sw_thermal_slowdown", "sw_power_cap", "gpu_idle"):
        assert cells[f"clocks_event_reasons.{field}"] == "Not Active"
        assert xml.findtext(f"gpu/clocks_event_reasons/clocks_event_reason_{field}") == "Not Active"


def test_the_fake_nvidia_smi_replays_the_h100_as_it_answered(tmp_path: Path) -> None:
    """Through the real script with the fake on PATH: the same GPU as the recorded poll (the
    training process is not on this machine, so `ps` cannot name it or its user here)."""
    replayed, asked = read(tmp_path, "h100-r580-recorded")
    assert asked == RECORDED_FIELDS  # the reasons field is not in the recording, under either name
    recorded = parse_report((H100 / "ssh-poll-output.txt").read_text(), RECORDED_FIELDS)
    assert replayed.state == HostState.OK and replayed.driver == recorded.driver
    assert [replace(g, processes=()) for g in replayed.gpus] == [replace(g, processes=()) for g in recorded.gpus]
    assert [(p.pid, p.gpu_memory_mib) for p in replayed.gpus[0].processes] == [(425, 612)]


# -- throttle reasons and the process columns ----------------------------------------------

def test_throttle_reasons_of_each_gpu(tmp_path: Path) -> None:
    reading, asked = read(tmp_path, "r580-h100x8")
    assert asked == FIELDS and reading.state == HostState.OK  # R580 knows every field
    assert [g.throttle for g in reading.gpus] == [(), ("power-cap",), ("sw-thermal", "hw-thermal"), ("sync-boost",), (),
                                                  ("hw-slowdown",), ("idle",), None]
    assert [g.throttled for g in reading.gpus] == [False, True, True, True, False, True, False, False]
    assert reading.driver == "580.159.04"  # the column after the reasons still lands where it belongs


def test_a_driver_before_r535_is_asked_the_older_name_once(tmp_path: Path) -> None:
    reading, asked = read(tmp_path, "r470-k80-reasons")
    assert "clocks_throttle_reasons.active" in asked and "clocks_event_reasons.active" not in asked
    assert [g.throttle for g in reading.gpus] == [("power-cap",), ("idle",)]
    assert retry_fields(asked, ("clocks_throttle_reasons.active",)) == tuple(f for f in asked if f != "clocks_throttle_reasons.active")
    assert retry_fields(("index", "name"), ("index",)) == ("index", "name")  # index is never dropped


def test_reasons_cells() -> None:
    assert parse_reasons("0x0000000000000000") == ()
    assert parse_reasons("0x00000000000000C4") == ("power-cap", "hw-thermal", "hw-power-brake")
    assert parse_reasons(None) is None and parse_reasons("Not Active") is None


def test_remote_processes_have_cpu_rss_and_age(tmp_path: Path) -> None:
    reading, _ = read(tmp_path, "r580-h100x8")
    init = reading.gpus[0].processes[0]
    assert init.pid == 1 and init.user == "root" and init.name  # resolved by the remote ps
    assert init.rss_mib is not None and init.rss_mib > 0 and init.running_s is not None and init.running_s > 0
    assert init.cpu_pct is not None and init.cpu_pct >= 0 and init.sm_pct is None  # no SM % over SSH
    ghost = reading.gpus[1].processes[0]
    assert ghost.pid == 4242501 and (ghost.user, ghost.cpu_pct, ghost.rss_mib) == (None, None, None)


def test_ps_rows_with_and_without_the_extra_columns() -> None:
    rows = parse_ps_full("    1 root      0.0 11960 86400 /sbin/init splash\n 42 a.very.long.user.name 97.5 2048 61 python x y\n bad\n")
    assert rows[1].user == "root" and rows[1].command == "/sbin/init splash" and rows[1].running_s == 86400
    assert rows[42].user == "a.very.long.user.name" and rows[42].cpu_pct == 97.5 and rows[42].rss_mib == 2.0
    text = "@@gputui 1\n@@gpu\n0, GPU-a\n@@rc 0\n@@apps\nGPU-a, 42, p, 10\n@@rc 0\n@@ps2\n@@ps\n   42 ann python -m x\n@@end\n"
    (gpu,) = parse_report(text, ("index", "uuid")).gpus
    assert gpu.processes[0].user == "ann" and gpu.processes[0].cpu_pct is None  # a ps without pcpu/rss/etimes


def test_the_script_falls_back_to_a_plain_ps(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin-old-ps"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(NVSMI_DATA / "fake-nvidia-smi")
    real_ps = subprocess.run(["sh", "-c", "command -v ps"], capture_output=True, text=True).stdout.strip()
    (bin_dir / "ps").write_text(f'#!/bin/sh\ncase "$*" in *etimes*) echo "ps: bad -o argument" >&2; exit 1;; esac\nexec {real_ps} "$@"\n')
    (bin_dir / "ps").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "NVSMI_FIXTURE": str(NVSMI_DATA / "r580-h100x8")}
    out = subprocess.run(["/bin/sh", "-c", remote_command(FIELDS)], capture_output=True, text=True, env=env, timeout=30).stdout
    init = parse_report(out, FIELDS).gpus[0].processes[0]
    assert (init.pid, init.user, init.rss_mib) == (1, "root", None) and init.name


def test_a_request_names_the_pids_whose_ps_row_it_holds() -> None:
    assert poll_request(7, ("index", "uuid")) == b"7 index,uuid\n"
    assert poll_request(7, ("index",), 0.2) == b"7 index 0.200\n"
    assert poll_request(7, ("index",), 0.0, (1, 42)) == b"7 index 0 1,42\n"
    assert poll_request(7, ("index",), 0.2, (1, 42)) == b"7 index 0.200 1,42\n"
    named = poll_request(7, ("index",), 0.0, tuple(range(1, 500))).split()[3]
    assert named.count(b",") == MAX_KNOWN_PIDS - 1  # a bounded line: the others are looked up again


def test_the_poll_loop_runs_ps_only_for_the_pids_it_was_not_told(tmp_path: Path) -> None:
    """The long-lived loop, run locally: `ps` (a wrapper that logs its arguments) runs for the
    pids the request does not name, not at all when it names them all; a known row is used."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(NVSMI_DATA / "fake-nvidia-smi")
    log = tmp_path / "ps.log"
    logging_ps(bin_dir, log)
    pids = [1, *range(4242420, 4242426)]  # r535-a100x8's processes (only pid 1 exists here)
    fields = read(tmp_path, "r535-a100x8")[1]  # without the fields that driver rejects
    query = ",".join(fields)
    everything = ",".join(map(str, pids))
    requests = (f"1 {query}\n2 {query} 0 {everything}\n3 {query} 0 1,4242420\n4 {query} 0 1;touch\n"
                f"{poll_request(5, fields, 0.0, tuple(pids)).decode()}")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "NVSMI_FIXTURE": str(NVSMI_DATA / "r535-a100x8")}
    out = subprocess.run(["/bin/sh", "-c", remote_loop_command()], input=requests, capture_output=True, text=True,
                         env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    answers = [out.stdout.split(f"@@end {t}\n")[0].rsplit("@@end ", 1)[-1] for t in range(1, 6)]
    asked = [line.rsplit("-p ", 1)[-1] for line in log.read_text().splitlines()]
    assert asked == [everything, ",".join(map(str, pids[2:]))]  # request 1 all, 3 the unnamed; 2 and 5 none
    assert "@@bad request" in answers[3] and "\n@@gpu\n" not in answers[3]  # a pid list that is not one: no poll
    first = parse_report(answers[0], fields)
    assert set(first.ps) == {1} and first.gpus[0].processes[0].user == "root"
    known = {1: PsRow("ann", "/opt/train.py", 1.5, 10.0, 99.0)}
    second = parse_report(answers[1], fields, known)
    assert second.ps == {} and second.gpus[0].processes[0].user == "ann" and second.gpus[0].processes[0].running_s == 99.0
    assert parse_report(answers[4], fields, known).gpus[0].processes[0].name == "/opt/train.py"
