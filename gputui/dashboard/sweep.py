"""The dashboard's sweep view, its data: the study's snapshot from the one reader
(gputui.sweep.reader, which `gputui sweep show` uses too, so a trial's state reads the same in
both), and the lines the screen draws from it. No Textual here: the sweep screen
(gputui.ui.sweep_screen) calls `read_sweep` in a thread worker and only draws what it returns.
"""

from __future__ import annotations

from typing import Any

from gputui.sweep.reader import SweepData, TrialRow, read_sweep, sweep_names

__all__ = ["SweepData", "TrialRow", "params_text", "read_sweep", "summary", "sweep_names", "value_text"]


def value_text(value: float | None, metric: str) -> str:
    from gputui.sweep.view import value_text as text

    return text(value, metric)


def params_text(params: tuple[tuple[str, Any], ...]) -> str:
    """The parameters by name: "batch_size=64, lr=0.01"."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params))


def summary(data: SweepData) -> str:
    """The counts line: done of wanted, running, pruned, failed, the best."""
    wanted = f"/{data.trials_wanted}" if data.trials_wanted else ""
    best = value_text(data.best[-1][1] if data.best else None, data.metric)
    if data.best_trial is not None:
        best += f" (trial {data.best_trial})"
    return (f"sweep {data.name} ({data.objective}): {data.done}{wanted} done, {data.count('running')} running, "
            f"{data.count('pruned')} pruned, {data.count('fail')} failed; best {best}")
