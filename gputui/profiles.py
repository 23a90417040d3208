"""Profiles: kept so that `from gputui.profiles import ...` goes on working.

Every profile table is declared once in gputui.config (`config.run` for `[run]`, ...), and
the registry and loader are gputui.config.profile; this module only re-exports them.
"""

from gputui.config.profile import PROFILE_SECTIONS, Profile, load_profile, parse_profile
from gputui.config.run import DEVICE_RE, RUN_SECTION, STRATEGIES, RunConfig, RunSettings
from gputui.config.ui import UI_SECTION

__all__ = ["DEVICE_RE", "PROFILE_SECTIONS", "Profile", "RUN_SECTION", "RunConfig", "RunSettings", "STRATEGIES",
           "UI_SECTION", "load_profile", "parse_profile"]
