"""Profile validation: unknown keys, wrong types, impossible values; errors name file, line, key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui.model.errors import UserError
from gputui.model.paths import profiles_dir
from gputui.config.run import RunSettings
from gputui.config.profile import load_profile, parse_profile
from gputui.config.recipes import RECIPES


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", sorted(profiles_dir().glob("*.toml")), ids=lambda p: p.name)
def test_shipped_profiles_are_valid(path: Path) -> None:
    profile = load_profile(path)
    if profile.run.command:  # your own program (profiles/program.toml, print_only.toml): no built-in net
        assert profile.run.resolve().is_program and Path(profile.run.workdir or "").is_dir()
    else:
        assert profile.run.model in RECIPES


def test_default_profile_is_the_seed_network_on_auto() -> None:
    cfg = load_profile(profiles_dir() / "local.toml").run.resolve()
    assert (cfg.model, cfg.device, cfg.strategy) == ("seed", "auto", "single")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[run]\nmodel = \"seed\"\nepochz = 3\n", r"p.toml:3: \[run\] epochz: unknown key, did you mean `epochs`\? \(known"),
        ("[run]\nbatchsize = 3\n", r"\[run\] batchsize: unknown key, did you mean `batch_size`\? \(known"),
        ("[run]\nwhatever = 3\n", r"\[run\] whatever: unknown key \(known keys: batch_size,"),  # nothing near it
        ("[run]\n\nepochs = \"ten\"\n", r"p.toml:3: \[run\] epochs: expected a whole number >= 1 and <= 100000, got 'ten'"),
        ("[run]\nepochs = 0\n", r"p.toml:2: \[run\] epochs: expected a whole number >= 1"),
        ("[run]\nlr = -0.1\n", r"\[run\] lr: expected a number > 0"),
        ("[run]\nmodel = \"resnet\"\n", r"\[run\] model: expected one of 'seed', 'fast'"),
        ("[run]\ndevice = \"gpu\"\n", r"\[run\] device: expected 'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"),
        ("[run]\nbetas = [0.9]\n", r"\[run\] betas: expected a list of two numbers"),
        ("[run]\nepochs = true\n", r"\[run\] epochs: expected a whole number"),
        ("[clouds]\nregion = \"x\"\n", r"p.toml:1: clouds: unknown table or key, did you mean `cloud`\? \(a profile"),
        ("run = 3\n", r"\[run\] must be a table"),
        ("[run\nmodel=1", r"p.toml: not valid TOML"),
        # a program's profile: a built-in net's key would do nothing, so it is refused where it is set
        ('[run]\ncommand = ["python", "t.py"]\n\nepochs = 3\n',
         r"p.toml:4: \[run\] epochs: a setting of the built-in nets, and this profile runs your own program "
         r"\(\[run\] command\): give the program its settings in `command` \(or `trial`\), and remove `epochs`"),
        ('[run]\nlr = 0.1\ncommand = ["python", "t.py"]\n', r"p.toml:2: \[run\] lr: a setting of the built-in nets"),
        ('[run]\ncommand = ["t"]\ntrial = {a = [1]}\n',
         r"p.toml:3: \[run\] trial: expected a table of numbers, strings or booleans \(name = value\), got"),
        ('[run]\ncommand = ["t"]\ntrial = {a = nan}\n', r"p.toml:3: \[run\] trial: expected a table of numbers"),
        ('[run]\ncommand = ["t"]\ntrial = "lr=1"\n', r"p.toml:3: \[run\] trial: expected a table of numbers"),
        ('[run]\ncommand = ["t"]\ntrial = {"a b" = 1}\n',
         r"p.toml:3: \[run\] trial: expected parameter names of letters, digits and '_' \('a b' is not one"),
    ],
)
def test_bad_profiles(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_profile(write(tmp_path, text))


def test_missing_profile(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="profile not found"):
        load_profile(tmp_path / "absent.toml")


def test_data_path_is_relative_to_the_profile(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, '[run]\ndata = "mnist"\n'))
    assert profile.run.data == str((tmp_path / "mnist").resolve())


def test_precedence_recipe_then_profile_then_flags() -> None:
    profile = parse_profile("[run]\nmodel = \"fast\"\nepochs = 3\nbatch_size = 32\n")
    cfg = profile.run.merged(RunSettings(batch_size=256)).resolve()
    assert cfg.model == "fast"
    assert cfg.epochs == 3  # profile over recipe
    assert cfg.batch_size == 256  # flag over profile
    assert cfg.lr == RECIPES["fast"].lr  # recipe fills the rest
    assert cfg.seed == 0  # schema default


def test_resolved_profile_round_trips() -> None:
    cfg = RunSettings(model="fast", gpus=(0, 1), data="/tmp/x y\"z").resolve()
    again = parse_profile(cfg.to_toml()).run.resolve()
    assert again == cfg


def test_a_runs_objective_may_say_its_direction() -> None:
    """[run] objective = "min loss" rates the run by `loss`, lower better, as [sweep] takes it; a
    [run] direction that says otherwise is one line, and so is an objective that names no metric."""
    from gputui.config.profile import parse_profile

    command = '[run]\ncommand = ["python", "train.py"]\n'
    cfg = parse_profile(command + 'objective = "min loss"\n').run.resolve()
    assert (cfg.objective, cfg.direction) == ("loss", "minimize")
    cfg = parse_profile(command + 'objective = "val_acc"\ndirection = "minimize"\n').run.resolve()
    assert (cfg.objective, cfg.direction) == ("val_acc", "minimize")  # a bare name keeps [run] direction
    with pytest.raises(UserError, match=r"\[run\] objective 'max val_acc' is to maximize but \[run\] direction is "
                                        r"'minimize'; keep one"):
        parse_profile(command + 'objective = "max val_acc"\ndirection = "minimize"\n').run.resolve()
    with pytest.raises(UserError, match=r":3: \[run\] objective: expected the name of a metric"):
        parse_profile(command + 'objective = "val acc"\n', Path("p.toml"))


def test_a_programs_trial_and_a_nets_key_in_a_profile_gputui_wrote() -> None:
    """[run] trial keeps its values' types; a resolved profile gputui wrote before it left a
    program's net keys out (they were all written) still loads, so old runs resume."""
    cfg = parse_profile('[run]\ncommand = ["t"]\ntrial = {lr = 0.01, n = 3, act = "gelu", deep = false}\n').run
    assert cfg.resolve().trial == (("act", "gelu"), ("deep", False), ("lr", 0.01), ("n", 3))
    old = ('# Resolved profile of this run (written by gputui; used by --resume).\n[run]\nmodel = "seed"\n'
           'epochs = 12\nlr = 0.02\ncommand = ["python", "t.py"]\n')
    assert parse_profile(old, Path("profile.toml")).run.resolve().command == ("python", "t.py")
    # a net's profile may hold a program's keys (the default profile, under `gputui run -- PROGRAM`)
    assert parse_profile('[run]\nepochs = 3\nstop_grace_s = 5\n').run.resolve().stop_grace_s == 5
