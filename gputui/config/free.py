"""The `[free]` profile table: when a GPU counts as free (gputui.monitor.lab). Declared once,
as `FreeRule`; `gputui monitor --free`, the lab view's counts and `--device auto` all use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gputui.config.schema import key, section_of


@dataclass(frozen=True)
class FreeRule:
    """A GPU is free when no compute process runs on it, its utilisation is at most
    `max_util_pct` and its memory in use at most `max_memory_mib`. A figure the driver does not
    give (n/a) is not held against it, but a GPU with neither figure is never free."""

    max_util_pct: float = key("float", "A free GPU's utilisation is at most this (%).", 10.0, minimum=0, maximum=100)
    max_memory_mib: float = key("float", "A free GPU has at most this much memory in use (MiB): what the driver and "
                                "a desktop take, not a job.", 1024.0, minimum=0, maximum=1 << 30)
    allow_processes: bool = key("bool", "Count a GPU as free even while a compute process runs on it (only the "
                                "figures decide).", False)

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "FreeRule":
        """From a table `FREE_SECTION.validate` accepted."""
        return cls(**dict(table))

    def describe(self) -> str:
        """The rule in one line, as the commands say it."""
        procs = "" if self.allow_processes else "no compute process, "
        return f"{procs}utilisation <= {self.max_util_pct:g}%, memory in use <= {self.max_memory_mib:g} MiB"


FREE_SECTION = section_of(FreeRule, "free", "When a GPU counts as free: `gputui monitor --free`, the lab view and "
                          "--device auto.")
