"""gputui.runs.store in process: which process a run is (run.pid, /proc), which event logs are
open for writing, the bounded reader of events.jsonl (EventLines, iter_events) and the run
resolver's edges. Written to kill what benchmarks/mutation.py showed untested; no process is
started: the live process is this test's own, a dead one a pid past the kernel's pid_max."""

from __future__ import annotations

import builtins
import io
import os
import stat
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from gputui.model.errors import UserError
from gputui.model import pids
from gputui.model.pids import process_start
from gputui.runs import store
from gputui.runs.store import (EventLines, EventLog, RunDir, RunProcess, clear_pid, find, iter_events, live_process,
                               live_runs, read_pid, run_dirs, write_pid, written, written_files)


def dead_pid() -> int:
    """A pid no process can have: past the kernel's largest."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def stat_line(pid: int, comm: str = "python", state: str = "S", start: str = "4242") -> str:
    """A /proc/PID/stat line: field 3 the state, field 22 the start time, each other field its own number."""
    rest = [state] + [str(100 + i) for i in range(4, 22)] + [start] + [str(100 + i) for i in range(23, 53)]
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


@pytest.fixture
def fake_stat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[int, str | bytes | None], None]:
    """Make /proc/PID/stat read as the given text or bytes (None: unreadable) for chosen pids: a
    file with those bytes, opened as the code asks (its encoding and errors)."""
    texts: dict[str, str | bytes | None] = {}
    real_open = builtins.open

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str) and file in texts:
            text = texts[file]
            if text is None:
                raise FileNotFoundError(file)
            stand_in = tmp_path / ("stat-" + file.split("/")[2])
            stand_in.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
            return real_open(stand_in, *args, **kwargs)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(pids, "open", fake_open, raising=False)  # /proc/PID/stat is read there

    def set_stat(pid: int, text: str | bytes | None) -> None:
        texts[f"/proc/{pid}/stat"] = text

    return set_stat


def run_in(tmp_path: Path, name: str = "20260101-000000-aaaa") -> RunDir:
    path = tmp_path / name
    path.mkdir(parents=True)
    return RunDir(path)


# -- process_start -----------------------------------------------------------------------------------

def test_the_start_time_is_field_22_of_stat_even_with_parentheses_in_the_name(fake_stat: Any) -> None:
    fake_stat(7, stat_line(7, comm="we ird) (name", start="987654"))
    assert process_start(7) == "987654"


def test_a_process_whose_name_is_not_ascii_still_has_its_start_time_and_state(tmp_path: Path,
                                                                             fake_stat: Any) -> None:
    fake_stat(7, stat_line(7, comm="tr\u00e4ning \u2603", start="31337").encode("utf-8"))
    assert process_start(7) == "31337"
    run = run_in(tmp_path)
    run.pidfile.write_text(f"{os.getpid()}\n4242\n", encoding="utf-8")
    fake_stat(os.getpid(), stat_line(os.getpid(), comm="\u00e9\u00e9", state="Z", start="4242").encode("utf-8"))
    assert live_process(run) is None
    fake_stat(os.getpid(), stat_line(os.getpid(), comm="\u00e9\u00e9", start="4242").encode("latin-1"))
    assert live_process(run) == RunProcess(os.getpid(), "4242", None)


def test_asking_whether_a_run_lives_sends_it_no_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(pids.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    run = run_in(tmp_path)
    write_pid(run, os.getpid())
    assert live_process(run) is not None
    assert sent == [(os.getpid(), 0)]


def test_a_later_thread_of_this_process_started_later_than_the_process() -> None:
    started: list[str | None] = []
    thread = threading.Thread(target=lambda: started.append(process_start(threading.get_native_id())))
    thread.start()
    thread.join(timeout=30)
    mine = process_start(os.getpid())
    assert mine is not None and mine.isdigit() and started[0] is not None
    assert int(started[0]) > int(mine)


@pytest.mark.parametrize("text", [None, "7 no closing parenthesis S 1 2 3\n", "7 (python) S 1 2\n"])
def test_no_start_time_when_stat_is_missing_or_garbled(fake_stat: Any, text: str | None) -> None:
    fake_stat(7, text)
    assert process_start(7) is None


def test_no_start_time_for_a_pid_that_is_no_process() -> None:
    assert process_start(dead_pid()) is None


# -- run.pid -------------------------------------------------------------------------------------------

def test_write_pid_writes_the_pid_its_start_and_the_profile_and_nothing_else(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    write_pid(run, os.getpid(), tmp_path / "p.toml")
    assert run.pidfile.read_text(encoding="utf-8") == f"{os.getpid()}\n{process_start(os.getpid())}\n{tmp_path / 'p.toml'}\n"
    assert sorted(p.name for p in run.path.iterdir()) == ["run.pid"]  # no temporary file left
    assert read_pid(run) == RunProcess(os.getpid(), process_start(os.getpid()), str(tmp_path / "p.toml"))


def test_a_pid_with_no_start_time_is_written_with_an_empty_second_line(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    write_pid(run, dead_pid())
    assert run.pidfile.read_text(encoding="utf-8") == f"{dead_pid()}\n\n\n"
    assert read_pid(run) == RunProcess(dead_pid(), None, None)


def test_rewriting_the_same_pid_keeps_its_profile_and_another_pid_does_not(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    write_pid(run, os.getpid(), "a.toml")
    write_pid(run, os.getpid())
    assert read_pid(run).profile == "a.toml"  # type: ignore[union-attr]
    write_pid(run, dead_pid())
    assert read_pid(run) == RunProcess(dead_pid(), None, None)
    write_pid(run, os.getpid(), "b.toml")
    assert read_pid(run).profile == "b.toml"  # type: ignore[union-attr]


def test_a_pid_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "gone")
    write_pid(run, os.getpid(), "p.toml")
    assert not run.path.exists()


@pytest.mark.parametrize("content", [b"", b"0\n1\n", b"-3\n1\n", b"abc\n", b"\xff\xfe\n", b"\n12\n"])
def test_a_pidfile_without_a_positive_pid_names_no_process(tmp_path: Path, content: bytes) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_bytes(content)
    assert read_pid(run) is None


def test_no_pidfile_names_no_process(tmp_path: Path) -> None:
    assert read_pid(run_in(tmp_path)) is None


@pytest.mark.parametrize("content, expected", [
    (" 12 \n 345 \n p.toml \n", RunProcess(12, "345", "p.toml")),
    ("12\n", RunProcess(12, None, None)),
    ("12\n  \n  \n", RunProcess(12, None, None)),
    ("12\n\nq.toml\n", RunProcess(12, None, "q.toml")),
    ("1\n9\n", RunProcess(1, "9", None)),
])
def test_read_pid_reads_each_line_stripped_and_an_empty_one_as_unknown(tmp_path: Path, content: str,
                                                                       expected: RunProcess) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_text(content, encoding="utf-8")
    assert read_pid(run) == expected


def test_clear_pid_removes_only_its_own_pid(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    write_pid(run, os.getpid())
    clear_pid(run, dead_pid())
    assert run.pidfile.is_file()
    clear_pid(run, os.getpid())
    assert not run.pidfile.exists()
    clear_pid(run, os.getpid())  # no file: nothing to do
    assert not run.pidfile.exists()


# -- live_process, live_runs ---------------------------------------------------------------------------

def test_this_process_is_a_live_run(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    write_pid(run, os.getpid(), "p.toml")
    assert live_process(run) == RunProcess(os.getpid(), process_start(os.getpid()), "p.toml")


def test_a_dead_pid_or_no_pidfile_is_no_live_run(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    assert live_process(run) is None
    write_pid(run, dead_pid())
    assert live_process(run) is None


def test_a_later_process_with_the_runs_pid_is_not_the_run(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_text(f"{os.getpid()}\n1\n", encoding="utf-8")  # started at tick 1: not this process
    assert live_process(run) is None


def test_a_pidfile_without_a_start_time_trusts_the_pid(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_text(f"{os.getpid()}\n\n", encoding="utf-8")
    assert live_process(run) == RunProcess(os.getpid(), None, None)


def test_a_zombie_is_no_live_run_and_a_sleeper_is(tmp_path: Path, fake_stat: Any) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_text(f"{os.getpid()}\n4242\n", encoding="utf-8")
    fake_stat(os.getpid(), stat_line(os.getpid(), comm="a) Z (b", state="Z", start="4242"))
    assert live_process(run) is None
    fake_stat(os.getpid(), stat_line(os.getpid(), comm="a) Z (b", state="S", start="4242"))
    assert live_process(run) == RunProcess(os.getpid(), "4242", None)


def test_without_proc_a_pid_that_exists_is_taken_as_live(tmp_path: Path, fake_stat: Any) -> None:
    run = run_in(tmp_path)
    run.pidfile.write_text(f"{os.getpid()}\n4242\n", encoding="utf-8")
    fake_stat(os.getpid(), None)
    assert live_process(run) == RunProcess(os.getpid(), "4242", None)
    fake_stat(os.getpid(), "garbled\n")
    assert live_process(run) == RunProcess(os.getpid(), "4242", None)


def test_another_users_process_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_stat: Any) -> None:
    def kill(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(pids.os, "kill", kill)
    run = run_in(tmp_path)
    pid = dead_pid()
    run.pidfile.write_text(f"{pid}\n4242\n", encoding="utf-8")
    fake_stat(pid, stat_line(pid, start="4242"))
    assert live_process(run) == RunProcess(pid, "4242", None)
    fake_stat(pid, stat_line(pid, state="Z", start="4242"))
    assert live_process(run) is None


def test_live_runs_are_those_with_a_live_process_newest_first(tmp_path: Path) -> None:
    older, newer, dead, none = (run_in(tmp_path, n) for n in ("20260101-000000-aaaa", "20260102-000000-aaaa",
                                                               "20260103-000000-aaaa", "20260104-000000-aaaa"))
    write_pid(older, os.getpid())
    write_pid(newer, os.getpid())
    write_pid(dead, dead_pid())
    (none.path / "profile.toml").write_text("", encoding="utf-8")
    assert live_runs(tmp_path) == [newer, older]


def test_no_live_runs_where_there_is_no_home(tmp_path: Path) -> None:
    assert live_runs(tmp_path / "nowhere") == []
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert live_runs(tmp_path / "file") == []


def test_a_home_that_cannot_be_listed_has_no_live_runs_nor_runs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    write_pid(run_in(tmp_path), os.getpid())
    (tmp_path / "20260101-000000-aaaa" / "profile.toml").write_text("", encoding="utf-8")

    def refuse(self: Path) -> Iterator[Path]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", refuse)
    assert live_runs(tmp_path) == []
    assert list(run_dirs(tmp_path)) == []


# -- written_files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND])
def test_a_file_this_process_writes_is_written(tmp_path: Path, flags: int) -> None:
    path = tmp_path / "events.jsonl"
    other = tmp_path / "other.jsonl"
    other.write_text("", encoding="utf-8")
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        assert written_files([path, other]) == {path}
    finally:
        os.close(fd)
    assert written_files([path, other]) == set()


def test_a_file_only_read_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    with open(path, encoding="utf-8"):
        assert written_files([path]) == set()


def test_a_written_file_is_named_as_asked_even_through_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with open(real, "a", encoding="utf-8"):
        assert written_files([link]) == {link}
        assert written_files([]) == set()
        assert written_files(iter([link, real])) == {real}  # the last name given for one file


def test_processes_whose_descriptors_cannot_be_listed_are_passed_over(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_listdir = os.listdir
    mine = f"/proc/{os.getpid()}/fd"

    def listdir(path: Any) -> list[str]:
        if isinstance(path, str) and path.startswith("/proc/") and path.endswith("/fd") and path != mine:
            raise PermissionError(13, "Permission denied")  # another user's, or gone
        return real_listdir(path)

    monkeypatch.setattr(store.os, "listdir", listdir)
    path = tmp_path / "events.jsonl"
    with open(path, "a", encoding="utf-8"):
        assert written_files([path]) == {path}


def test_descriptors_that_cannot_be_read_are_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    real_readlink = os.readlink
    with open(path, "a", encoding="utf-8") as fh:
        mine = f"/proc/{os.getpid()}/fd/{fh.fileno()}"

        def readlink(link: Any) -> str:
            if isinstance(link, str) and link.startswith("/proc/") and link != mine:
                raise FileNotFoundError(2, "closed meanwhile")
            return real_readlink(link)

        monkeypatch.setattr(store.os, "readlink", readlink)
        assert written_files([path]) == {path}


def test_without_fdinfo_which_files_are_written_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_is_dir = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda self: False if str(self) == "/proc/self/fdinfo" else real_is_dir(self))
    assert written_files([tmp_path / "x"]) is None


def test_an_fdinfo_that_cannot_be_read_says_not_written(tmp_path: Path, fake_stat: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = builtins.open

    def no_fdinfo(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str) and "/fdinfo/" in file:
            raise PermissionError(13, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(store, "open", no_fdinfo, raising=False)
    path = tmp_path / "events.jsonl"
    with open(path, "a", encoding="utf-8"):
        assert written_files([path]) == set()


# -- EventLog, encode -------------------------------------------------------------------------------

def test_the_event_log_is_private_to_its_owner(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        log = EventLog(tmp_path / "events.jsonl")
    finally:
        os.umask(old)
    log.write('{"event": "start", "model": "μ"}')
    log.close()
    assert stat.S_IMODE((tmp_path / "events.jsonl").stat().st_mode) == 0o600
    assert (tmp_path / "events.jsonl").read_bytes() == '{"event": "start", "model": "μ"}\n'.encode("utf-8")


# -- EventLines, iter_events ---------------------------------------------------------------------------

def lines_of(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(data)
    return path


def test_before_reading_nothing_is_read_and_the_offset_is_the_start(tmp_path: Path) -> None:
    path = lines_of(tmp_path, b"a\n")
    fresh = EventLines(path)
    assert (fresh.offset, fresh.tail, fresh.dropped, fresh.read_bytes, fresh.start, fresh.end) == (0, b"", 0, 0, 0, None)
    later = EventLines(path, 5, 9)
    assert (later.offset, later.start, later.end) == (5, 5, 9)


def test_lines_read_in_small_chunks_with_the_tail_and_the_offset_after_the_last_line(tmp_path: Path) -> None:
    lines = EventLines(lines_of(tmp_path, b"a\nbb\nccc"), chunk=2)
    assert list(lines) == [b"a", b"bb"]
    assert (lines.offset, lines.tail, lines.dropped, lines.read_bytes) == (5, b"ccc", 0, 8)


def test_the_file_is_read_a_chunk_at_a_time_never_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real_open = builtins.open

    class Counted(io.BufferedReader):
        def read(self, size: int | None = -1) -> bytes:
            data = super().read(size)
            sizes.append(len(data))
            return data

    def counted_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if mode == "rb":
            return Counted(io.FileIO(file, "r"))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(store, "open", counted_open, raising=False)
    lines = EventLines(lines_of(tmp_path, b"a\nbb\nccc\n"), chunk=4)
    assert list(lines) == [b"a", b"bb", b"ccc"]
    assert sizes == [4, 4, 1, 0]


def test_a_file_that_ends_with_its_newline_has_no_tail(tmp_path: Path) -> None:
    lines = EventLines(lines_of(tmp_path, b"a\nbb\n"), chunk=3)
    assert list(lines) == [b"a", b"bb"]
    assert (lines.offset, lines.tail, lines.read_bytes) == (5, b"", 5)


def test_reading_stops_at_end_whatever_the_chunk(tmp_path: Path) -> None:
    path = lines_of(tmp_path, b"a\nbb\nccc\nd\n")
    for chunk in (1, 2, 3, 1 << 20):
        lines = EventLines(path, 0, 5, chunk=chunk)
        assert list(lines) == [b"a", b"bb"], chunk
        assert (lines.offset, lines.tail, lines.read_bytes) == (5, b"", 5), chunk


def test_reading_from_start_to_end_gives_what_lies_between(tmp_path: Path) -> None:
    path = lines_of(tmp_path, b"a\nbb\nccc\nd\n")
    lines = EventLines(path, 2, 10, chunk=2)
    assert list(lines) == [b"bb", b"ccc"]
    assert (lines.offset, lines.tail, lines.read_bytes) == (9, b"d", 8)
    lines = EventLines(path, 2, chunk=4)
    assert list(lines) == [b"bb", b"ccc", b"d"]
    assert (lines.offset, lines.tail, lines.read_bytes) == (11, b"", 9)


def test_an_empty_range_reads_nothing(tmp_path: Path) -> None:
    path = lines_of(tmp_path, b"a\nbb\n")
    for start, end in ((2, 2), (4, 2)):
        lines = EventLines(path, start, end)
        assert list(lines) == []
        assert (lines.offset, lines.tail, lines.read_bytes) == (start, b"", 0)


def test_a_line_past_max_line_is_dropped_and_counted(tmp_path: Path) -> None:
    lines = EventLines(lines_of(tmp_path, b"ok\n" + b"x" * 50 + b"\nfine\n"), max_line=10, chunk=7)
    assert list(lines) == [b"ok", b"fine"]
    assert (lines.dropped, lines.offset, lines.tail) == (1, 59, b"")


def test_a_second_reading_starts_again_from_start(tmp_path: Path) -> None:
    lines = EventLines(lines_of(tmp_path, b"a\nbb\nc"), 2)
    assert list(lines) == [b"bb"]
    assert list(lines) == [b"bb"]
    assert (lines.offset, lines.tail, lines.read_bytes) == (5, b"c", 8)


def test_events_are_read_up_to_end_only(tmp_path: Path) -> None:
    one, two = b'{"event": "start"}\n', b'{"event": "done"}\n'
    path = lines_of(tmp_path, one + two)
    assert list(iter_events(path, 0, len(one))) == [{"event": "start"}]
    assert list(iter_events(path, len(one))) == [{"event": "done"}]
    assert list(iter_events(path, 0, len(one) + 5)) == [{"event": "start"}]  # a torn piece is no event


def test_a_whole_last_event_without_its_newline_counts_and_a_torn_one_does_not(tmp_path: Path) -> None:
    assert list(iter_events(lines_of(tmp_path, b'{"event": "a"}\n{"event": "b"}'))) == [{"event": "a"},
                                                                                       {"event": "b"}]
    assert list(iter_events(lines_of(tmp_path, b'{"event": "a"}\n{"event": "b'))) == [{"event": "a"}]


def test_no_events_file_has_no_events(tmp_path: Path) -> None:
    assert list(iter_events(tmp_path / "none.jsonl")) == []


# -- find, written, run_dirs -----------------------------------------------------------------------------

def test_find_looks_in_the_home_it_is_given_not_the_default(tmp_path: Path, gputui_home: Path) -> None:
    other = tmp_path / "elsewhere"
    (other / "r1").mkdir(parents=True)
    (other / "r1" / "profile.toml").write_text("", encoding="utf-8")
    (gputui_home / "runs" / "r2").mkdir(parents=True)
    (gputui_home / "runs" / "r2" / "profile.toml").write_text("", encoding="utf-8")
    assert find("last", other) == RunDir(other / "r1")
    assert find("r1", other) == RunDir(other / "r1")
    with pytest.raises(UserError) as err:
        find("r2", other)
    assert str(err.value) == (f"--resume r2: no such run (not a run id in {other}, nor a run directory); "
                              "`gputui runs` lists them")


def test_a_run_with_neither_file_readable_was_written_at_zero(tmp_path: Path) -> None:
    assert written(tmp_path) == 0.0
