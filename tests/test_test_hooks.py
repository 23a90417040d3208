"""The environment hooks the suite shortens real waits with (docs/stopping.md): unset, as for
every user, the waits are what the docs say; set, they take a positive number of seconds and
ignore anything else."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gputui.model.supervisor import GRACE_ENV, hook_seconds

from .conftest import REPO

HOOKS = (GRACE_ENV, "GPUTUI_STEP_EVENT_INTERVAL", "GPUTUI_TEST_PAUSE_AT_STEP", "GPUTUI_TEST_NAN_AT_STEP")
READ = """
import json
from gputui.model.supervisor import GRACE_S, TORCHRUN_SHUTDOWN_S
from gputui.cluster.members import STOP_GRACE_S
from gputui.train import loop
print(json.dumps({"grace": GRACE_S, "torchrun": TORCHRUN_SHUTDOWN_S, "stop_grace": STOP_GRACE_S,
                  "step_interval": loop.STEP_EVENT_INTERVAL_S, "pause_at": loop.PAUSE_AT_STEP}))
"""


def constants(**env: str) -> dict[str, float | None]:
    """The constants as a fresh process reads them, with no hook set but `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in HOOKS}
    out = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, timeout=120,
                         env={**clean, **env}, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_real_waits_are_what_the_docs_say() -> None:
    """docs/stopping.md: torchrun kills its workers after 30 s, a node supervisor after 35 s."""
    text = (REPO / "docs" / "stopping.md").read_text(encoding="utf-8")
    said = re.search(r"torchrun kills its workers after (\d+) s, a node supervisor after (\d+) s", text)
    assert said is not None, "docs/stopping.md no longer states the two waits"
    real = constants()
    assert (real["torchrun"], real["grace"], real["stop_grace"]) == (float(said[1]), float(said[2]), float(said[2]))
    assert real["step_interval"] == 0.5 and real["pause_at"] is None


def test_the_hooks_reach_a_fresh_process() -> None:
    short = constants(**{GRACE_ENV: "2.5", "GPUTUI_STEP_EVENT_INTERVAL": "0.05", "GPUTUI_TEST_PAUSE_AT_STEP": "7"})
    assert (short["grace"], short["stop_grace"], short["step_interval"], short["pause_at"]) == (2.5, 2.5, 0.05, 7)


@pytest.mark.parametrize("text", ["", "x", "0", "-3", "inf", "nan", "1e999"])
def test_a_grace_hook_that_is_not_a_positive_number_leaves_the_default(text: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, text)
    assert hook_seconds(GRACE_ENV, 35.0) == 35.0


def test_a_grace_hook_is_read_as_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, " 4.5 ")
    assert hook_seconds(GRACE_ENV, 35.0) == 4.5
