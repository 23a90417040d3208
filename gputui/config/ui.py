"""The `[ui]` profile table: the dashboard's behaviour. Declared once, as `UiSettings`."""

from __future__ import annotations

from dataclasses import dataclass

from gputui.config.schema import key, section_of


@dataclass(frozen=True)
class UiSettings:
    """A validated `[ui]` table with its defaults."""

    confirm: bool = key("bool", "u (launch a slave) and d (terminate the selected one) ask first; the cost panel says "
                        "what each will do either way.", False)


UI_SECTION = section_of(UiSettings, "ui", "The dashboard's behaviour.")
