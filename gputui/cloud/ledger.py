"""The cost ledger: a SQLite database in the user data directory (WAL, versioned schema).

It holds the instances gputui launched (and orphans it swept), their price lines, runs,
local GPU energy lines and cloud events. Every price line names where its rate came from
(`price_source`: "api 2026-11-25", "table 2024-06-01", "profile", "max_price", ...; NULL in
lines written before schema 2); every energy line how it was measured (`method`: "counter",
the GPU's energy counter, or "trapezoid", power samples integrated; NULL before schema 3).
A run's time is the sum of its segments (one per start or resume, schema 4), not the span
from its first start to its last end, nor from its last start (what `runs.started` held).
Every write is one transaction, so a process killed
mid-write leaves the previous state intact. Safe to share between threads.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from gputui.cloud.pricing import SourcedPrice
from gputui.cloud.redact import redact
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import CloudEvent, InstanceInfo, InstanceRecord, PricePoint
from gputui.model.paths import data_home, private_db

SCHEMA_VERSION = 4
SCHEMA = """
CREATE TABLE instances (
    id TEXT PRIMARY KEY, provider TEXT NOT NULL, region TEXT NOT NULL, cluster TEXT NOT NULL, owner TEXT,
    type TEXT NOT NULL, zone TEXT NOT NULL, lifecycle TEXT NOT NULL, hourly_price REAL NOT NULL,
    launched REAL NOT NULL, terminated REAL, state TEXT NOT NULL, ended_by TEXT, address TEXT, price_source TEXT
);
CREATE TABLE cost_lines (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('instance', 'energy')),
    subject TEXT NOT NULL, cluster TEXT NOT NULL, run_id TEXT,
    start REAL NOT NULL, "end" REAL, rate REAL NOT NULL, quantity REAL, price_source TEXT, method TEXT
);
CREATE INDEX cost_lines_subject ON cost_lines (subject, start);
CREATE TABLE runs (id TEXT PRIMARY KEY, cluster TEXT NOT NULL, started REAL NOT NULL, ended REAL, status TEXT);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, started REAL NOT NULL, ended REAL, status TEXT
);
CREATE INDEX IF NOT EXISTS segments_run ON segments (run_id, started);
CREATE TABLE events (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, kind TEXT NOT NULL, instance_id TEXT, cluster TEXT, message TEXT NOT NULL
);
"""
# Schema changes: {version they upgrade from: columns to add as (table, column, declaration)};
# applied in order on open. Each column is added only where it is missing, so a database
# that already has it (a fresh one, or one a crashed upgrade left half done) is left alone.
MIGRATIONS: dict[int, tuple[tuple[str, str, str], ...]] = {
    1: (("instances", "price_source", "TEXT"), ("cost_lines", "price_source", "TEXT")),
    2: (("cost_lines", "method", "TEXT"),),
    3: (),  # the segments table: see SEGMENTS_MIGRATION
}
# Schema 4: a run's segments. Before it, a run's row held its last segment alone (a resume
# overwrote `started`): that segment is all there is to keep, so it becomes the run's one segment.
SEGMENTS_MIGRATION = (
    "CREATE TABLE IF NOT EXISTS segments (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, started REAL NOT NULL, "
    "ended REAL, status TEXT)",
    "CREATE INDEX IF NOT EXISTS segments_run ON segments (run_id, started)",
    "INSERT INTO segments (run_id, started, ended, status) SELECT id, started, ended, status FROM runs "
    "WHERE id NOT IN (SELECT run_id FROM segments)",
)
INSTANCE_COLUMNS = ("id, provider, region, cluster, owner, type, zone, lifecycle, hourly_price, launched, "
                    "terminated, state, ended_by, address")


def _sourced(rate: float, source: str | None) -> float:
    """The rate as a SourcedPrice when its source is on record (a float either way)."""
    return float(rate) if source is None else SourcedPrice(rate, source)


def _source_of(rate: float, source: str | None) -> str | None:
    return source if source is not None else getattr(rate, "source", None)


def _record(row: Sequence[Any], prices: tuple[PricePoint, ...]) -> InstanceRecord:
    (instance_id, provider, region, cluster, owner, instance_type, zone, lifecycle, hourly_price, launched,
     terminated, state, ended_by, address, price_source) = row
    return InstanceRecord(instance_id, provider, region, cluster, owner, instance_type, zone, lifecycle,
                          _sourced(hourly_price, price_source), launched, terminated, state, ended_by, address, prices)


def default_path() -> Path:
    return data_home() / "ledger.sqlite3"


def connect(path: Path) -> sqlite3.Connection:
    """An autocommit, thread-shareable connection to the SQLite file at `path`, in WAL mode.
    The file is this account's alone (0600, an older open one tightened), and so are its -wal
    and -shm files, which SQLite makes with the database's mode."""
    private_db(path)
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    return db


LOCAL_CLUSTER = "local"  # the cluster a run on this machine alone is recorded under (gputui.jobs.run)


class Ledger:
    """The cost ledger at `path` (default: ledger.sqlite3 in the user data directory)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.RLock()
        try:
            self._db = connect(self.path)
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable across process kills in WAL mode
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise GputuiError(f"cost ledger {self.path} cannot be opened: {exc}") from None
        except OSError as exc:
            raise GputuiError(f"cost ledger {self.path}: {exc.strerror or exc}") from None

    @classmethod
    def existing(cls, path: Path | None = None) -> "Ledger | None":
        """The ledger if its file exists, without creating one."""
        path = Path(path) if path is not None else default_path()
        return cls(path) if path.is_file() else None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # SQLite may have rolled it back itself (an I/O error, a full disk):
                    self._db.execute("ROLLBACK")  # a second ROLLBACK would hide the first error under its own
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args))

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(f"cost ledger {self.path} has schema {version}, newer than this gputui ({SCHEMA_VERSION}); upgrade gputui")
        with self._write() as db:
            if version == 0:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            for step in range(max(version, 1), SCHEMA_VERSION):
                for table, column, declaration in MIGRATIONS[step]:
                    if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                if step == 3:
                    for statement in SEGMENTS_MIGRATION:
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def schema_version(self) -> int:
        return int(self._read("PRAGMA user_version")[0][0])

    # instances -----------------------------------------------------------------------
    def record_launch(self, info: InstanceInfo, provider: str, region: str, cluster: str, owner: str | None,
                      rate: float, ended_by: str | None = None, terminated: float | None = None,
                      price_source: str | None = None) -> None:
        """Remember a launched (or adopted) instance and open its first price line.

        `price_source` says where the rate came from (default: a SourcedPrice's own source).
        """
        source = _source_of(rate, price_source)
        with self._write() as db:
            db.execute(f"INSERT OR IGNORE INTO instances ({INSTANCE_COLUMNS}, price_source) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (info.instance_id, provider, region, cluster, owner, info.instance_type, info.zone,
                        info.lifecycle, float(rate), info.launched, terminated, info.state, ended_by, info.public_ip,
                        source))
            db.execute("INSERT INTO cost_lines (kind, subject, cluster, start, \"end\", rate, price_source) "
                       "VALUES ('instance',?,?,?,?,?,?)",
                       (info.instance_id, cluster, info.launched, terminated, float(rate), source))

    def update_instance(self, instance_id: str, state: str, address: str | None) -> None:
        with self._write() as db:
            db.execute("UPDATE instances SET state = ?, address = COALESCE(?, address) WHERE id = ?",
                       (state, address, instance_id))

    def record_end(self, instance_id: str, when: float, state: str, ended_by: str) -> bool:
        """Close an instance's record and price line; False if it was already closed."""
        with self._write() as db:
            changed = db.execute("UPDATE instances SET terminated = ?, state = ?, ended_by = ? "
                                 "WHERE id = ? AND terminated IS NULL", (when, state, ended_by, instance_id)).rowcount
            db.execute("UPDATE cost_lines SET \"end\" = ? WHERE kind = 'instance' AND subject = ? AND \"end\" IS NULL",
                       (when, instance_id))
        return bool(changed)

    def set_price(self, instance_id: str, when: float, rate: float, price_source: str | None = None) -> bool:
        """A new price from `when` on; False (and nothing written) if the rate is unchanged.

        `price_source` says where the rate came from (default: a SourcedPrice's own source).
        """
        source = _source_of(rate, price_source)
        with self._write() as db:
            row = db.execute("SELECT hourly_price, cluster FROM instances WHERE id = ? AND terminated IS NULL",
                             (instance_id,)).fetchone()
            if row is None or abs(row[0] - rate) < 1e-12:
                return False
            db.execute("UPDATE cost_lines SET \"end\" = ? WHERE kind = 'instance' AND subject = ? AND \"end\" IS NULL",
                       (when, instance_id))
            db.execute("INSERT INTO cost_lines (kind, subject, cluster, start, rate, price_source) "
                       "VALUES ('instance',?,?,?,?,?)", (instance_id, row[1], when, float(rate), source))
            db.execute("UPDATE instances SET hourly_price = ?, price_source = ? WHERE id = ?",
                       (float(rate), source, instance_id))
        return True

    def instances(self, provider: str | None = None, region: str | None = None, cluster: str | None = None,
                  running: bool | None = None, since: float | None = None) -> list[InstanceRecord]:
        """Instances matching every given filter (`since`: still up then, or launched after)."""
        where: list[str] = ["1=1"]
        args: list[Any] = []
        for column, value in (("provider", provider), ("region", region), ("cluster", cluster)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if running is not None:
            where.append("terminated IS NULL" if running else "terminated IS NOT NULL")
        if since is not None:
            where.append("(terminated IS NULL OR terminated >= ?)")
            args.append(since)
        rows = self._read(f"SELECT {INSTANCE_COLUMNS}, price_source FROM instances WHERE {' AND '.join(where)} "
                          "ORDER BY launched, id", args)
        lines: dict[str, list[PricePoint]] = {}
        for subject, start, rate, source in self._read("SELECT subject, start, rate, price_source FROM cost_lines "
                                                       "WHERE kind = 'instance' ORDER BY start, id"):
            lines.setdefault(subject, []).append(PricePoint(start, _sourced(rate, source)))
        return [_record(row, tuple(lines.get(row[0], ()))) for row in rows]

    def self_stops(self, since: float | None = None) -> list[InstanceRecord]:
        """Instances that powered themselves off (their watchdog: ended_by "self:lease", "self:budget",
        "self:idle" or "self:max_hours"), ended at `since` or later."""
        return [r for r in self.instances(running=False, since=since) if (r.ended_by or "").startswith("self:")]

    def get(self, instance_id: str) -> InstanceRecord | None:
        found = [r for r in self.instances() if r.instance_id == instance_id]
        return found[0] if found else None

    def price_sources(self, since: float | None = None) -> dict[str, list[str]]:
        """{cluster: the sources of its instance price lines in force at `since` or later}, each
        once, in order ("not recorded" for lines older than schema 2)."""
        cutoff = since if since is not None else float("-inf")
        out: dict[str, list[str]] = {}
        for cluster, source in self._read(
                "SELECT c.cluster, c.price_source FROM cost_lines c JOIN instances i ON i.id = c.subject "
                "WHERE c.kind = 'instance' AND (c.\"end\" IS NULL OR c.\"end\" >= ?) ORDER BY c.start, c.id", (cutoff,)):
            label = source if source is not None else "not recorded"
            if label not in out.setdefault(cluster, []):
                out[cluster].append(label)
        return out

    # runs and energy ---------------------------------------------------------------
    def runs_going_on(self, instance_id: str) -> list[str]:
        """The runs not ended on the cluster of this instance: a cluster run's slaves are launched
        into its cluster, so these are the runs the instance may be training (none for a run on
        this machine alone: LOCAL_CLUSTER is not a cloud cluster's)."""
        record = self.get(instance_id)
        if record is None or record.cluster == LOCAL_CLUSTER:
            return []
        return [str(run_id) for (run_id,) in self._read("SELECT id FROM runs WHERE cluster = ? AND ended IS NULL "
                                                         "ORDER BY started", (record.cluster,))]

    def start_run(self, run_id: str, cluster: str, started: float) -> None:
        """A run starts, or resumes: a new segment. The run keeps its first start; a segment a
        killed process left open ends where this one starts (its real end is not known)."""
        with self._write() as db:
            db.execute("INSERT INTO runs (id, cluster, started, status) VALUES (?,?,?, 'running') ON CONFLICT (id) "
                       "DO UPDATE SET cluster = excluded.cluster, ended = NULL, status = 'running'",
                       (run_id, cluster, started))
            db.execute("UPDATE segments SET ended = MAX(started, ?), status = 'lost' WHERE run_id = ? AND ended IS NULL",
                       (started, run_id))
            db.execute("INSERT INTO segments (run_id, started, status) VALUES (?,?, 'running')", (run_id, started))

    def end_run(self, run_id: str, ended: float, status: str) -> None:
        """The run's open segment ends (done, interrupted, failed, ...)."""
        with self._write() as db:
            db.execute("UPDATE runs SET ended = ?, status = ? WHERE id = ?", (ended, status, run_id))
            db.execute("UPDATE segments SET ended = ?, status = ? WHERE run_id = ? AND ended IS NULL",
                       (ended, status, run_id))

    def forget_run(self, run_id: str) -> None:
        """Remove a run that never started (it failed a check first) with its segments."""
        with self._write() as db:
            db.execute("DELETE FROM segments WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def segments(self, since: float | None = None) -> dict[str, list[tuple[float, float | None]]]:
        """{run id: its (started, ended) segments in order (ended None: still going)}, of the
        segments going at `since` or later."""
        cutoff = since if since is not None else float("-inf")
        out: dict[str, list[tuple[float, float | None]]] = {}
        for run_id, started, ended in self._read("SELECT run_id, started, ended FROM segments "
                                                 "WHERE ended IS NULL OR ended >= ? ORDER BY started, id", (cutoff,)):
            out.setdefault(run_id, []).append((started, ended))
        return out

    def runs(self, since: float | None = None) -> list[tuple[str, str, float, float | None, str]]:
        """(run id, cluster, started, ended, status) of runs still going at `since` or later."""
        cutoff = since if since is not None else float("-inf")
        return [tuple(r) for r in self._read("SELECT id, cluster, started, ended, status FROM runs "
                                             "WHERE ended IS NULL OR ended >= ? ORDER BY started", (cutoff,))]

    def add_energy(self, subject: str, cluster: str, run_id: str | None, start: float, end: float,
                   kwh: float, usd_per_kwh: float, method: str | None = None) -> None:
        """An energy line; `method` says how it was measured ("counter" or "trapezoid")."""
        with self._write() as db:
            db.execute("INSERT INTO cost_lines (kind, subject, cluster, run_id, start, \"end\", rate, quantity, method) "
                       "VALUES ('energy',?,?,?,?,?,?,?,?)", (subject, cluster, run_id, start, end, usd_per_kwh, kwh, method))

    def energy_methods(self, since: float | None = None) -> dict[str, list[str]]:
        """{cluster: how its energy lines ending at `since` or later were measured}, each once, in
        order ("not recorded" for lines older than schema 3)."""
        cutoff = since if since is not None else float("-inf")
        out: dict[str, list[str]] = {}
        for cluster, method in self._read("SELECT cluster, method FROM cost_lines WHERE kind = 'energy' AND \"end\" >= ? "
                                          "ORDER BY start, id", (cutoff,)):
            label = method if method is not None else "not recorded"
            if label not in out.setdefault(cluster, []):
                out[cluster].append(label)
        return out

    def energy(self, since: float | None = None) -> list[tuple[str, str, str | None, float, float, float, float]]:
        """(subject, cluster, run id, start, end, kWh, $/kWh) of energy lines ending at `since` or later."""
        cutoff = since if since is not None else float("-inf")
        return [tuple(r) for r in self._read(
            "SELECT subject, cluster, run_id, start, \"end\", quantity, rate FROM cost_lines "
            "WHERE kind = 'energy' AND \"end\" >= ? ORDER BY start", (cutoff,))]

    # events ------------------------------------------------------------------------
    def add_events(self, events: Sequence[CloudEvent]) -> None:
        if not events:
            return
        with self._write() as db:
            db.executemany("INSERT INTO events (time, kind, instance_id, cluster, message) VALUES (?,?,?,?,?)",
                           [(e.time, e.kind, e.instance_id, e.cluster, redact(e.message)) for e in events])

    def events(self, since: float | None = None, kinds: Sequence[str] = ()) -> list[CloudEvent]:
        rows = self._read("SELECT time, kind, message, instance_id, cluster FROM events WHERE time >= ? ORDER BY time, id",
                          (since if since is not None else float("-inf"),))
        return [CloudEvent(*row) for row in rows if not kinds or row[1] in kinds]
