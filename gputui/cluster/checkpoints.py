"""A cluster run's program checkpoints: pulled from rank 0's node, pushed back for a resume.

The master keeps the last checkpoint it pulled in `<run dir>/checkpoints` (the directory a run on
this machine gives its program). A pull lists the node's checkpoint directory without following
anything (`find -printf`: type, size, mtime to the nanosecond), refuses the whole checkpoint when
it holds anything but regular files and directories (a link to /dev/zero, a FIFO, a device) or
passes the caps (MAX_CHECKPOINT a file, MAX_TOTAL in all, MAX_FILES), fetches only the files
whose size or mtime changed since the last pull (each counted as it comes: gputui.cluster.sshnode
.get), takes the unchanged ones from the last pull, builds it all in a temporary directory and
renames it into place. A refused or failed pull keeps the previous checkpoint and says why in a
`warning` event. What the last pull holds (files, and the step the program was at) is kept in
`pulled.json`, so `--resume` knows the step it resumes from.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gputui.cluster.sshnode import quote_path, sh
from gputui.model.errors import GputuiError
from gputui.model.text import clean
from gputui.runs.store import MAX_CHECKPOINT

MAX_TOTAL = 16 * MAX_CHECKPOINT  # bytes in one pulled checkpoint, all files together
MAX_FILES = 10_000
PULLED = "pulled.json"  # in the master's run directory: what the last pull holds
LIST_TIMEOUT_S = 60.0

# (type "f"/"d"/other, size, mtime) of each entry under the checkpoint directory, by relative path
Listing = dict[str, tuple[str, int, float]]


class Refused(GputuiError):
    """A checkpoint the master does not take (a link, a device, over a cap)."""


def parse_find(text: str) -> Listing:
    """`find DIR -mindepth 1 -printf '%y %s %T@ %P\\0'` output."""
    out: Listing = {}
    for entry in text.split("\0"):
        if not entry:
            continue
        parts = entry.split(" ", 3)
        if len(parts) != 4:
            raise Refused(f"an unreadable listing entry ({clean(entry, 80)!r})")
        kind, size, mtime, rel = parts
        try:
            out[rel] = (kind, int(size), float(mtime))
        except ValueError:
            raise Refused(f"an unreadable listing entry ({clean(entry, 80)!r})") from None
        if len(out) > MAX_FILES:
            raise Refused(f"more than {MAX_FILES} files")
    return out


class RemoteSource:
    """A slave's checkpoint directory over its SSH connection."""

    def __init__(self, conn: Any, root: str) -> None:
        self.conn, self.root = conn, root

    def listing(self) -> Listing:
        command = (f"test -d {quote_path(self.root)} || exit 0; cd {quote_path(self.root)} && "
                   f"find . -mindepth 1 -printf {sh('%y %s %T@ %P')}'\\0' | head -z -n {sh(str(MAX_FILES + 1))}")
        return parse_find(self.conn.check(command, timeout=LIST_TIMEOUT_S, what="listing the checkpoint"))

    def fetch(self, rel: str, dest: Path) -> None:
        if not self.conn.get(f"{self.root}/{rel}", dest, max_bytes=MAX_CHECKPOINT):
            raise Refused(f"{rel} went away while it was fetched")


class LocalSource:
    """The master's own node's checkpoint directory (a run directory on this machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def listing(self) -> Listing:
        out: Listing = {}
        if not self.root.is_dir():
            return out
        stack = [self.root]
        while stack:
            folder = stack.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else "l"
                    out[os.path.relpath(entry.path, self.root)] = (kind, info.st_size, info.st_mtime_ns / 1e9)
                    if kind == "d":
                        stack.append(Path(entry.path))
                    if len(out) > MAX_FILES:
                        raise Refused(f"more than {MAX_FILES} files")
        return out

    def fetch(self, rel: str, dest: Path) -> None:
        fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(f"{rel} is not a regular file")
            copied = 0
            with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
                while chunk := src.read(1 << 20):
                    copied += len(chunk)
                    if copied > MAX_CHECKPOINT:
                        raise Refused(f"{rel} passed {MAX_CHECKPOINT} bytes while it was copied")
                    out.write(chunk)


@dataclass
class Pulled:
    """What the master's checkpoint directory holds: the files as listed on the node, and the step."""

    files: dict[str, tuple[int, float]] = field(default_factory=dict)
    step: int | None = None
    node: str | None = None

    @classmethod
    def load(cls, run_path: Path) -> "Pulled":
        try:
            raw = json.loads((run_path / PULLED).read_text(encoding="utf-8"))
            files = {str(k): (int(v[0]), float(v[1])) for k, v in raw.get("files", {}).items()}
            step = raw.get("step")
            return cls(files, step if isinstance(step, int) and not isinstance(step, bool) else None,
                       raw.get("node") if isinstance(raw.get("node"), str) else None)
        except (OSError, ValueError, TypeError, AttributeError, IndexError):
            return cls()

    def save(self, run_path: Path) -> None:
        tmp = run_path / (PULLED + ".part")
        tmp.write_text(json.dumps({"files": self.files, "step": self.step, "node": self.node}), encoding="utf-8")
        os.replace(tmp, run_path / PULLED)


def check_listing(listing: Listing) -> tuple[dict[str, tuple[int, float]], list[str]]:
    """The regular files (size, mtime) and the directories of a listing; Refused for anything else
    or past a cap."""
    files: dict[str, tuple[int, float]] = {}
    dirs = []
    for rel, (kind, size, mtime) in sorted(listing.items()):
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise Refused(f"an entry outside the checkpoint directory ({clean(rel, 80)!r})")
        if kind == "d":
            dirs.append(rel)
        elif kind == "f":
            if size > MAX_CHECKPOINT:
                raise Refused(f"{clean(rel, 80)} is {size} bytes, over the cap of {MAX_CHECKPOINT} a file")
            files[rel] = (size, mtime)
        else:
            raise Refused(f"{clean(rel, 80)} is not a regular file (a link, a device or a pipe)")
    total = sum(size for size, _ in files.values())
    if total > MAX_TOTAL:
        raise Refused(f"{total} bytes in all, over the cap of {MAX_TOTAL}")
    return files, dirs


def pull(source: Any, dest: Path, pulled: Pulled) -> tuple[Pulled, int, int] | None:
    """The node's checkpoint into `dest` (replaced whole, by a rename); (what it holds now, files
    fetched, bytes fetched), or None when nothing changed. Raises Refused / GputuiError / OSError;
    `dest` is then as it was."""
    files, dirs = check_listing(source.listing())
    if files == pulled.files and dest.is_dir():
        return None
    tmp = dest.with_name(f"{dest.name}.part{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    fetched = fetched_bytes = 0
    try:
        for rel in dirs:
            (tmp / rel).mkdir(mode=0o700, parents=True, exist_ok=True)
        for rel, (size, mtime) in files.items():
            target = tmp / rel
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            kept = dest / rel
            if pulled.files.get(rel) == (size, mtime) and kept.is_file() and not kept.is_symlink():
                os.link(kept, target)  # unchanged since the last pull: the copy we have
                continue
            source.fetch(rel, target)
            fetched += 1
            fetched_bytes += target.stat().st_size
        old = dest.with_name(f"{dest.name}.old{os.getpid()}")
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Pulled(files, pulled.step, pulled.node), fetched, fetched_bytes


def push(conn: Any, local: Path, remote: str, check: Callable[[str, str], Any] | None = None) -> int:
    """The master's checkpoint `local` into a node's `remote` directory, which it replaces (a slave
    over SFTP, or with `conn` None the master's own node's directory); the files sent."""
    files = sorted(p for p in local.rglob("*") if p.is_file() and not p.is_symlink()) if local.is_dir() else []
    if conn is None:
        target = Path(remote)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(mode=0o700, parents=True)
        for path in files:
            dest = target / path.relative_to(local)
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        return len(files)
    folders = sorted({str(p.parent.relative_to(local)) for p in files} - {"."})
    command = f"rm -rf {quote_path(remote)} && mkdir -p -m 700 {quote_path(remote)}"
    if folders:
        command += f" && cd {quote_path(remote)} && mkdir -p " + sh(*folders)
    conn.check(command, what="making the checkpoint directory")
    for path in files:
        conn.put(path, f"{remote}/{path.relative_to(local).as_posix()}")
    return len(files)


def now() -> float:
    return time.monotonic()
