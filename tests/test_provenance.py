"""Which code a program's run ran (gputui.runs.provenance): its workdir's commit and whether its
tracked files had changed, in every start event, in `gputui runs --json` and on the start line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputui.runs.provenance import CodeVersion, code_version

from .conftest import cli_env

pytestmark = pytest.mark.integration  # git, and gputui runs


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "code"
    path.mkdir()
    git(path, "init", "-q")
    (path / "train.py").write_text("print('trained')\n")
    git(path, "add", "train.py")
    git(path, "commit", "-q", "-m", "first")
    return path


def test_a_commit_and_its_changes_are_read_and_nothing_is_written(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = git(repo, "rev-parse", "HEAD")
    assert code_version(repo) == CodeVersion(head, False)
    (repo / "notes.txt").write_text("untracked: not the run's code\n")
    assert code_version(repo) == CodeVersion(head, False)
    index = repo / ".git" / "index"
    os.utime(index, ns=(1_000_000_000, 1_000_000_000))  # an index written long ago ...
    later = index.stat().st_mtime_ns + 10**12
    os.utime(repo / "train.py", ns=(later, later))  # ... and a file touched since: git compares its content
    assert code_version(repo) == CodeVersion(head, False)  # the same content: no change
    assert index.stat().st_mtime_ns == 1_000_000_000  # and no refreshed index written (git status would)
    (repo / "train.py").write_text("print('changed')\n")
    assert code_version(repo) == CodeVersion(head, True)
    (repo / "sub").mkdir()
    assert code_version(repo / "sub") == CodeVersion(head, True)  # a workdir below the work tree's top
    monkeypatch.setenv("GIT_DIR", str(repo.parent / "elsewhere"))  # the workdir's own repository, whatever is set
    assert code_version(repo) == CodeVersion(head, True)
    assert CodeVersion(head, True).fields() == {"git_commit": head, "git_dirty": True}
    assert CodeVersion(head, None).fields() == {"git_commit": head}


def test_no_work_tree_no_commit_or_no_git_is_no_version(repo: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert code_version(plain) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    assert code_version(empty) is None  # no commit yet
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert code_version(repo) is None


def test_each_start_of_a_run_says_its_code_and_runs_lists_the_latest(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    run_dir = tmp_path / "run"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "gputui", "run", *args], cwd=repo, env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    shown = run("--run-dir", str(run_dir), "--device", "cpu", "--", "python", "train.py")
    assert f"python train.py on CPU · git {head[:10]}\n" in shown.stderr, shown.stderr
    (repo / "train.py").write_text("print('changed, then resumed')\n")
    shown = run("--resume", str(run_dir))
    assert f"on CPU (resumed) · git {head[:10]} with uncommitted changes\n" in shown.stderr, shown.stderr
    starts = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if json.loads(line)["event"] == "start"]
    assert [(s["git_commit"], s["git_dirty"]) for s in starts] == [(head, False), (head, True)]
    listed = subprocess.run([sys.executable, "-m", "gputui", "runs", "--json", "--dir", str(tmp_path)],
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["runs"]
    assert (row["git_commit"], row["git_dirty"]) == (head, True)
