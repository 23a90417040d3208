"""Your program's code on a cluster's nodes: which workdir files go, the size cap, an
incremental copy over the slave's own SFTP channel, and `[run] setup` once per node.

What is synced (`workdir_files`): in a git work tree, what `git ls-files --cached --others
--exclude-standard` lists (so .gitignore is honoured and untracked files that are not ignored
go too); elsewhere every regular file under workdir. Never: `.git/`, any path with a component
starting `.gputui` (gputui's own names: the manifest, a GPUTUI_HOME kept in workdir), symbolic
links (counted, never followed: what they point at may be outside workdir or huge), and
whatever `[run] sync_exclude` matches, and gputui's own homes (data, cache, logs) where they
lie inside workdir. `checkpoints/` is not left out by name: gputui's own
checkpoints live in the run directory, not in workdir; a program that writes its own
checkpoints into workdir leaves them out with sync_exclude or .gitignore (and sync_max_mb says
so when they grow).

Where it goes (`sync_workdir`): `<remote_dir>/runs/<run>/code` on the node, one per run, never
outside remote_dir: every directory on the way is looked at with lstat and a link there is
refused, and every path written is relative with no `..`. The node keeps a manifest there
(`.gputui-sync.json`: path -> [size, mtime_ns, sha256, executable]). A file whose size and
mtime match it is not sent; one whose mtime alone changed is hashed here and sent only if its
content did. Files gone from workdir are removed there (only files gputui sent: what the
program writes beside them stays). A run's first sync starts from the files of the code
directory synced last on that node (`code-last.json` in remote_dir), copied there and checked
against their sha256, so a new run sends only what changed since the last one. Each file is
written to a temporary name and renamed, private (0600, 0700 when executable here).

The node's manifest is data: a garbled or hostile one (a path with `..`, a wrong type) means
it is not used, and everything is sent again (nothing is removed on its word).

`[run] setup` (`run_setup`) runs in the code directory with the node's gputui venv first on
PATH and VIRTUAL_ENV set; the venv keeps a stamp (`gputui-setup.json`, the sha256 of the
command and of the setup_files present), so it runs again only when they change, or when the
venv is made anew.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import posixpath
import re
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Sequence

from gputui.cluster.sshnode import SlaveConnection, quote_path, sh
from gputui.model import outside
from gputui.model.lines import OUTPUT_LINE, LineSplitter
from gputui.model.errors import GputuiError, UserError
from gputui.model.paths import homes, private_opener
from gputui.model.text import clean

MANIFEST = ".gputui-sync.json"  # in the code directory on the node
LAST = "code-last.json"  # in the node's remote_dir: the code directory synced last there
SETUP_STAMP = "gputui-setup.json"  # in the node's venv
RESERVED = ".gputui"  # no component of a synced path starts with this
MAX_MANIFEST_BYTES = 64 << 20  # a manifest of 100,000 files is ~15 MB
MAX_SMALL_FILE_BYTES = 16 << 20  # a setup file, a stamp, the last-code pointer
MAX_LOG_BYTES = 64 << 20  # setup output kept in the node's log
CHUNK = 1 << 20
_SHA = re.compile(r"[0-9a-f]{64}")
_CODE_DIR = re.compile(r"(.+)/(runs/[^/]+/code)")


@dataclass(frozen=True)
class CodeFile:
    """A workdir file to sync: its relative posix path, size, mtime and executable bit."""

    path: str
    size: int
    mtime_ns: int
    executable: bool = False


class CodeFiles(list[CodeFile]):
    """`workdir_files`' answer: the files, and what was left out."""

    def __init__(self, files: Iterable[CodeFile] = (), *, git: bool = False, skipped_links: Sequence[str] = (),
                 excluded: int = 0, skipped_other: int = 0) -> None:
        super().__init__(files)
        self.git = git  # listed by git (so .gitignore was honoured)
        self.skipped_links = list(skipped_links)  # symbolic links not synced (relative paths)
        self.excluded = excluded  # files left out by sync_exclude or a reserved name
        self.skipped_other = skipped_other  # listed but not a regular file (a submodule, a FIFO)


@dataclass
class SyncStats:
    """What one sync did on one node."""

    sent_files: int = 0
    sent_bytes: int = 0
    unchanged_files: int = 0
    removed_files: int = 0
    seconds: float = 0.0
    seeded_files: int = 0  # copied on the node from the code directory synced last (counted in unchanged)
    skipped_links: int = 0  # symbolic links in workdir, not synced
    code_dir: str = ""  # the absolute code directory on the node
    manifest: str = "missing"  # the node's manifest: "read", "missing", "garbled", or "seeded" (from the last run)
    notes: list[str] = field(default_factory=list)  # one-line warnings (a garbled manifest, a seed that failed)


# -- which files ---------------------------------------------------------------------------

def safe_rel(path: str) -> bool:
    """Whether `path` is a relative posix path that stays where it is put (no `..`, `.`,
    empty or absolute part, no NUL or backslash)."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\x00" in path or "\\" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _patterns(exclude: Sequence[str]) -> list[str]:
    found = []
    for pattern in exclude:
        pattern = pattern.strip()
        while pattern.startswith("./"):
            pattern = pattern[2:]
        pattern = pattern.rstrip("/")  # "data/" names the directory
        if pattern:
            found.append(pattern)
    return found


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    """Whether a pattern matches `rel`, one of its leading directories, or one of its components."""
    parts = rel.split("/")
    if any(part == ".git" or part.startswith(RESERVED) for part in parts):
        return True
    for pattern in patterns:
        for i in range(len(parts)):
            if fnmatchcase(parts[i], pattern) or fnmatchcase("/".join(parts[: i + 1]), pattern):
                return True
    return False


def _git_listing(workdir: Path) -> list[str] | None:
    """The files git lists under workdir (relative to it), or None when it is not a work tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(workdir), "ls-files", "--cached",
                               "--others", "--exclude-standard", "-z"], capture_output=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return list(dict.fromkeys(os.fsdecode(p) for p in done.stdout.split(b"\x00") if p))


def _walk(workdir: Path, patterns: Sequence[str], links: list[str]) -> list[str]:
    found = []
    for top, dirs, files in os.walk(workdir, followlinks=False):
        rel_top = os.path.relpath(top, workdir)
        prefix = "" if rel_top == "." else rel_top.replace(os.sep, "/") + "/"
        keep = []
        for name in dirs:
            rel = prefix + name
            if os.path.islink(os.path.join(top, name)):
                links.append(rel)
            elif not excluded(rel, patterns):
                keep.append(name)
        dirs[:] = sorted(keep)
        found += [prefix + name for name in sorted(files)]
    return found


def workdir_files(workdir: Path, exclude: Sequence[str] = ()) -> CodeFiles:
    """The files of `workdir` a node gets (see the module's docstring), sorted by path."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise UserError(f"{workdir}: [run] workdir is not a directory; set it to your program's directory")
    real = os.path.realpath(workdir)
    # gputui's own homes (runs, ledger, cache) when they lie in workdir (GPUTUI_HOME=./home)
    patterns = _patterns(exclude) + [glob.escape(os.path.relpath(h, real).replace(os.sep, "/"))
                                     for h in map(os.path.realpath, homes()) if h.startswith(real + os.sep)]
    links: list[str] = []
    listed = _git_listing(workdir)
    names = listed if listed is not None else _walk(workdir, patterns, links)
    parents_ok: dict[str, bool] = {"": True}
    files, dropped, other = [], 0, 0
    for rel in names:
        if not safe_rel(rel) or excluded(rel, patterns):
            dropped += 1
            continue
        parent = posixpath.dirname(rel)
        if parent not in parents_ok:  # a directory replaced by a link since git listed it
            parents_ok[parent] = os.path.realpath(os.path.join(real, parent)) == os.path.join(real, parent)
        if not parents_ok[parent]:
            links.append(rel)
            continue
        try:
            info = os.lstat(os.path.join(real, rel))
        except OSError:  # in git's index, gone from the disk
            continue
        if stat.S_ISLNK(info.st_mode):
            links.append(rel)
        elif stat.S_ISREG(info.st_mode):
            files.append(CodeFile(rel, info.st_size, info.st_mtime_ns, bool(info.st_mode & 0o100)))
        else:
            other += 1
    files.sort(key=lambda f: f.path)
    return CodeFiles(files, git=listed is not None, skipped_links=sorted(links), excluded=dropped, skipped_other=other)


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def check_size(files: Sequence[CodeFile], max_mb: float) -> None:
    """UserError (one line: the total, the 3 largest files, the fixes) when `files` hold more
    than `max_mb` MB (10**6 bytes)."""
    total = sum(f.size for f in files)
    if total <= max_mb * 1e6:
        return
    largest = sorted(files, key=lambda f: (-f.size, f.path))[:3]
    named = ", ".join(f"{clean(f.path, 120)} ({_mb(f.size)})" for f in largest)
    raise UserError(f"workdir holds {_mb(total)} to send to each node, over [run] sync_max_mb = {max_mb:g}; largest: "
                    f"{named}. Leave such files out with [run] sync_exclude (e.g. \"data/*\") or .gitignore, or raise "
                    "[run] sync_max_mb")


# -- the node's side -----------------------------------------------------------------------

def _sftp_path(path: str) -> str:
    """A remote path as SFTP takes it ('~/x': relative to the home, where SFTP starts)."""
    return "." if path == "~" else path[2:] if path.startswith("~/") else path


def _read_small(node: SlaveConnection, remote: str, max_bytes: int) -> bytes | None:
    """A remote regular file's bytes (None: absent, not a regular file, or over `max_bytes`)."""
    sftp = node.sftp()
    try:
        info = sftp.lstat(_sftp_path(remote))
        if info.st_mode is None or not stat.S_ISREG(info.st_mode) or (info.st_size or 0) > max_bytes:
            return None
        with sftp.open(_sftp_path(remote), "rb") as fh:
            if not stat.S_ISREG(fh.stat().st_mode or 0):
                return None
            data: bytes = fh.read(max_bytes + 1)
    except OSError:
        return None
    return data if len(data) <= max_bytes else None


def _read_object(node: SlaveConnection, remote: str, max_bytes: int) -> dict[str, Any] | None:
    """A remote JSON object file (data from outside), None when absent; {} when garbled."""
    data = _read_small(node, remote, max_bytes)
    if data is None:
        return None
    try:
        return outside.parse_object(data, max_chars=max_bytes)
    except outside.Refused:
        return {}


Entry = tuple[int, int, str, bool]  # size, mtime_ns, sha256, executable


def parse_manifest(value: dict[str, Any] | None) -> dict[str, Entry] | None:
    """A manifest from the node, checked entry by entry; None if any part of it is not right."""
    if not value or value.get("version") != 1 or not isinstance(value.get("files"), dict):
        return None
    found: dict[str, Entry] = {}
    for path, entry in value["files"].items():
        if not (safe_rel(path) and not excluded(path, ()) and isinstance(entry, list) and len(entry) == 4):
            return None
        size, mtime, sha, exe = entry
        if type(size) is not int or size < 0 or type(mtime) is not int or not isinstance(sha, str) or not _SHA.fullmatch(sha) or type(exe) is not bool:
            return None
        found[path] = (size, mtime, sha, exe)
    return found


def _manifest_text(entries: dict[str, Entry]) -> str:
    return json.dumps({"version": 1, "files": {p: list(e) for p, e in sorted(entries.items())}}, separators=(",", ":"))


class _Tree:
    """Directories under the node's remote_dir, walked with lstat: a link or a non-directory
    on the way is refused, a missing one is made 0700 (when asked)."""

    def __init__(self, node: SlaveConnection, base: str) -> None:
        self.node, self.base = node, base
        self.sftp = node.sftp()
        self.known: set[str] = set()

    def directory(self, rel: str, make: bool = True) -> bool:
        """Whether base/rel is a real directory (made when missing and `make`); a link refused."""
        path = self.base
        for part in rel.split("/") if rel else ():
            path = f"{path}/{part}"
            if path in self.known:
                continue
            try:
                info = self.sftp.lstat(path)
            except FileNotFoundError:
                if not make:
                    return False
                try:
                    self.sftp.mkdir(path, 0o700)
                except OSError as exc:
                    raise GputuiError(f"slave {self.node.name}: cannot make {path}: {exc}") from None
            except OSError as exc:
                raise GputuiError(f"slave {self.node.name}: cannot look at {path}: {exc}") from None
            else:
                if info.st_mode is None or not stat.S_ISDIR(info.st_mode):
                    raise GputuiError(f"slave {self.node.name}: {clean(path, 300)} is a link or not a directory; the "
                                      f"code is only written inside {clean(self.base, 300)}, so it is refused (remove it there)")
            self.known.add(path)
        return True


def _base(node: SlaveConnection, remote_code_dir: str, remote_dir: str | None) -> tuple[str, str]:
    """(remote_dir as the node resolves it, the code directory relative to it); a code
    directory that is not inside remote_dir is refused."""
    if remote_dir is None:
        match = _CODE_DIR.fullmatch(remote_code_dir)
        base, rel = (match.group(1), match.group(2)) if match else ("", "")
    else:
        base = remote_dir.rstrip("/") or "/"
        prefix = base if base.endswith("/") else base + "/"
        rel = remote_code_dir[len(prefix):] if remote_code_dir.startswith(prefix) else ""
    if not rel or not safe_rel(rel) or ".." in base.split("/") or "\x00" in base:
        raise GputuiError(f"slave {node.name}: the code directory {clean(remote_code_dir, 300)} is not inside the "
                          f"cluster's remote_dir ({clean(remote_dir or '<remote_dir>/runs/RUN/code', 300)}); refused")
    out = node.check(f"umask 077 && mkdir -p {quote_path(base)} && cd {quote_path(base)} && pwd -P",
                     what=f"finding {base}")
    lines = out.strip().splitlines()
    if not lines or not lines[-1].startswith("/"):
        raise GputuiError(f"slave {node.name}: no answer from the shell for {base}")
    return lines[-1].rstrip("/") or "/", rel


_SEED = r"""
import hashlib, json, os, stat, sys
old, new, listing = sys.argv[1:4]
with open(listing, "rb") as fh:
    wanted = json.loads(fh.read())
bad = []
for rel, size, sha, exe in wanted:
    src, dst = os.path.join(old, rel), os.path.join(new, rel)
    tmp = os.path.join(os.path.dirname(dst), ".gputui-seed-part")
    try:
        if os.path.realpath(os.path.dirname(src)) != os.path.dirname(src):
            raise OSError("a link on the way")
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError("not a file")
            os.makedirs(os.path.dirname(dst), 0o700, exist_ok=True)
            if os.path.realpath(os.path.dirname(dst)) != os.path.dirname(dst):
                raise OSError("a link on the way")
            h, n = hashlib.sha256(), 0
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(out, "wb") as g:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                    g.write(block)
                    n += len(block)
                    if n > size:
                        break
            os.chmod(tmp, 0o700 if exe else 0o600)
        if n != size or h.hexdigest() != sha:
            raise OSError("changed")
        os.replace(tmp, dst)
    except (OSError, ValueError):
        bad.append(rel)
        try:
            os.unlink(tmp)
        except OSError:
            pass
said, chars = [], 0
for rel in bad:
    chars += len(rel) + 4
    if chars > 30000:
        break
    said.append(rel)
print(json.dumps({"bad": said, "all": len(said) == len(bad)}))
"""


def _seed(node: SlaveConnection, tree: _Tree, rel: str, stats: SyncStats) -> dict[str, Entry]:
    """The files of the code directory synced last on this node, copied into ours there
    (checked against their sha256 as they are copied); their manifest entries."""
    pointer = _read_object(node, f"{tree.base}/{LAST}", MAX_SMALL_FILE_BYTES)
    old_rel = pointer.get("code") if pointer else None
    if not isinstance(old_rel, str) or old_rel == rel or not safe_rel(old_rel):
        return {}
    try:
        if not tree.directory(old_rel, make=False):
            return {}
    except GputuiError:  # a link on the way there: not a place to copy from
        return {}
    old = parse_manifest(_read_object(node, f"{tree.base}/{old_rel}/{MANIFEST}", MAX_MANIFEST_BYTES))
    if not old:
        return {}
    listing = f"{tree.base}/{rel}/{RESERVED}-seed.json"
    node.put_text(json.dumps([[p, size, sha, exe] for p, (size, _mtime, sha, exe) in old.items()]), listing)
    try:
        out = node.check(f"cd {sh(tree.base)} && if test -x venv/bin/python; then venv/bin/python -c {sh(_SEED)} "
                         f"{sh(tree.base + '/' + old_rel)} {sh(tree.base + '/' + rel)} {sh(listing)}; "
                         "else echo '{\"novenv\": true}'; fi", timeout=600, what="copying the last run's code")
    except GputuiError as exc:  # the copy is a shortcut: without it, everything is sent
        stats.notes.append(f"{exc}; all of the code is sent")
        return {}
    finally:
        try:
            node.sftp().remove(listing)
        except OSError:
            pass
    try:
        answer = outside.parse_object(out.strip().splitlines()[-1] if out.strip() else "")
    except outside.Refused:
        answer = {}
    bad = answer.get("bad")
    if answer.get("novenv"):
        return {}
    if not isinstance(bad, list) or answer.get("all") is not True:
        stats.notes.append(f"slave {node.name}: the last run's code could not be copied there; all of it is sent")
        return {}
    failed = {str(p) for p in bad}
    seeded = {p: e for p, e in old.items() if p not in failed}
    stats.seeded_files = len(seeded)
    return seeded


def _send(node: SlaveConnection, local: Path, remote: str, executable: bool, counter: int) -> tuple[int, str]:
    """One file to `remote` through a temporary name; (bytes sent, sha256)."""
    sftp = node.sftp()
    tmp = f"{posixpath.dirname(remote)}/{RESERVED}-part-{os.getpid()}-{counter}"
    digest, sent = hashlib.sha256(), 0
    try:
        fd = os.open(local, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as src, sftp.open(tmp, "wb") as dst:
            dst.set_pipelined(True)
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                sent += len(chunk)
        sftp.chmod(tmp, 0o700 if executable else 0o600)
        sftp.posix_rename(tmp, remote)
    except OSError as exc:
        try:
            sftp.remove(tmp)
        except OSError:
            pass
        raise GputuiError(f"slave {node.name}: cannot copy {clean(str(local), 300)} to {clean(remote, 300)}: {exc}") from None
    return sent, digest.hexdigest()


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _remove(node: SlaveConnection, tree: _Tree, code: str, paths: Sequence[str]) -> int:
    """Remove files gputui sent that workdir no longer has (and directories they leave empty)."""
    sftp, removed, parents = node.sftp(), 0, set()
    for rel in paths:
        parent = posixpath.dirname(rel)
        if not tree.directory(f"{code}/{parent}" if parent else code, make=False):
            continue
        path = f"{tree.base}/{code}/{rel}"
        try:
            info = sftp.lstat(path)
            if info.st_mode is not None and stat.S_ISDIR(info.st_mode):
                continue
            sftp.remove(path)  # a link is removed, never followed
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise GputuiError(f"slave {node.name}: cannot remove {clean(path, 300)}: {exc}") from None
        while parent:
            parents.add(parent)
            parent = posixpath.dirname(parent)
    for parent in sorted(parents, key=lambda p: -p.count("/")):
        try:
            sftp.rmdir(f"{tree.base}/{code}/{parent}")  # only if empty
            tree.known.discard(f"{tree.base}/{code}/{parent}")
        except OSError:
            pass
    return removed


def sync_workdir(node: SlaveConnection, files: Sequence[CodeFile], workdir: Path, remote_code_dir: str,
                 remote_dir: str | None = None, *, max_mb: float | None = None) -> SyncStats:
    """Send `files` of `workdir` to `remote_code_dir` on `node`: only what changed since the
    last sync there; files gone from `files` removed there. `remote_code_dir` must lie inside
    the cluster's `remote_dir` (given, or the part before `/runs/RUN/code`); '~/' is the home.
    `max_mb`: `check_size` first, before anything is done on the node."""
    t0 = time.perf_counter()
    workdir = Path(workdir)
    if max_mb is not None:
        check_size(files, max_mb)
    bad = [f.path for f in files if not safe_rel(f.path) or excluded(f.path, ())]
    if bad:
        raise GputuiError(f"slave {node.name}: {clean(bad[0], 300)} would be written outside the code directory "
                          "(or over gputui's own files); refused")
    base, rel = _base(node, remote_code_dir, remote_dir)
    tree = _Tree(node, base)
    tree.directory(rel)
    code = f"{base}/{rel}"
    stats = SyncStats(code_dir=code, skipped_links=len(getattr(files, "skipped_links", ())))
    found = _read_object(node, f"{code}/{MANIFEST}", MAX_MANIFEST_BYTES)
    manifest = parse_manifest(found)
    if found is None:
        manifest = _seed(node, tree, rel, stats)
        stats.manifest = "seeded" if manifest else "missing"
    elif manifest is None:
        stats.manifest = "garbled"
        stats.notes.append(f"slave {node.name}: its {MANIFEST} could not be read; all files are sent again")
        manifest = {}
    else:
        stats.manifest = "read"
    sftp = node.sftp()
    local_paths = {f.path for f in files}
    # Removals first: a file that became a directory (or the other way round) needs the old one gone.
    stats.removed_files = _remove(node, tree, rel, sorted(set(manifest) - local_paths))
    entries: dict[str, Entry] = {}
    for n, f in enumerate(files):
        have = manifest.get(f.path)
        local = workdir / f.path
        remote = f"{code}/{f.path}"
        if have is not None and have[0] == f.size and have[1] != f.mtime_ns and _sha256(local) == have[2]:
            have = (f.size, f.mtime_ns, have[2], have[3])  # touched, not changed
        if have is not None and have[:2] == (f.size, f.mtime_ns):
            if have[3] != f.executable:
                try:
                    sftp.chmod(remote, 0o700 if f.executable else 0o600)
                except OSError:
                    have = None
            if have is not None:
                entries[f.path] = (f.size, f.mtime_ns, have[2], f.executable)
                stats.unchanged_files += 1
                continue
        parent = posixpath.dirname(f.path)
        tree.directory(f"{rel}/{parent}" if parent else rel)
        sent, digest = _send(node, local, remote, f.executable, n)
        entries[f.path] = (sent, f.mtime_ns, digest, f.executable)
        stats.sent_files += 1
        stats.sent_bytes += sent
    node.put_text(_manifest_text(entries), f"{code}/{MANIFEST}")
    node.put_text(json.dumps({"code": rel}), f"{base}/{LAST}")
    stats.seconds = time.perf_counter() - t0
    return stats


# -- [run] setup -----------------------------------------------------------------------------

def setup_hash(node: SlaveConnection, command: str, setup_files: Sequence[str], workdir_remote: str) -> str:
    """The sha256 of the setup command and of the setup files present in the node's code directory."""
    digest = hashlib.sha256(json.dumps(["gputui-setup/1", command]).encode())
    for name in setup_files:
        if not safe_rel(name):
            raise UserError(f"[run] setup_files: {clean(name, 200)} is not a path inside workdir; name files relative "
                            "to it, e.g. \"requirements.txt\"")
        data = _read_small(node, f"{workdir_remote}/{name}", MAX_SMALL_FILE_BYTES)
        digest.update(json.dumps([name, None if data is None else hashlib.sha256(data).hexdigest()]).encode())
    return digest.hexdigest()


class _Log:
    """The setup's output, appended to the node's log (a file, or a callable given each line)."""

    def __init__(self, log: "Path | Callable[[str], None]") -> None:
        self.fh: IO[bytes] | None = None
        self.call: Callable[[str], None] | None = None
        self.written = 0
        if callable(log):
            self.call = log
        else:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(log, "ab", opener=private_opener)

    def line(self, raw: bytes) -> None:
        if self.call is not None:
            self.call(clean(outside.decode(raw).rstrip("\r\n"), 2000))
        elif self.fh is not None and self.written < MAX_LOG_BYTES:
            self.fh.write(raw if raw.endswith(b"\n") else raw + b"\n")
            self.written += len(raw) + 1
            if self.written >= MAX_LOG_BYTES:
                self.fh.write(b"gputui: [run] setup output cut here (64 MiB)\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def run_setup(node: SlaveConnection, command: str | None, setup_files: Sequence[str], workdir_remote: str,
              venv: str, log: "Path | Callable[[str], None]", *, timeout_s: float = 3600.0,
              check: Callable[[], None] = lambda: None) -> bool:
    """Run `[run] setup` on `node` in `workdir_remote` inside the venv `venv` (its bin first on
    PATH, VIRTUAL_ENV set), its output appended to `log`; True if it ran, False if skipped (no
    command, or the stamp in the venv matches the command and the setup files). A failure is a
    GputuiError naming the node and the last output line. `check` runs about once a second
    while it waits (a stop raises there)."""
    if not command or not command.strip():
        return False
    want = setup_hash(node, command, setup_files, workdir_remote)
    stamp_path = f"{venv}/{SETUP_STAMP}"
    stamp = _read_object(node, stamp_path, MAX_SMALL_FILE_BYTES)
    if stamp and stamp.get("hash") == want:
        return False
    script = (f"cd {quote_path(workdir_remote)} && VIRTUAL_ENV={quote_path(venv)} && "
              f"PATH={quote_path(venv)}/bin:\"$PATH\" && export VIRTUAL_ENV PATH && unset PYTHONHOME && "
              f"exec sh -c {sh(command)}")
    out = _Log(log)
    last = "no output"
    try:
        out.line(f"gputui: [run] setup on slave {node.name}: {command}".encode())
        channel = node.open(script)
        try:
            deadline = time.monotonic() + timeout_s
            splitter = LineSplitter(OUTPUT_LINE, marker=b" [...]")  # a line at most 64 KiB: a log, not a dump
            channel.settimeout(1.0)
            while True:
                check()
                if time.monotonic() > deadline:
                    raise GputuiError(f"slave {node.name}: [run] setup still running after {timeout_s:g} s; stopped "
                                      f"waiting (last output: {last})")
                try:
                    data = channel.recv(65536)
                except socket.timeout:
                    continue
                lines = splitter.feed(data) if data else splitter.feed(b"\n") if splitter.held else []
                for raw in lines:
                    text = clean(outside.decode(raw).strip(), 200)
                    if text:
                        last = text
                    if raw or data:
                        out.line(raw)
                if not data:
                    break
            status = channel.recv_exit_status() if channel.status_event.wait(30) else -1
        finally:
            channel.close()
    finally:
        out.close()
    if status != 0:
        why = "the connection was lost" if status == -1 else f"exit {status}"
        raise GputuiError(f"slave {node.name}: [run] setup failed ({why}): {last}")
    node.put_text(json.dumps({"hash": want, "command": command}), _sftp_path(stamp_path))
    return True
