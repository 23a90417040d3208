"""The `[alerts]` profile table: when to raise an alert and where to send it (see gputui.monitor.alerts).

Declared once, as `AlertSettings`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from gputui.config.schema import key, section_of


def _check_command(value: str) -> str | None:
    try:
        return None if shlex.split(value) else "a command line"
    except ValueError:
        return "a command line with balanced quotes"


def _check_url(value: str) -> str | None:
    return None if re.match(r"^https?://[^\s/]+", value) else "an http:// or https:// URL"


@dataclass(frozen=True)
class AlertSettings:
    """A validated `[alerts]` table; None turns an alert off."""

    gpu_temperature_c: float | None = key("float", "Alert when a GPU reaches this temperature (C).", None, minimum=1, maximum=150)
    gpu_memory_pct: float | None = key("float", "Alert when a GPU's memory is this % used or more.", None, minimum=1, maximum=100)
    throttled_s: float | None = key("float", "Alert when a busy GPU is held back (power cap, thermal, hw slowdown, sync boost) this many seconds.",
                                    None, minimum=0, maximum=86400)
    gpu_idle_s: float | None = key("float", "Alert when a GPU running a gputui run's process stays idle this many seconds.", None,
                                   minimum=0, maximum=86400)
    gpu_idle_pct: float = key("float", "Below this utilisation (%) a GPU counts as idle.", 5.0, minimum=0, maximum=100)
    unreachable_s: float | None = key("float", "Alert when a host does not answer for this many seconds.", None, minimum=0, maximum=86400)
    stalled_s: float | None = key("float", "Alert when the watched run (--run) has no step event for this many seconds.", None,
                                  minimum=1, maximum=86400)
    nan_loss: bool = key("bool", "Alert when the watched run's loss is NaN or infinite.", False)
    budget_pct: float | None = key("float", "Alert when the [cloud] cluster's spend reaches this % of budget_usd.", None,
                                   minimum=1, maximum=1000)
    repeat_s: float | None = key("float", "Repeat an alert that lasts every this many seconds (default: never).", None,
                                 minimum=1, maximum=7 * 86400)
    command: str | None = key("str", "Command run for every alert, its JSON on stdin (split like a shell line; no shell).", None,
                              check=_check_command)
    webhook: str | None = key("str", "URL every alert's JSON is POSTed to.", None, check=_check_url)
    timeout_s: float = key("float", "Seconds allowed to the command and to the webhook.", 10.0, minimum=0.1, maximum=300)

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "AlertSettings":
        """From a table `ALERTS_SECTION.validate` accepted."""
        return cls(**dict(table))


ALERTS_SECTION = section_of(AlertSettings, "alerts",
                            "When to raise an alert and where to send it; a threshold that is absent is off.")
