"""profile.toml is written by tomli-w: any string survives, and a run whose data path has an
emoji resumes (issue 20, section 4)."""

from __future__ import annotations

import sys
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from gputui.config.run import RunConfig, RunSettings, only_for
from gputui.config.profile import load_profile, parse_profile
from gputui.runs.store import PROFILE

from .conftest import json_lines, make_dataset, run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Non-ASCII (BMP), outside the BMP (an emoji, which json.dumps wrote as a surrogate pair TOML
# rejects), both quotes, a backslash, a TOML escape look-alike and control characters.
HOSTILE = 'ä中 😀𝄞 "dq" \'sq\' back\\slash \\u00e9 tab\tnl\nbell\x07 del\x7f'


def string_fields() -> list[str]:
    hints = typing.get_type_hints(RunConfig)
    return [f.name for f in fields(RunConfig)  # str or str | None (not a tuple of strings)
            if hints[f.name] is str or (typing.get_origin(hints[f.name]) is not tuple and str in typing.get_args(hints[f.name]))]


@pytest.mark.parametrize("command", [(), ("python", "train.py")], ids=["net", "program"])
def test_every_string_field_round_trips_through_the_toml(command: tuple[str, ...]) -> None:
    names = string_fields()
    assert {"model", "device", "strategy", "optimizer", "schedule", "data", "workdir", "setup"} <= set(names)
    cfg = RunSettings(gpus=(0, 3), command=command).resolve()
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    values.update({name: f"{name} {HOSTILE}" for name in names})
    hostile = RunConfig(**values)
    doc = tomllib.loads(hostile.to_toml())
    assert set(doc) == {"run"}
    aside = only_for("net" if command else "program")  # the other kind's keys are not written
    for name in names:
        if name in aside:
            assert name not in doc["run"], name
        else:
            assert doc["run"][name] == f"{name} {HOSTILE}", name
    assert doc["run"]["gpus"] == [0, 3]
    assert ("betas" in doc["run"]) is not bool(command)
    assert "threads" not in doc["run"]  # None is left out (the default applies on load)
    assert parse_profile(cfg.to_toml()).run.resolve() == cfg  # what is left out loads back as its default


def test_a_valid_profile_with_an_emoji_data_path_loads_back_equal() -> None:
    cfg = RunSettings(model="fast", gpus=(0, 1), data=f"/data/{HOSTILE}").resolve()
    again = parse_profile(cfg.to_toml()).run.resolve()
    assert again == cfg


def test_a_run_whose_data_path_has_an_emoji_resumes(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / 'mnist 😀 "q" \\ é', 256, 128)
    run_dir = tmp_path / "run"
    first = run_cli("run", "--json", "--data", str(data), "--epochs", "1", "--batch-size", "64",
                    "--threads", "1", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stderr
    assert json_lines(first.stdout)[-1]["event"] == "done"
    assert load_profile(run_dir / PROFILE).run.data == str(data)

    resumed = run_cli("run", "--json", "--resume", str(run_dir), "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[0]["event"] == "start" and events[0]["resumed_from_step"] == 4  # 256 / 64 steps
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 2
    assert load_profile(run_dir / PROFILE).run.data == str(data)  # rewritten on resume, still whole
