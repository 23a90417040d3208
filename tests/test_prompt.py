"""A program that waits for a line typed on the terminal (input(), breakpoint()) under `gputui run`:
gputui.jobs.prompt sees it, and the terminal view puts its status line away while it waits, so what
the user types shows (each redraw of the status line erased it), then shows the prompt's line as a
terminal would (the prompt once, what was typed, the program's answer under it)."""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from gputui.jobs import prompt
from gputui.model.events import make

from .proc_support import wait_until

LINUX = sys.platform.startswith("linux") and platform.machine().lower() in prompt.READ_SYSCALL


def test_the_watch_says_only_changes_and_looks_only_while_the_output_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[int] = []
    reading = {7}

    def reads(pid: int, tty: str, nr: int) -> bool:
        looked.append(pid)
        return pid in reading

    monkeypatch.setattr(prompt, "reads_terminal", reads)
    watch = prompt.PromptWatch("/dev/pts/9", 0)
    assert watch.check([5, 7], quiet_since=100.0, now=100.1) is None and looked == []  # it just printed
    assert watch.check([5, 7], quiet_since=100.0, now=100.5) is True and looked == [5, 7]
    assert watch.check([5, 7], quiet_since=100.0, now=100.6) is None and looked == [5, 7]  # not LOOK_S yet
    assert watch.check([5, 7], quiet_since=100.0, now=100.8) is None  # still waiting: no change to say
    reading.clear()
    assert watch.check([5, 7], quiet_since=100.0, now=101.1) is False
    reading.add(5)
    assert watch.check([5], quiet_since=101.2, now=101.6) is True
    assert watch.check([5], quiet_since=101.7, now=101.8) is False  # it printed: not waiting, no look


def _terminal_view(monkeypatch: pytest.MonkeyPatch) -> tuple[object, io.StringIO]:
    from rich.console import Console

    from gputui.views import program as shown

    view = shown.ProgramView()
    screen = io.StringIO()
    view.console = Console(file=screen, force_terminal=True, width=100)
    view.show(make("start", run_id="r1", program="python train.py", workdir="/w", gpus=[], device="cpu",
                   strategy="single", world_size=1))
    assert view.live is not None, "no live status line on a terminal"
    return view, screen


def test_the_status_line_steps_aside_for_a_prompt_and_its_line_is_not_shown_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    view, screen = _terminal_view(monkeypatch)
    view.output("step 1 done", "output", "\n")
    view.output("(Pdb) ", "output", "")  # the prompt: a line not yet ended
    view.awaiting_input(True)
    shown = screen.getvalue()
    assert view.live is None and "\x1b[?25h" in shown and shown.endswith("\x1b[2K(Pdb) ")  # cursor shown, after the prompt
    parked = len(screen.getvalue())
    view.show(make("metrics", step=2, values={"loss": 0.5}, elapsed_s=3.0))
    view.tick()
    assert len(screen.getvalue()) == parked, "the status line was drawn over what the user types"
    view.output("(Pdb) 42", "output", "\n")  # the program's answer, after the line the user typed
    assert view.live is not None  # the status line is back
    view.output("(Pdb) ", "output", "")
    view.awaiting_input(True)
    view.awaiting_input(False)  # the user ended the line; the program works on, printing nothing yet
    view.output("(Pdb) ", "output", "\n")  # an empty line typed: nothing to print but what is there
    view.close()
    after = screen.getvalue()[parked:]
    assert "42" in after and "(Pdb) 42" not in after and after.count("(Pdb)") == 1


def test_a_warning_while_the_program_waits_goes_under_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    view, screen = _terminal_view(monkeypatch)
    view.output("your name? ", "output", "")
    view.awaiting_input(True)
    view.show(make("warning", reason="waiting_for_input", message="press Enter"))
    view.close()
    assert "your name? \n" in screen.getvalue() and "your name? warning" not in screen.getvalue()


@pytest.mark.skipif(not LINUX, reason="/proc/PID/syscall: Linux on x86_64 or aarch64")
def test_a_process_reading_the_terminal_is_seen_and_one_reading_a_pipe_or_sleeping_is_not() -> None:
    import pty

    master, slave = pty.openpty()
    read_end, write_end = os.pipe()
    tty = os.ttyname(slave)
    nr = prompt.READ_SYSCALL[platform.machine().lower()]
    procs = {name: subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, start_new_session=True)
             for name, argv, stdin in (("tty", ["cat"], slave), ("pipe", ["cat"], read_end),
                                       ("sleep", ["sleep", "60"], slave))}
    try:
        wait_until(lambda: prompt.reads_terminal(procs["tty"].pid, tty, nr), 30, "cat in a read of the terminal")
        wait_until(lambda: Path(f"/proc/{procs['pipe'].pid}/syscall").read_text().startswith(f"{nr} "), 30,
                   "cat in a read of its pipe")
        assert not prompt.reads_terminal(procs["pipe"].pid, tty, nr)  # a read, of another file
        assert not prompt.reads_terminal(procs["sleep"].pid, tty, nr)  # the terminal, not read
        assert not prompt.reads_terminal(2 ** 22 + 1, tty, nr)  # no such process
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(10)
        for fd in (master, slave, read_end, write_end):
            os.close(fd)


@pytest.mark.skipif(not LINUX, reason="/proc/PID/syscall: Linux on x86_64 or aarch64")
def test_input_on_a_terminal_gets_the_typed_line_and_shows_it_as_a_terminal_would(tmp_path: Path) -> None:
    """`gputui run -- python ask.py` on a terminal: input() got EOF (stdin was /dev/null); once it
    had the terminal, the status line's redraws erased what the user typed."""
    from .conftest import cli_env
    from .proc_support import Terminal, terminal_env

    terminal = Terminal()
    screen = terminal.screen
    env = terminal_env(cli_env())
    code = "name = input('your name? ')\nprint('hello', name.upper(), flush=True)\n"
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-m", "gputui", "run", "--run-dir", str(run_dir), "--", "python", "-c",
                              code], env=env, cwd=tmp_path, stdin=terminal.slave, stdout=terminal.slave,
                             stderr=terminal.slave)
    try:
        def prompt_shown() -> bool:  # the cursor shown, the prompt written raw after it
            assert child.poll() is None, f"gputui ended before the prompt: {bytes(screen)[-2000:]!r}"
            return b"\x1b[?25h" in screen and screen.endswith(b"\x1b[2Kyour name? ")

        wait_until(prompt_shown, 120, "the status line to step aside for the prompt",
                   detail=lambda: repr(bytes(screen)[-2000:]))
        os.write(terminal.master, b"ann\n")
        assert child.wait(120) == 0, bytes(screen)[-2000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        text = terminal.close().decode(errors="replace")
    assert (run_dir / "output.log").read_text() == "your name? hello ANN\n"
    assert "your name? ann" in text  # the terminal's echo, right after the prompt
    assert "hello ANN" in text and "your name? hello" not in text  # the prompt's line not printed again
