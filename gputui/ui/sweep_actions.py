"""Key W: the sweep screen (gputui.ui.sweep_screen). A mixin for the dashboard app; its key is
declared in gputui.ui.bindings. It shows the sweep of the app's profile when the profile has a
`[sweep]` table, else the newest sweep in the study file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import App


class SweepActions(App[Any]):
    def _profile_sweep(self) -> str | None:
        """The [sweep] name of the dashboard's profile, if it has one (never raises)."""
        backend = getattr(self, "backend", None)
        profile = getattr(backend, "profile", None)  # the profile's path
        path = profile if isinstance(profile, Path) else getattr(profile, "path", None)
        if path is None:
            return None
        try:
            from gputui.sweep.space import load_spec

            return load_spec(path)[1].name
        except Exception:  # noqa: BLE001 - no [sweep] there, or a profile with errors: the newest sweep
            return None

    def action_sweep(self) -> None:
        from gputui.ui.sweep_screen import SweepScreen  # with textual-plotext and optuna's reader: on first use

        if isinstance(self.screen, SweepScreen):
            self.pop_screen()
            return
        self.push_screen(SweepScreen(self._profile_sweep()))
