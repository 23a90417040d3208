"""`gputui --demo` in a real terminal (tmux): training progresses, a slave launched with u
shows up, q (terminate) exits cleanly and leaves nothing running."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil
import pytest

from gputui.cloud.ledger import Ledger
from tests.conftest import REPO

TMUX = shutil.which("tmux")


class Tmux:
    def __init__(self) -> None:
        if TMUX is None:  # like a missing sshd: a failure, never a silent skip (CI installs both)
            pytest.fail("tmux is needed for this test (apt-get install tmux; .ci/run installs it)")
        self.socket = f"gputui-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run([str(TMUX), "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "demo")

    def wait(self, check: Callable[[str], object], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")
            time.sleep(0.25)


def step(screen: str) -> int:
    found = re.search(r"step (\d+)/\d+", screen)
    return int(found.group(1)) if found else -1


def test_demo_under_tmux(tmp_path: Path) -> None:
    home = tmp_path / "home"
    command = (f"cd {shlex.quote(str(REPO))} && env GPUTUI_HOME={shlex.quote(str(home))} GPUTUI_SIM_LAUNCH_DELAY=1 "
               f"{shlex.quote(sys.executable)} -m gputui --demo; echo gputui-exit=$?; sleep 120")
    tmux = Tmux()
    tmux("new-session", "-d", "-s", "demo", "-x", "120", "-y", "40", command)
    try:
        pane = psutil.Process(int(tmux("display-message", "-p", "-t", "demo", "#{pane_pid}").strip()))
        tmux.wait(lambda s: "Hosts & GPUs" in s and "sim-0" in s, 30, "the first frame")
        tmux("send-keys", "-t", "demo", "?")
        tmux.wait(lambda s: "dashboard: keys" in s, 30, "the help")
        tmux("send-keys", "-t", "demo", "Escape")  # a lone Esc: a key once the input parser's timeout passes
        tmux.wait(lambda s: "dashboard: keys" not in s, 30, "Esc to close the help")
        tmux("send-keys", "-t", "demo", "t")
        first = step(tmux.wait(lambda s: step(s) > 0, 90, "the first training steps"))
        tmux.wait(lambda s: step(s) > first, 60, "training to progress")
        tmux("send-keys", "-t", "demo", "u")
        screen = tmux.wait(lambda s: re.search(r"i-[0-9a-f]{17} +g4dn\.xlarge.*running", s), 30, "the slave")
        slave = re.search(r"i-[0-9a-f]{17}", screen).group(0)
        children = [p for p in pane.children(recursive=True) if "sleep" not in " ".join(p.cmdline())]
        assert any("run" in p.cmdline() and "--json" in p.cmdline() for p in children), "no training child"
        tmux("send-keys", "-t", "demo", "q")
        tmux.wait(lambda s: "Keep it running" in s, 10, "the question about the run")
        tmux("send-keys", "-t", "demo", "s")  # stop it, with a checkpoint
        tmux.wait(lambda s: "Terminate them" in s, 30, "the question about the slaves")
        tmux("send-keys", "-t", "demo", "t")
        tmux.wait(lambda s: "gputui-exit=0" in s, 60, "a clean exit")
        alive = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"left running: {[p.cmdline() for p in alive]}"
        with Ledger(home / "ledger.sqlite3") as ledger:
            assert ledger.instances(running=True) == []
            assert ledger.get(slave).ended_by == "user"
    finally:
        subprocess.run([str(TMUX), "-L", tmux.socket, "kill-server"], capture_output=True, timeout=10)
