"""Which code a run of the user's program ran: its workdir's git commit, and whether the files git
tracks there differed from it (uncommitted changes). Each start event of the run records both
(`git_commit`, `git_dirty`), so `gputui runs` can say which code made a result, and a resume on
changed code shows.

git is asked twice, each bounded (a huge work tree costs the run at most that, never its start):
`rev-parse` for the commit, `status --porcelain --untracked-files=no` for the changes. Neither
writes anything: with GIT_OPTIONAL_LOCKS=0 status writes no refreshed index and takes no lock
the user's own git could meet (`git diff` would write one: it has no such switch). git's
fsmonitor hook is off, as for the code sync (gputui.cluster.codesync). A workdir that is no work
tree, a missing git or a slow one: no fields, and the run goes on.

A sweep's master reads its workdir once and gives each trial that (a host's copy of the code is
no work tree, and the folder above it could be another one: a home under git).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIT_S = 2.0  # seconds each git call may take (its output is read whole: a line per changed file at most)
_SHA = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")  # SHA-1, or SHA-256 in a repository that uses it


@dataclass(frozen=True)
class CodeVersion:
    commit: str  # the full hash of HEAD
    dirty: bool | None  # tracked files differ from HEAD; None: git could not say in time

    def fields(self) -> dict[str, object]:
        """The start event's fields."""
        out: dict[str, object] = {"git_commit": self.commit}
        if self.dirty is not None:
            out["git_dirty"] = self.dirty
        return out


def from_fields(data: object) -> CodeVersion | None:
    """A CodeVersion as `fields` wrote it (a sweep master's, in a trial message: data), or None."""
    if not isinstance(data, dict):
        return None
    commit, dirty = data.get("git_commit"), data.get("git_dirty")
    if not isinstance(commit, str) or not _SHA.match(commit):
        return None
    return CodeVersion(commit, dirty if isinstance(dirty, bool) else None)


def code_version(workdir: Path) -> CodeVersion | None:
    """The workdir's commit and whether its tracked files changed since, or None (not a work tree,
    no commit yet, no git)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the workdir's own repository
    env["GIT_OPTIONAL_LOCKS"] = "0"
    head = _git(workdir, env, "rev-parse", "--verify", "--quiet", "HEAD")
    if head is None or head.returncode != 0:
        return None
    commit = head.stdout.decode("ascii", "replace").strip()
    if not _SHA.match(commit):
        return None
    status = _git(workdir, env, "status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return CodeVersion(commit, dirty)


def _git(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(workdir), *args], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=GIT_S)
    except (OSError, subprocess.SubprocessError):
        return None
