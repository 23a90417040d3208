"""Who a cluster run is: a nonce made when the run first trains, kept in its directory (so a
resumed run keeps it, and a folder deleted and made again gets another).

Slaves keep a run under `runs/<folder name>-<nonce>`: the folder name only helps a person
find it, the nonce tells runs apart, so `--run-dir a/run` and `--run-dir b/run` never share a
slave's checkpoint. Events relayed from rank 0 are rewritten to name the master's run.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.model.errors import UserError
from gputui.runs.store import RunDir

NONCE_FILE = "nonce"
_NONCE = re.compile(r"^[0-9a-f]{16,64}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def resume_ref(run: RunDir) -> str:
    """How `gputui run --resume` names this run: its id under the default location, else its path."""
    from gputui.model.paths import runs_home

    return run.run_id if run.path.parent == runs_home() else str(run.path)


def new_nonce() -> str:
    return secrets.token_hex(8)


def run_nonce(run_path: Path) -> str:
    """The nonce kept in the run directory (`nonce`), made on first use."""
    path = run_path / NONCE_FILE
    try:
        nonce = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        nonce = ""
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if _NONCE.match(nonce):
        return nonce
    nonce = new_nonce()
    try:
        tmp = path.with_name(NONCE_FILE + ".part")
        tmp.write_text(nonce + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return nonce


@dataclass(frozen=True)
class RunIdentity:
    """The master's run: its id and directory, and the nonce that names it everywhere else."""

    run_id: str
    run_dir: str
    nonce: str

    @classmethod
    def of(cls, run: RunDir) -> "RunIdentity":
        return cls(run.run_id, str(run.path), run_nonce(run.path))

    @property
    def slave_name(self) -> str:
        """The run's directory name on a slave: a readable prefix, then the nonce."""
        prefix = _UNSAFE.sub("_", self.run_id)[:40].lstrip(".-") or "run"
        return f"{prefix}-{self.nonce}"

    def rdzv_id(self, attempt: int) -> str:
        return f"{self.nonce}-{attempt}"

    def rewrite(self, event: dict[str, Any]) -> dict[str, Any]:
        """A relayed event as the master's: its run_id and run_dir (a slave's path) are the master's."""
        if "run_dir" in event or "run_id" in event:
            event = {**event, "run_id": self.run_id, "run_dir": self.run_dir, "nonce": self.nonce}
        return event
