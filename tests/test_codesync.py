"""The program's code goes to the nodes (gputui.cluster.codesync): which files, the size cap,
only what changed, never outside remote_dir, and `[run] setup` once per node.

The tests that need a node use a loopback sshd (tests/cluster_fixture.py); its HOME is a
directory here, so what the node holds is read straight from the disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cluster.codesync import (
    LAST, MANIFEST, SETUP_STAMP, CodeFile, check_size, parse_manifest, run_setup, sync_workdir, workdir_files,
)
from gputui.cluster.sshnode import SlaveConnection
from gputui.config.hosts import HostSpec
from gputui.model.errors import GputuiError, UserError

from .cluster_fixture import ClusterNodes, cluster_nodes, trust  # noqa: F401 - fixtures


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def paths(files: list[CodeFile]) -> list[str]:
    return [f.path for f in files]


# -- which files (no node) -------------------------------------------------------------------

def test_a_plain_directory_sends_its_files_less_excludes_links_and_gputui_names(tmp_path: Path) -> None:
    work = tmp_path / "w"
    write(work / "train.py", "print(1)\n")
    write(work / "pkg" / "model.py", "x = 1\n")
    write(work / "pkg" / "__pycache__" / "model.cpython-311.pyc", b"\0")
    write(work / "data" / "big.bin", b"x" * 10)
    write(work / "weights.pt", b"w")
    write(work / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(work / MANIFEST, "{}")
    (work / "outside").symlink_to(tmp_path)  # a link to a directory: never followed
    (work / "link.py").symlink_to(work / "train.py")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    found = workdir_files(work, ["data/*", "*.pt", "__pycache__"])
    assert paths(found) == ["pkg/model.py", "run.sh", "train.py"]
    assert not found.git and found.skipped_links == ["link.py", "outside"]
    assert [f.executable for f in found] == [False, True, False]
    assert found[2].size == 9


def test_a_git_work_tree_honours_gitignore_and_sends_untracked_files(tmp_path: Path) -> None:
    work = tmp_path / "w"
    write(work / ".gitignore", "*.log\nout/\n")
    write(work / "train.py", "print(1)\n")
    write(work / "new.py", "print(2)\n")  # untracked, not ignored: sent
    write(work / "run.log", "noise\n")
    write(work / "out" / "x.bin", b"x")
    write(work / "data" / "d.bin", b"d")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "add", "train.py", ".gitignore"], check=True)
    found = workdir_files(work, ["data"])
    assert found.git
    assert paths(found) == [".gitignore", "new.py", "train.py"]


def test_sync_max_mb_is_one_line_naming_the_three_largest_files() -> None:
    files = [CodeFile("a.py", 1_000, 0), CodeFile("data/train.bin", 150_000_000, 0),
             CodeFile("ckpt/model.pt", 60_000_000, 0), CodeFile("data/val.bin", 20_000_000, 0)]
    check_size(files, 300)
    with pytest.raises(UserError) as caught:
        check_size(files, 200)
    text = str(caught.value)
    assert "\n" not in text and "230.0 MB" in text and "sync_max_mb = 200" in text
    assert "data/train.bin (150.0 MB), ckpt/model.pt (60.0 MB), data/val.bin (20.0 MB)" in text
    assert "a.py" not in text and "sync_exclude" in text and ".gitignore" in text


class Untouchable:
    """A node that fails the test if anything is asked of it."""

    name = "n0"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the node was used ({name}) before the refusal")


@pytest.mark.parametrize("code_dir, remote_dir", [
    ("/srv/elsewhere/code", "/home/u/.gputui-cluster"),
    ("/home/u/.gputui-cluster/runs/../../x/code", "/home/u/.gputui-cluster"),
    ("/home/u/.gputui-cluster", "/home/u/.gputui-cluster"),
    ("/home/u/.gputui-cluster/../x/runs/r/code", None),
    ("/somewhere/code", None),
])
def test_a_code_directory_outside_remote_dir_is_refused_before_the_node_is_used(
    tmp_path: Path, code_dir: str, remote_dir: str | None,
) -> None:
    with pytest.raises(GputuiError, match="not inside the cluster's remote_dir"):
        sync_workdir(Untouchable(), [], tmp_path, code_dir, remote_dir)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["../x.py", "/etc/passwd", "a/../../x", "a//b", ".gputui-sync.json"])
def test_a_file_path_that_escapes_the_code_directory_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(GputuiError, match="refused"):
        sync_workdir(Untouchable(), [CodeFile(bad, 1, 0)], tmp_path, "/r/runs/x/code")  # type: ignore[arg-type]


def test_a_hostile_manifest_is_not_used() -> None:
    good = {"version": 1, "files": {"a.py": [1, 2, "0" * 64, False]}}
    assert parse_manifest(good) == {"a.py": (1, 2, "0" * 64, False)}
    for path, entry in [("../../victim", [1, 2, "0" * 64, False]), ("/etc/passwd", [1, 2, "0" * 64, False]),
                        ("a.py", [-1, 2, "0" * 64, False]), ("a.py", [1, 2, "nothex", False]),
                        ("a.py", [1, 2.5, "0" * 64, False]), ("a.py", [1, 2, "0" * 64, 1])]:
        assert parse_manifest({"version": 1, "files": {path: entry}}) is None, (path, entry)


# -- on a loopback node ----------------------------------------------------------------------

@pytest.fixture()
def node(cluster_nodes: ClusterNodes, gputui_home: Path) -> Iterator[tuple[SlaveConnection, Path]]:
    """A connection to the session's node, and a fresh remote_dir (a path of its HOME, here)."""
    server = cluster_nodes.shared_node(0)
    trust(gputui_home, server)
    assert server.home is not None
    remote_dir = server.home / f"rd-{uuid.uuid4().hex[:8]}"
    conn = SlaveConnection(HostSpec("n0", server.address, server.port, "root", cluster_nodes.user_key)).open_or_raise()
    try:
        yield conn, remote_dir
    finally:
        conn.close()


def code_dir(remote_dir: Path, run: str = "r1") -> Path:
    return remote_dir / "runs" / run / "code"


def sync(conn: SlaveConnection, work: Path, remote_dir: Path, run: str = "r1", exclude: tuple[str, ...] = ()) -> Any:
    return sync_workdir(conn, workdir_files(work, exclude), work, str(code_dir(remote_dir, run)), str(remote_dir))


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".gputui")}


def test_the_second_sync_sends_only_what_changed(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    for i in range(5):
        write(work / "pkg" / f"m{i}.py", f"x = {i}\n")
    first = sync(conn, work, remote_dir)
    assert (first.sent_files, first.unchanged_files, first.manifest) == (5, 0, "missing")
    write(work / "pkg" / "m0.py", "x = 'changed'\n")
    os.utime(work / "pkg" / "m1.py", ns=(1, 1))  # touched: mtime only, same content
    write(work / "new.py", "y = 1\n")
    second = sync(conn, work, remote_dir)
    assert (second.sent_files, second.unchanged_files, second.removed_files) == (2, 4, 0)
    assert second.sent_bytes == len("x = 'changed'\n") + len("y = 1\n")
    assert tree(code_dir(remote_dir)) == tree(work)
    third = sync(conn, work, remote_dir)
    assert (third.sent_files, third.unchanged_files) == (0, 6)


def test_a_file_removed_here_is_removed_there_and_the_programs_own_files_stay(
    node: tuple[SlaveConnection, Path], tmp_path: Path,
) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / "keep.py", "1")
    write(work / "old" / "gone.py", "2")
    sync(conn, work, remote_dir)
    write(code_dir(remote_dir) / "outputs" / "result.txt", "the program wrote this")
    (work / "old" / "gone.py").unlink()
    stats = sync(conn, work, remote_dir)
    assert stats.removed_files == 1 and stats.sent_files == 0
    assert not (code_dir(remote_dir) / "old").exists()
    assert (code_dir(remote_dir) / "outputs" / "result.txt").exists()


def test_excluded_and_ignored_files_never_reach_the_node(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / ".gitignore", "*.log\n")
    write(work / "train.py", "1")
    write(work / "run.log", "2")
    write(work / "data" / "big.bin", b"3")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    sync(conn, work, remote_dir, exclude=("data/*",))
    assert sorted(tree(code_dir(remote_dir))) == [".gitignore", "train.py"]


def test_the_executable_bit_is_kept_and_files_are_private(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / "run.sh", "#!/bin/sh\necho hi\n").chmod(0o755)
    write(work / "lib.py", "1").chmod(0o644)
    sync(conn, work, remote_dir)
    assert (code_dir(remote_dir) / "run.sh").stat().st_mode & 0o777 == 0o700
    assert (code_dir(remote_dir) / "lib.py").stat().st_mode & 0o777 == 0o600
    (work / "lib.py").chmod(0o755)
    stats = sync(conn, work, remote_dir)
    assert stats.sent_files == 0 and (code_dir(remote_dir) / "lib.py").stat().st_mode & 0o777 == 0o700


def test_sync_max_mb_refuses_before_anything_reaches_the_node(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / "data" / "huge.bin", os.urandom(300_000))
    write(work / "train.py", "1")
    with pytest.raises(UserError, match=r"data/huge\.bin \(0\.3 MB\)"):
        sync_workdir(conn, workdir_files(work, ()), work, str(code_dir(remote_dir)), str(remote_dir), max_mb=0.2)
    assert not remote_dir.exists()


def test_a_link_on_the_node_is_refused_and_nothing_is_written_through_it(
    node: tuple[SlaveConnection, Path], tmp_path: Path,
) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / "sub" / "x.py", "1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (remote_dir / "runs").mkdir(parents=True)
    (remote_dir / "runs" / "r1").symlink_to(outside)  # the run's directory is a link out of remote_dir
    with pytest.raises(GputuiError, match="is a link or not a directory"):
        sync(conn, work, remote_dir)
    code_dir(remote_dir, "r2").joinpath("sub").parent.mkdir(parents=True)
    code_dir(remote_dir, "r2").joinpath("sub").symlink_to(outside)  # a directory inside the code, a link
    with pytest.raises(GputuiError, match="is a link or not a directory"):
        sync(conn, work, remote_dir, run="r2")
    assert list(outside.iterdir()) == []


def test_a_garbled_or_hostile_manifest_means_everything_is_sent_again(
    node: tuple[SlaveConnection, Path], tmp_path: Path,
) -> None:
    conn, remote_dir = node
    work = tmp_path / "w"
    write(work / "a.py", "1")
    write(work / "b.py", "2")
    sync(conn, work, remote_dir)
    victim = write(remote_dir / "victim.txt", "keep me")
    manifest = code_dir(remote_dir) / MANIFEST
    for garbage in ("{not json", json.dumps({"version": 1, "files": {
            "a.py": [1, (work / "a.py").stat().st_mtime_ns, "0" * 64, False],
            "../../victim.txt": [7, 1, "0" * 64, False]}})):
        manifest.write_text(garbage)
        stats = sync(conn, work, remote_dir)
        assert (stats.sent_files, stats.removed_files, stats.manifest) == (2, 0, "garbled"), garbage
        assert victim.read_text() == "keep me"
        assert parse_manifest(json.loads(manifest.read_text())) is not None


def test_a_new_run_starts_from_the_last_runs_code_on_that_node(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    (remote_dir / "venv" / "bin").mkdir(parents=True)
    (remote_dir / "venv" / "bin" / "python").symlink_to(sys.executable)  # as the bootstrap leaves it
    work = tmp_path / "w"
    for i in range(4):
        write(work / f"m{i}.py", f"x = {i}\n")
    sync(conn, work, remote_dir, run="r1")
    assert json.loads((remote_dir / LAST).read_text()) == {"code": "runs/r1/code"}
    write(code_dir(remote_dir, "r1") / "m3.py", "x = 9\n")  # edited there, same size: its sha256 tells
    write(work / "m0.py", "x = 'changed'\n")
    stats = sync(conn, work, remote_dir, run="r2")
    assert stats.manifest == "seeded" and stats.seeded_files == 3
    assert (stats.sent_files, stats.unchanged_files) == (2, 2)
    assert tree(code_dir(remote_dir, "r2")) == tree(work)


# -- [run] setup -----------------------------------------------------------------------------

FAKE_PIP = """#!/bin/sh
echo "pip from $VIRTUAL_ENV: $*" >> "$VIRTUAL_ENV/../pip-calls"
echo "Successfully installed things"
"""


def fake_venv(remote_dir: Path) -> Path:
    venv = remote_dir / "venv"
    write(venv / "bin" / "pip", FAKE_PIP).chmod(0o755)
    return venv


def test_setup_runs_once_and_again_after_requirements_change(node: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, remote_dir = node
    venv = fake_venv(remote_dir)
    work = tmp_path / "w"
    write(work / "requirements.txt", "numpy\n")
    write(work / "train.py", "1")
    log = tmp_path / "nodes" / "n0" / "output.log"
    command = "pip install -r requirements.txt"
    code = sync(conn, work, remote_dir).code_dir
    setup_files = ("requirements.txt", "pyproject.toml")
    assert run_setup(conn, command, setup_files, code, str(venv), log) is True
    assert run_setup(conn, command, setup_files, code, str(venv), log) is False
    write(work / "train.py", "2")  # not a setup file
    sync(conn, work, remote_dir)
    assert run_setup(conn, command, setup_files, code, str(venv), log) is False
    write(work / "requirements.txt", "numpy\ntorch\n")
    sync(conn, work, remote_dir)
    assert run_setup(conn, command, setup_files, code, str(venv), log) is True
    calls = (remote_dir / "pip-calls").read_text().splitlines()
    assert calls == [f"pip from {venv}: install -r requirements.txt"] * 2
    assert log.read_text().count("Successfully installed things") == 2
    assert (venv / SETUP_STAMP).exists()


def test_a_failing_setup_is_one_line_naming_the_node_and_its_last_line(
    node: tuple[SlaveConnection, Path], tmp_path: Path,
) -> None:
    conn, remote_dir = node
    venv = fake_venv(remote_dir)
    work = tmp_path / "w"
    write(work / "train.py", "1")
    code = sync(conn, work, remote_dir).code_dir
    lines: list[str] = []
    command = "echo collecting; echo 'ERROR: No matching distribution for nosuchpkg' >&2; exit 3"
    with pytest.raises(GputuiError) as caught:
        run_setup(conn, command, (), code, str(venv), lines.append)
    assert str(caught.value) == ("slave n0: [run] setup failed (exit 3): "
                                 "ERROR: No matching distribution for nosuchpkg")
    assert "collecting" in lines
    assert not (venv / SETUP_STAMP).exists()  # a failed setup runs again next time
