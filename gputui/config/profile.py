"""The registry: every table a profile may hold, and the profile loader.

A profile is a TOML file (profiles/ ships several) with a `[run]` table and, for what it sets
up, `[[hosts]]`, `[cloud]`, `[cluster]`, `[alerts]`, `[sweep]`, `[ui]` and `[free]`. Every key is
optional unless its table says otherwise: a missing `[run]` key takes the model's own default
(gputui.config.recipes) or the documented default. Unknown tables and keys, wrong types and
impossible values are errors naming the file, the line, the key and what is expected (exit 2).

Each table is declared in its own module of this package, which never imports this one back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gputui.config.alerts import ALERTS_SECTION, AlertSettings
from gputui.config.cloud import CLOUD_SECTION, CloudSettings
from gputui.config.cluster import CLUSTER_SECTION, ClusterSettings
from gputui.config.free import FREE_SECTION, FreeRule
from gputui.config.hosts import HOSTS_SECTION, HostSpec
from gputui.config.run import RUN_SECTION, RunConfig, RunSettings, directed, only_for, written_by_gputui
from gputui.config.schema import Section, Source, did_you_mean
from gputui.config.sweep import SWEEP_SECTION, SweepSpec
from gputui.config.ui import UI_SECTION, UiSettings
from gputui.model.errors import UserError, read_user_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Every table a profile may hold, in the order messages list them, so that a profile is
# validated whole whatever has been imported.
PROFILE_SECTIONS: dict[str, Section] = {
    "run": RUN_SECTION, "hosts": HOSTS_SECTION, "cloud": CLOUD_SECTION, "cluster": CLUSTER_SECTION,
    "alerts": ALERTS_SECTION, "sweep": SWEEP_SECTION, "ui": UI_SECTION, "free": FREE_SECTION,
}
# ... and the dataclass that declares each (its `key` fields generated the Section).
DECLARED_BY: dict[str, type] = {
    "run": RunConfig, "hosts": HostSpec, "cloud": CloudSettings, "cluster": ClusterSettings,
    "alerts": AlertSettings, "sweep": SweepSpec, "ui": UiSettings, "free": FreeRule,
}


@dataclass(frozen=True)
class Profile:
    """A loaded profile: where it came from and its validated sections."""

    path: Path | None
    run: RunSettings
    tables: Mapping[str, Any] = field(default_factory=dict)  # the other sections, validated


def parse_profile(text: str, path: Path | None = None, kept: bool = False) -> Profile:
    """Validate TOML text as a profile; errors name `path`, the line and the key. `kept`: a text
    gputui kept itself (a sweep's copy of its profile), read as it was accepted when written."""
    source = Source(path, text)
    where = str(path) if path else "profile"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: not valid TOML: {exc}") from None
    for name in doc:
        if name not in PROFILE_SECTIONS:
            known = ", ".join(f"[{s}]" for s in PROFILE_SECTIONS)
            raise source.error(None, name, f"unknown table or key{did_you_mean(name, PROFILE_SECTIONS)} "
                                           f"(a profile has {known})")
    tables = {name: PROFILE_SECTIONS[name].validate_any(value, source) for name, value in doc.items() if name != "run"}
    run = RUN_SECTION.validate(doc.get("run", {}), source)
    if run.get("command") and not (kept or written_by_gputui(text)):  # a net's key would do nothing: said, never ignored
        stray = next((name for name in run if name in only_for("net")), None)
        if stray is not None:
            raise source.error("run", stray, "a setting of the built-in nets, and this profile runs your own program "
                                             "([run] command): give the program its settings in `command` (or "
                                             f"`trial`), and remove `{stray}`")
    metric, says = directed(run.get("objective") or "")
    if says is not None:  # "max val_acc": kept as the metric and its direction, which every reader takes
        if run.get("direction", says) != says:
            line = source.line_of("run", "objective")
            raise UserError(f"{where}{'' if line is None else f':{line}'}: [run] objective {run['objective']!r} is "
                            f"to {says} but [run] direction is {run['direction']!r}; keep one")
        run["objective"], run["direction"] = metric, says
    if "data" in run and path is not None:
        data = Path(run["data"]).expanduser()
        run["data"] = str(data if data.is_absolute() else (path.parent / data).resolve())
    if path is not None and run.get("command"):  # a program runs in the profile's directory unless told
        workdir = Path(run.get("workdir") or ".").expanduser()
        run["workdir"] = str(workdir if workdir.is_absolute() else (path.parent / workdir).resolve())
    return Profile(path=path, run=RunSettings(**run), tables=tables)


PROFILE_LOOK_BYTES = 64 * 1024  # a TOML file larger than this is not looked into for a profile (a profile is a few KiB)


def looks_like_profile(path: Path) -> bool:
    """Whether a file is a TOML document whose tables are all a profile's (pyproject.toml is not):
    a quick look to list it, not a check (load_profile checks what is chosen)."""
    try:
        if not path.is_file() or path.stat().st_size > PROFILE_LOOK_BYTES:
            return False
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return bool(doc) and all(name in PROFILE_SECTIONS for name in doc)


def load_profile(path: Path) -> Profile:
    """Read and validate a profile file."""
    text = read_user_file(path, "profile", " (profiles ship in profiles/, e.g. profiles/local.toml)")
    return parse_profile(text, path)
