"""Flags given before the command (`gputui --profile FILE run`): the dashboard's --profile goes
on to a command that takes a profile, as if given after it; anywhere else, and --demo or --light
before a command other than the dashboard's, is a usage error, never silently dropped (a run
once trained the default profile for 12 epochs instead of the one named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui.cli import main


def bad_profile(tmp_path: Path) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text('[run]\nmodel = "resnet"\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("command", [["run"], ["run", "--json"], ["doctor"]])
def test_a_profile_before_the_command_is_the_commands(tmp_path: Path, command: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    profile = bad_profile(tmp_path)
    assert main(["--profile", str(profile), *command]) == 2
    err = capsys.readouterr().err
    assert f"{profile}:2: [run] model: expected one of 'seed', 'fast', got 'resnet'" in err, err


def test_the_same_profile_before_and_after_is_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = bad_profile(tmp_path)
    assert main(["--profile", str(profile), "run", "--profile", str(tmp_path / "." / "mine.toml")]) == 2
    assert "got 'resnet'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--profile", "a.toml", "run", "--profile", "b.toml"],
     "gputui run: error: two profiles: --profile a.toml before the command and --profile b.toml after it; give one"),
    (["--profile", "a.toml", "runs"], "gputui runs: error: --profile was given before the command, and this command "
                                       "takes none"),
    (["--profile", "a.toml", "cloud", "watch", "--pid", "1"], "gputui cloud watch: error: --profile was given"),
    (["--demo", "run"], "gputui run: error: --demo is the dashboard's (gputui --demo), not this command's"),
    (["--light", "cost"], "gputui cost: error: --light is the dashboard's (gputui --light), not this command's"),
])
def test_a_dashboard_flag_a_command_cannot_take_is_a_usage_error(argv: list[str], said: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "usage: gputui" in err, err


def test_the_dashboards_flags_before_ui_and_serve_stay_theirs() -> None:
    import gputui.cli as cli

    parser = cli.build_parser()
    for argv in (["--profile", "p.toml", "--demo", "--light", "ui"], ["--profile", "p.toml", "serve"], ["--demo"]):
        args = parser.parse_args(argv)
        cli.before_command(parser, args)  # no error, nothing moved
        assert str(args.ui_profile) == ("p.toml" if "p.toml" in argv else "None") and not hasattr(args, "profile")
