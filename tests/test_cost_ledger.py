"""The cost ledger (SQLite, WAL, versioned), local energy lines, and `gputui cost`."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gputui.cli import main
from gputui.cloud.costs import report
from gputui.cloud.energy import EnergyMeter
from gputui.cloud.ledger import SCHEMA_VERSION, Ledger, default_path
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import CloudEvent, InstanceInfo, energy_kwh

HOUR = 3600.0


def info(n: int, launched: float, lifecycle: str = "spot") -> InstanceInfo:
    return InstanceInfo(f"i-{n:017x}", "g4dn.xlarge", "us-east-1a", "running", lifecycle, launched)


def test_ledger_is_wal_and_versioned_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger(path) as ledger:
        assert ledger.schema_version() == SCHEMA_VERSION
        ledger.record_launch(info(1, 100.0), "ec2", "us-east-1", "c", "me", 0.3)
        ledger.set_price(info(1, 0).instance_id, 200.0, 0.3)  # unchanged: no new line
        ledger.set_price(info(1, 0).instance_id, 300.0, 0.45)
        ledger.add_events([CloudEvent(100.0, "launched", "i-1 up", info(1, 0).instance_id, "c")])
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()
    with Ledger(path) as again:
        (rec,) = again.instances()
        assert [(p.since, p.usd_per_hour) for p in rec.prices] == [(100.0, 0.3), (300.0, 0.45)]
        assert rec.hourly_price == 0.45 and rec.running
        assert again.record_end(rec.instance_id, 400.0, "terminated", "user")
        assert not again.record_end(rec.instance_id, 500.0, "terminated", "user")  # ends once
        assert again.get(rec.instance_id).terminated == 400.0  # type: ignore[union-attr]
        assert [e.kind for e in again.events()] == ["launched"]


def test_a_newer_schema_is_refused_and_a_damaged_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    Ledger(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.commit()
    raw.close()
    with pytest.raises(UserError, match="newer than this gputui"):
        Ledger(path)
    bad = tmp_path / "bad.sqlite3"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(GputuiError, match="cannot be opened"):
        Ledger(bad)


WRITER = """
import sys
from pathlib import Path
from gputui.cloud.ledger import Ledger
from gputui.model.cloud import InstanceInfo
ledger = Ledger(Path(sys.argv[1]))
n = 0
while True:
    i = InstanceInfo(f"i-{n:017x}", "g4dn.xlarge", "z", "running", "spot", float(n))
    ledger.record_launch(i, "sim", "r", "c", "o", 0.30)
    ledger.set_price(i.instance_id, n + 0.5, 0.40)
    ledger.record_end(i.instance_id, n + 0.9, "terminated", "user")
    n += 1
"""


def test_ledger_survives_a_kill_mid_write(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                with sqlite3.connect(path, timeout=5) as peek:
                    if peek.execute("SELECT COUNT(*) FROM instances").fetchone()[0] >= 150:
                        break
            except sqlite3.OperationalError:
                continue
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert path.with_name(path.name + "-wal").exists()  # killed with its write-ahead log in use
    with Ledger(path) as ledger:
        assert ledger._read("PRAGMA integrity_check") == [("ok",)]
        records = ledger.instances()
        assert len(records) >= 150
        lines = ledger._read("SELECT subject, COUNT(*), SUM(\"end\" IS NULL) FROM cost_lines GROUP BY subject")
    per_instance = {subject: (count, open_) for subject, count, open_ in lines}
    for rec in records:  # every transaction is whole: an instance always has its price line(s)
        count, open_ = per_instance[rec.instance_id]
        assert count == len(rec.prices) and 1 <= count <= 2
        assert rec.hourly_price == rec.prices[-1].usd_per_hour
        assert (open_ == 0) == (rec.terminated is not None)
    # And it is writable again.
    with Ledger(path) as ledger:
        ledger.record_launch(info(10**6, 0.0), "sim", "r", "c", "o", 0.3)


def test_concurrent_writers_share_one_ledger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    errors: list[BaseException] = []

    def write(base: int) -> None:
        try:
            for n in range(base, base + 40):
                ledger.record_launch(info(n, float(n)), "sim", "r", "c", "o", 0.3)
                ledger.instances(running=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(ledger.instances()) == 160
    ledger.close()


def test_energy_meter_writes_lines_without_losing_or_doubling_time(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    meter = EnergyMeter(ledger, kwh_price=0.30, run_id="r1")
    samples = [(1000.0 + 5 * k, 250.0 + (k % 7) * 10) for k in range(200)]
    for when, watts in samples[:120]:
        meter.add("local/gpu0", when, watts)
    first = meter.flush()
    for when, watts in samples[120:]:
        meter.add("local/gpu0", when, watts)
    second = meter.flush()
    assert first + second == pytest.approx(energy_kwh(samples))
    lines = ledger.energy()
    assert [(l[0], l[2]) for l in lines] == [("local/gpu0", "r1")] * 2
    assert lines[0][4] == lines[1][3]  # the second line starts where the first ended
    assert sum(l[5] * l[6] for l in lines) == pytest.approx(energy_kwh(samples) * 0.30)

    ledger.close()


def test_energy_meter_takes_telemetry_snapshots_of_local_gpus(tmp_path: Path) -> None:
    from gputui.model.telemetry import GpuSample, HostSnapshot, HostState

    ledger = Ledger(tmp_path / "l.sqlite3")
    meter = EnergyMeter(ledger, kwh_price=0.25)
    for k in range(121):  # one hour, every 30 s: GPU 0 draws 200 W, GPU 1 reports no power (not available)
        gpus = (GpuSample(0, power_w=200.0), GpuSample(1, power_w=None))
        meter.add_snapshot(HostSnapshot("ws", HostState("ok"), 5000.0 + 30 * k, kind="local", gpus=gpus))
        meter.add_snapshot(HostSnapshot("far", HostState("ok"), 5000.0 + 30 * k, kind="ssh", gpus=gpus))
    assert meter.flush() == pytest.approx(0.2)
    lines = {line[0]: line for line in ledger.energy()}
    assert set(lines) == {"ws/gpu0", "ws/gpu1"}  # remote hosts' electricity is not ours to price
    assert lines["ws/gpu0"][5] == pytest.approx(0.2) and lines["ws/gpu1"][5] == 0.0  # missing is not guessed
    ledger.close()


def build_history(ledger: Ledger, now: float) -> None:
    ledger.record_launch(info(1, now - 2 * HOUR), "ec2", "us-east-1", "alpha", "me", 0.50)
    ledger.record_end(info(1, 0).instance_id, now - HOUR, "terminated", "user")
    ledger.record_launch(info(2, now - HOUR), "ec2", "us-east-1", "alpha", "me", 0.40)
    ledger.set_price(info(2, 0).instance_id, now - HOUR / 2, 0.80)
    ledger.start_run("r-alpha", "alpha", now - 2 * HOUR)
    ledger.end_run("r-alpha", now - 1.5 * HOUR, "done")
    ledger.start_run("r-local", "local", now - HOUR)
    ledger.add_energy("ws/gpu0", "local", "r-local", now - HOUR, now, 0.25, 0.40)


def test_cost_report_per_cluster_and_per_run(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    ledger = Ledger(tmp_path / "l.sqlite3")
    build_history(ledger, now)
    clusters, runs = report(ledger, now)
    by_name = {c.name: c for c in clusters}
    assert by_name["alpha"].usd == pytest.approx(0.50 + 0.20 + 0.40)
    assert by_name["alpha"].running == 1 and by_name["alpha"].end is None
    assert by_name["alpha"].duration(now) == pytest.approx(2 * HOUR)
    assert by_name["local"].usd == pytest.approx(0.10) and by_name["local"].energy_kwh == pytest.approx(0.25)
    runs_by = {r.name: r for r in runs}
    assert runs_by["r-alpha"].usd == pytest.approx(0.25)  # half an hour of the first instance
    assert runs_by["r-local"].usd == pytest.approx(0.10) and runs_by["r-local"].usd_per_hour(now) == pytest.approx(0.10)
    # The last 45 minutes only.
    clusters, runs = report(ledger, now, since=now - 0.75 * HOUR)
    by_name = {c.name: c for c in clusters}
    assert by_name["alpha"].usd == pytest.approx(0.40 * 0.25 + 0.40)
    assert by_name["local"].usd == pytest.approx(0.075)
    assert [r.name for r in runs] == ["r-local"]
    ledger.close()


def test_cost_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost"]) == 0
    assert "no costs recorded yet" in capsys.readouterr().err
    assert not default_path().exists()  # reporting does not create a ledger
    now = time.time()
    with Ledger() as ledger:
        build_history(ledger, now)
    assert main(["cost", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["estimate"] is True and data["total_usd"] == pytest.approx(1.20, abs=1e-3)
    alpha = next(c for c in data["clusters"] if c["cluster"] == "alpha")
    assert set(alpha) >= {"duration_s", "usd_per_hour", "total_usd", "running", "estimate"}
    assert [r["name"] for r in data["runs"]] == ["r-alpha", "r-local"]
    assert main(["cost", "--since", "0.02"]) == 0  # ~29 minutes
    out = capsys.readouterr().out
    assert "alpha" in out and "local" in out and "est." in out and "r-alpha" not in out
    assert main(["cost", "--since", "0"]) == 2
    assert "expected a number of days > 0" in capsys.readouterr().err


def test_cost_command_with_only_local_runs_that_cost_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU-only machine: runs are recorded, no instance and no energy. No empty cluster table."""
    with Ledger() as ledger:
        ledger.start_run("r-cpu", "local", time.time() - 60)
    assert main(["cost"]) == 0
    captured = capsys.readouterr()
    assert "Spend per run" in captured.out and "r-cpu" in captured.out
    assert "Spend per cluster" not in captured.out
    assert "total $0.00" in captured.err


def test_a_write_that_sqlite_already_rolled_back_says_its_own_error(tmp_path: Path) -> None:
    """An error after which SQLite ended the transaction itself: the caller sees that error, not
    "cannot rollback - no transaction is active" (seen once in a stopped run's warning)."""
    import sqlite3

    from gputui.cloud.ledger import Ledger

    with Ledger(tmp_path / "ledger.db") as ledger:
        with pytest.raises(sqlite3.OperationalError, match="the original error"):
            with ledger._write() as db:
                db.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL or an I/O error
                raise sqlite3.OperationalError("the original error")
        ledger.start_run("r1", "local", 1.0)  # and the ledger works on
        assert "r1" in ledger.segments()
