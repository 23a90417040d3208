"""Small tables of the cluster package, kept in the cost ledger's SQLite file.

`slave_activity`: when each cloud slave was last busy (a run on it, or its GPUs above
the idle threshold), for the idle stop. `bench_results`: every row `gputui bench` measured.
The ledger's own schema (and its version) is left alone: these tables are created with
IF NOT EXISTS next to it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable

from gputui.model.errors import GputuiError

SCHEMA = """
CREATE TABLE IF NOT EXISTS slave_activity (
    instance_id TEXT PRIMARY KEY, cluster TEXT NOT NULL, last_busy REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bench_results (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, label TEXT NOT NULL, model TEXT NOT NULL, device TEXT NOT NULL,
    strategy TEXT NOT NULL, workers INTEGER NOT NULL, samples_per_s REAL, s_per_epoch REAL, speedup REAL,
    efficiency REAL, status TEXT NOT NULL, detail TEXT NOT NULL
);
"""


class ClusterStore:
    """The cluster tables in the ledger file at `path` (default: the ledger's)."""

    def __init__(self, path: Path | None = None) -> None:
        from gputui.cloud.ledger import connect, default_path

        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.Lock()
        try:
            self._db = connect(self.path)
            self._db.executescript(SCHEMA)
        except (sqlite3.DatabaseError, OSError) as exc:
            raise GputuiError(f"ledger {self.path} cannot be opened: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "ClusterStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)))

    # idle clock ----------------------------------------------------------------------
    def mark_busy(self, instance_id: str, cluster: str, when: float) -> None:
        self._run("INSERT INTO slave_activity (instance_id, cluster, last_busy) VALUES (?,?,?) "
                  "ON CONFLICT(instance_id) DO UPDATE SET last_busy = MAX(last_busy, excluded.last_busy)",
                  (instance_id, cluster, when))

    def last_busy(self, instance_id: str) -> float | None:
        rows = self._run("SELECT last_busy FROM slave_activity WHERE instance_id = ?", (instance_id,))
        return float(rows[0][0]) if rows else None

    def forget(self, instance_id: str) -> None:
        self._run("DELETE FROM slave_activity WHERE instance_id = ?", (instance_id,))

    # bench results -------------------------------------------------------------------
    def add_bench(self, when: float, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._run("INSERT INTO bench_results (time, label, model, device, strategy, workers, samples_per_s, "
                      "s_per_epoch, speedup, efficiency, status, detail) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                      (when, row["label"], row["model"], row["device"], row["strategy"], row["workers"],
                       row.get("samples_per_s"), row.get("s_per_epoch"), row.get("speedup"), row.get("efficiency"),
                       row["status"], json.dumps(row.get("detail", ""))))

    def bench_history(self) -> list[dict[str, Any]]:
        cols = ("time", "label", "model", "device", "strategy", "workers", "samples_per_s", "s_per_epoch",
                "speedup", "efficiency", "status", "detail")
        rows = self._run(f"SELECT {', '.join(cols)} FROM bench_results ORDER BY time, id")
        return [dict(zip(cols, r[:-1] + (json.loads(r[-1]),))) for r in rows]
