"""Keys x, [, ], l, e and m: the curves panel's x axis, smoothing, log scale, CSV export, and
which of a program's metrics it plots.

A mixin for the dashboard app (its keys are declared in gputui.ui.bindings); each action
finds the curves panel on the main screen and asks it, so the panel owns its settings.
"""

from __future__ import annotations

from typing import Any

from textual.app import App

from gputui.runs.curves import X_LABELS
from gputui.ui.curves_panel import CurvesPanel


class CurveActions(App[Any]):
    def _curves_panel(self) -> CurvesPanel | None:
        found = self.screen_stack[0].query(CurvesPanel) if self.screen_stack else None
        return found.first() if found else None

    def action_curves_axis(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            self.notify(f"curves against {X_LABELS[panel.cycle_axis()]}", timeout=2)

    def action_curves_smoother(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            self.notify(f"smoothing {panel.smoothing(1):.2f}", timeout=2)

    def action_curves_rougher(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            self.notify(f"smoothing {panel.smoothing(-1):.2f}", timeout=2)

    def action_curves_log(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            self.notify("loss on a log scale" if panel.toggle_log() else "loss on a linear scale", timeout=2)

    def action_curves_metric(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            name = panel.cycle_metric()
            self.notify(f"curves: {name}" if name else "no metric reported yet", timeout=2, markup=False)

    def action_curves_export(self) -> None:
        panel = self._curves_panel()
        if panel is not None:
            panel.export()
