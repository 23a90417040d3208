"""The README's set-up commands are the ones CI runs, and they never install into the system Python."""

from __future__ import annotations

import re

from .conftest import REPO


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Set-up: two commands"):]
    block = section[section.index("```bash") + len("```bash"):section.index("```", section.index("```bash") + 7)]
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command_exactly() -> None:
    run, test = readme_commands()
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert test in ci, (test, ci)
    assert "gputui run" in run


def test_the_commands_use_the_project_venv_and_pin_the_cpu_torch() -> None:
    for command in readme_commands():
        assert not re.search(r"(^|&&\s*)(python3? -m pip|pip3?) install", command), command
        assert ".venv/bin/" in command, command
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "torch==2.13.0" in setup and "python3 -m venv .venv" in setup
