"""Bootstrapping a slave over SSH/SFTP: Python and torch checks, a venv with this gputui
installed from a locally built wheel, the dataset (md5-verified), and a marker file.

The marker (gputui version, wheel hash, Python, torch, datasets present) makes a second
bootstrap one SSH round trip: when it matches, nothing is checked again or copied. The
venv reuses the slave's own torch wherever that Python keeps it (system, venv, conda,
pyenv, uv, user site): a `.pth` file in the venv adds the probed interpreter's own site
directories. (`--system-site-packages` would not do: from an interpreter that is itself a
venv, it exposes the *base* interpreter's packages, not the venv's, and torch is missing.)
The wheel is installed with `pip install --no-deps --no-index`, so the slave needs no internet.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gputui import __version__
from gputui.cluster.sshnode import SlaveConnection, quote_path, sh
from gputui.cluster.wheel import Wheel
from gputui.model.errors import GputuiError, UserError
from gputui.model import outside
from gputui.train.data import STEMS, find_file
from gputui.model.units import plural

MARKER = "marker.json"
MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 6)  # torch.load(weights_only=True) is unsafe below 2.6 (CVE-2025-32434)

# Reads versions from package metadata (importing torch would take seconds), and where this
# Python keeps its packages (the venv will see the same ones).
PTH = "_gputui_base_site.pth"
_PROBE = r"""
import json, os, site, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
out["site"] = [d for i, d in enumerate(dirs) if os.path.isdir(d) and d not in dirs[:i]]
try:
    from importlib import metadata
except ImportError:
    metadata = None
for name in ("torch", "numpy"):
    try:
        out[name] = metadata.version(name)
    except Exception:
        out[name] = None
print(json.dumps(out))
"""
_MD5 = r"""
import hashlib, json, os, sys
out = {}
for path in sys.argv[1:]:
    if os.path.isfile(path):
        h = hashlib.md5()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        out[path] = h.hexdigest()
print(json.dumps(out))
"""


@dataclass(frozen=True)
class DataSet:
    """A local data directory as the slaves get it: its four files and their md5 sums."""

    directory: Path
    files: tuple[tuple[str, str], ...]  # (file name, md5)

    @property
    def digest(self) -> str:
        text = ";".join(f"{name}={md5}" for name, md5 in self.files)
        return hashlib.md5(text.encode()).hexdigest()


def md5_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_dataset(directory: Path) -> DataSet:
    """The four IDX files of `directory` (gzipped or not) with their md5 sums."""
    paths = [find_file(directory, role) for role in STEMS]
    return DataSet(directory, tuple((p.name, md5_file(p)) for p in paths))


@dataclass
class Bootstrapped:
    """A slave ready to train: where things are, what was done, how long it took."""

    name: str
    base: str  # absolute remote directory
    python: str
    torch: str
    data_dir: str
    skipped: bool
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)

    @property
    def venv_python(self) -> str:
        return f"{self.base}/venv/bin/python"

    def run_dir(self, name: str) -> str:
        """A run's directory here (`name`: the run's slave name, gputui.cluster.identity)."""
        return f"{self.base}/runs/{name}"

    @property
    def home(self) -> str:
        return f"{self.base}/home"


def site_pth(dirs: list[str]) -> str:
    """A .pth line that adds `dirs` (and their own .pth files) after the venv's site-packages."""
    # site runs an `import` line of a .pth with exec() in a function: no comprehensions (they
    # cannot see its local names), one call per directory.
    calls = "".join(f"; site.addsitedir({d!r})" for d in dirs if isinstance(d, str) and d and "\n" not in d)
    return f"import site{calls}\n"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def local_torch_version() -> str:
    from importlib import metadata

    return metadata.version("torch")


def check_compatible(name: str, python_cmd: str, probe: dict[str, Any], master_torch: str) -> None:
    """UserError naming the slave and the fix if its Python or torch cannot run gputui."""
    where = f"slave {name}"
    if not probe.get("python"):
        raise UserError(f"{where}: no `{python_cmd}` there: install Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ with "
                        "torch on it, or set [cluster] python to one that has them")
    if _version_tuple(probe["python"]) < MIN_PYTHON:
        raise UserError(f"{where}: Python {probe['python']} at {probe.get('executable')} is too old (gputui needs "
                        f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+): install a newer one or set [cluster] python")
    want = ".".join(str(v) for v in _version_tuple(master_torch)[:2])
    if not probe.get("torch"):
        raise UserError(f"{where}: torch is not installed for {probe.get('executable')}: install it there "
                        f"(pip install 'torch=={want}.*', the master has {master_torch}) or set [cluster] python")
    theirs = _version_tuple(probe["torch"])
    if theirs[:2] < MIN_TORCH or theirs[:2] != _version_tuple(master_torch)[:2]:
        raise UserError(f"{where}: torch {probe['torch']} there is incompatible with the master's {master_torch} "
                        f"(nodes must share torch {want}.x): install 'torch=={want}.*' for {probe.get('executable')}")
    if not probe.get("numpy"):
        raise UserError(f"{where}: numpy is not installed for {probe.get('executable')}: pip install numpy there")


class Bootstrapper:
    """Brings slaves to a state where `venv/bin/python -m gputui.cluster.node` can train."""

    def __init__(self, remote_dir: str, python: str, wheel: Wheel, dataset: DataSet, master_torch: str | None = None) -> None:
        self.remote_dir = remote_dir
        self.python = python
        self.wheel = wheel
        self.dataset = dataset
        self.master_torch = master_torch or local_torch_version()

    def wanted_marker(self, probe: dict[str, Any]) -> dict[str, Any]:
        return {"gputui": __version__, "wheel": self.wheel.source_hash, "python": probe.get("executable"),
                "site": probe.get("site"), "torch": probe.get("torch"), "master_torch": self.master_torch}

    def bootstrap(self, conn: SlaveConnection, check: Callable[[], None] = lambda: None) -> Bootstrapped:
        """Make `conn`'s slave ready; a few round trips when it already is. `check` runs
        between the steps (a stop request raises there)."""
        t0 = time.perf_counter()
        base, marker = self._look(conn)
        if (marker.get("gputui") == __version__ and marker.get("wheel") == self.wheel.source_hash
                and marker.get("master_torch") == self.master_torch and self.dataset.digest in marker.get("datasets", ())
                and marker.get("venv_ok")):
            return Bootstrapped(conn.name, base, marker["python"], marker["torch"],
                                f"{base}/data/{self.dataset.digest}", True, time.perf_counter() - t0)
        steps: list[str] = []
        check()
        probe = self._probe(conn)
        check_compatible(conn.name, self.python, probe, self.master_torch)
        wanted = self.wanted_marker(probe)
        same_install = all(marker.get(k) == v for k, v in wanted.items()) and marker.get("venv_ok")
        if not same_install:
            check()
            self._install(conn, base, probe, steps)
        check()
        data_dir = self._copy_dataset(conn, base, steps)
        datasets = sorted(set(marker.get("datasets", ())) | {self.dataset.digest}) if same_install else [self.dataset.digest]
        conn.put_text(json.dumps({**wanted, "venv_ok": True, "datasets": datasets}), f"{base}/{MARKER}")
        return Bootstrapped(conn.name, base, str(probe["executable"]), str(probe["torch"]), data_dir, False,
                            time.perf_counter() - t0, steps)

    # -- steps ---------------------------------------------------------------------------
    def _look(self, conn: SlaveConnection) -> tuple[str, dict[str, Any]]:
        """Create the base directory; return its absolute path and the marker (or {})."""
        # Private to this account (another one on the slave must not read runs, data or logs):
        # made 0700, gputui's own directories tightened, and the base too once it holds the marker
        # (a directory the user named that gputui did not make keeps its mode).
        script = (f"umask 077 && mkdir -p {quote_path(self.remote_dir)} && cd {quote_path(self.remote_dir)} && "
                  f"mkdir -p runs data wheels home && chmod go-rwx runs data wheels home && "
                  f"{{ test ! -e {sh(MARKER)} || chmod go-rwx . || true; }} && pwd && cat {sh(MARKER)} 2>/dev/null; "
                  "test -x venv/bin/python || echo '@@novenv'")
        out = conn.check(script, what=f"creating {self.remote_dir}")
        lines = out.splitlines()
        if not lines:
            raise GputuiError(f"slave {conn.name}: no answer from the shell")
        base, rest = lines[0].strip(), "\n".join(lines[1:])
        marker: dict[str, Any] = {}
        if "@@novenv" not in rest:
            try:
                loaded = outside.parse(rest.strip() or "{}")  # a slave's answer is data
                marker = loaded if isinstance(loaded, dict) else {}
            except outside.Refused:
                marker = {}
        return base, marker

    def _probe(self, conn: SlaveConnection) -> dict[str, Any]:
        script = (f"if command -v {sh(self.python)} >/dev/null 2>&1; then {sh(self.python, '-c', _PROBE)}; "
                  "else echo '{}'; fi")
        out = conn.check(script, what=f"checking {self.python}")
        try:
            found = outside.parse(out.strip().splitlines()[-1]) if out.strip() else {}
        except outside.Refused:
            raise GputuiError(f"slave {conn.name}: `{self.python}` gave an unexpected answer: {out.strip()[-200:]}") from None
        return found if isinstance(found, dict) else {}

    def _install(self, conn: SlaveConnection, base: str, probe: dict[str, Any], steps: list[str]) -> None:
        venv = f"{base}/venv"
        conn.check(f"test -x {sh(venv)}/bin/python || {sh(str(probe['executable']))} -m venv "
                   f"--without-pip {sh(venv)}", what="creating the venv (needs the venv module, e.g. python3-venv)")
        purelib = conn.check(f"{sh(venv)}/bin/python -c " + sh("import sysconfig; print(sysconfig.get_paths()['purelib'])"),
                             what="finding the venv's site-packages").strip().splitlines()[-1]
        conn.put_text(site_pth(probe.get("site") or []), f"{purelib}/{PTH}")
        steps.append("venv")
        remote_wheel_dir = f"{base}/wheels/{self.wheel.source_hash}"
        remote_wheel = f"{remote_wheel_dir}/{self.wheel.name}"
        conn.check(f"mkdir -p {sh(remote_wheel_dir)}", what="creating the wheel directory")
        try:
            size = conn.sftp().stat(remote_wheel).st_size
        except OSError:
            size = None
        if size != self.wheel.path.stat().st_size:
            conn.put(self.wheel.path, remote_wheel)
            steps.append("wheel copied")
        conn.check(f"{sh(venv)}/bin/python -m pip --version >/dev/null 2>&1 || {sh(venv)}/bin/python -m ensurepip >/dev/null",
                   what="finding pip for the venv (install python3-pip there)")
        conn.check(f"{sh(venv)}/bin/python -m pip install -q --no-deps --no-index --force-reinstall "
                   f"--disable-pip-version-check {sh(remote_wheel)}", timeout=300, what="installing gputui's wheel")
        out = conn.check(f"cd {sh(base)} && {sh(venv)}/bin/python -c "
                         + sh("import gputui, torch, numpy; print(gputui.__version__, gputui.__file__)"),
                         timeout=120, what="importing gputui and torch in the venv")
        version, _, where = out.strip().splitlines()[-1].partition(" ")
        if version != __version__ or not where.startswith(venv):
            raise GputuiError(f"slave {conn.name}: the venv imports gputui {version} from {where}, not the installed "
                              f"wheel; remove {venv} there and retry")
        steps.append(f"gputui {version} installed")

    def _copy_dataset(self, conn: SlaveConnection, base: str, steps: list[str]) -> str:
        data_dir = f"{base}/data/{self.dataset.digest}"
        conn.check(f"mkdir -p {sh(data_dir)}", what="creating the data directory")
        remote = {name: f"{data_dir}/{name}" for name, _ in self.dataset.files}
        have = self._remote_md5(conn, list(remote.values()))
        copied = []
        for name, md5 in self.dataset.files:
            if have.get(remote[name]) != md5:
                conn.put(self.dataset.directory / name, remote[name])
                copied.append(name)
        if copied:
            check = self._remote_md5(conn, [remote[n] for n in copied])
            bad = [n for n, md5 in self.dataset.files if n in copied and check.get(remote[n]) != md5]
            if bad:
                raise GputuiError(f"slave {conn.name}: {bad[0]} arrived damaged (md5 mismatch); check its disk and retry")
            steps.append(f"dataset copied ({plural(len(copied), 'file')}, md5 verified)")
        return data_dir

    def _remote_md5(self, conn: SlaveConnection, paths: list[str]) -> dict[str, str]:
        out = conn.check(sh(self.python, "-c", _MD5, *paths),
                         timeout=120, what="checking the dataset's md5 sums")
        try:
            found = outside.parse(out.strip().splitlines()[-1]) if out.strip() else {}
        except outside.Refused as exc:
            raise GputuiError(f"slave {conn.name}: the dataset's md5 check gave an unexpected answer ({exc})") from None
        if not isinstance(found, dict):
            raise GputuiError(f"slave {conn.name}: the dataset's md5 check gave an unexpected answer")
        return {str(k): str(v) for k, v in found.items()}
