"""`gputui doctor`'s checks: Python, where runs are kept (writable, room), torch (CUDA, cuDNN,
NCCL), NVML and the driver here,
and for each remote host: its bastion (if any), reachable, host key known, nvidia-smi, GPUs,
Python and torch.

Each check is a row with a status (pass, warn, fail), what was found and how to fix it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostState
from gputui.model.text import clean
from gputui.model.units import plural, size

PASS, WARN, FAIL = "pass", "warn", "fail"
MIN_PYTHON = (3, 10)
# The CUDA build of torch, into gputui's own venv (a system pip is refused on PEP 668 systems).
CUDA_TORCH_FIX = "on a GPU machine: GPUTUI_TORCH=torch sh scripts/setup.sh (the CUDA build of torch)"
LOW_SPACE = 1 << 30  # free bytes where runs are kept under which checkpoints and logs may not fit
REMOTE_TIMEOUT_S = 60.0  # importing torch on a cold remote disk is slow

_REMOTE_PROBE = """import sys
print("python", sys.version.split()[0])
try:
    import torch
except Exception as exc:
    print("torch-missing", type(exc).__name__)
else:
    cuda = torch.cuda.is_available()
    print("torch", torch.__version__, "cuda" if cuda else "cpu", torch.cuda.device_count() if cuda else 0)
"""


@dataclass(frozen=True)
class Check:
    """One row of the report."""

    host: str  # "local" or a remote host's name
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def python_check() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] >= MIN_PYTHON:
        return Check("local", "python", PASS, f"Python {version} ({sys.executable})")
    need = ".".join(map(str, MIN_PYTHON))
    return Check("local", "python", FAIL, f"Python {version}", f"install Python {need} or newer")


def torch_checks() -> list[Check]:
    """torch's version, and whether CUDA, cuDNN and NCCL are usable."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install is a finding, not a crash
        return [Check("local", "torch", FAIL, f"cannot import torch: {type(exc).__name__}: {exc}", "sh scripts/setup.sh (it installs torch into .venv)")]
    rows = [Check("local", "torch", PASS, f"torch {torch.__version__}")]
    cuda_build = torch.version.cuda
    if not torch.cuda.is_available():
        why = "a CPU build of torch" if cuda_build is None else f"CUDA {cuda_build} build, but no usable GPU or driver"
        fix = CUDA_TORCH_FIX if cuda_build is None else "check the driver with nvidia-smi"
        rows.append(Check("local", "cuda", WARN, f"no CUDA ({why}); training runs on the CPU", fix))
        return rows  # cuDNN and NCCL mean nothing without CUDA: no rows of their own
    rows.append(Check("local", "cuda", PASS, f"CUDA {cuda_build}, {plural(torch.cuda.device_count(), 'GPU')} visible to torch"))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None  # type: ignore[no-untyped-call]
    rows.append(
        Check("local", "cudnn", PASS, f"cuDNN {cudnn}")
        if cudnn
        else Check("local", "cudnn", WARN, "cuDNN not available: convolutions run slower", "install a torch build with cuDNN")
    )
    try:
        import torch.distributed as dist

        nccl = dist.is_available() and dist.is_nccl_available()
        version = ".".join(map(str, torch.cuda.nccl.version())) if nccl else None  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001
        nccl, version = False, None
    rows.append(
        Check("local", "nccl", PASS, f"NCCL {version}")
        if nccl
        else Check("local", "nccl", WARN, "NCCL not available: multi-GPU DDP falls back to gloo", "install a torch build with NCCL (Linux CUDA wheels have it)")
    )
    return rows


def nvml_checks() -> list[Check]:
    """NVML, the driver version and the GPU count, through the same source `monitor` uses."""
    from gputui.sources.nvml import NvmlSource

    source = NvmlSource()
    try:
        snap = source.poll()[0]
    finally:
        source.close()
    if snap.state == HostState.NO_DRIVER:
        return [Check("local", "nvml", WARN, f"{snap.message or 'no NVIDIA driver'}: no GPU to watch here",
                      "on a GPU machine, install the NVIDIA driver (nvidia-smi should work)")]
    if snap.state != HostState.OK:
        fix = "python3 -m pip install nvidia-ml-py" if "not installed" in (snap.message or "") else "check the driver with nvidia-smi"
        return [Check("local", "nvml", FAIL, snap.message or "NVML failed", fix)]
    rows = [Check("local", "nvml", PASS, f"NVML ok, driver {snap.driver or 'n/a'}")]
    names = sorted({g.name or "n/a" for g in snap.gpus})
    if snap.gpus:
        rows.append(Check("local", "gpus", PASS, f"{plural(len(snap.gpus), 'GPU')}: {', '.join(names)}"))
    else:
        rows.append(Check("local", "gpus", WARN, "the driver sees no GPU", "check that the GPU is seated and powered (nvidia-smi -L)"))
    return rows


def storage_check(home: Path | None = None) -> Check:
    """Where runs, checkpoints, the ledger and sweeps are kept (GPUTUI_HOME, else the user data
    directory): this account can write there, and there is room (a shared server's full home
    or quota fails a run at its next checkpoint). Nothing is created."""
    from gputui.model.paths import data_home

    home = data_home() if home is None else home
    where = home
    while not where.exists() and where != where.parent:  # not made yet: its nearest parent that is
        where = where.parent
    fix_place = "or set GPUTUI_HOME to a directory of yours with room"
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        return Check("local", "storage", FAIL, f"{home}: {exc.strerror or exc}", f"check the path, {fix_place}")
    what = "it" if where == home else f"{where}, where it would be made,"
    if _read_only(where):
        return Check("local", "storage", FAIL, f"{home}: {what} is on a read-only file system", f"set GPUTUI_HOME "
                     "to a directory of yours with room")
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        return Check("local", "storage", FAIL, f"{home}: {what} cannot be written by this account",
                     f"fix its permissions, {fix_place}")
    free = f"{home}: {size(usage.free)} free"
    if usage.free < LOW_SPACE:
        return Check("local", "storage", WARN, f"{free}: runs keep checkpoints and logs there",
                     f"free space there, {fix_place}")
    return Check("local", "storage", PASS, free)


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & getattr(os, "ST_RDONLY", 0))
    except (OSError, AttributeError):
        return False


def local_checks() -> list[Check]:
    return [python_check(), storage_check(), *no_gpu(torch_checks() + nvml_checks())]


def no_gpu(rows: list[Check]) -> list[Check]:
    """A machine with neither CUDA nor an NVIDIA driver is one finding (training runs on the
    CPU), not one warning per missing piece."""
    cuda = next((r for r in rows if r.name == "cuda"), None)
    nvml = next((r for r in rows if r.name == "nvml"), None)
    if cuda is None or nvml is None or cuda.status != WARN or nvml.status != WARN or len(rows) != 3:
        return rows
    torch_row = next(r for r in rows if r.name == "torch")
    return [torch_row, Check("local", "gpu", WARN, "no GPU here (no CUDA, no NVIDIA driver): training runs on the CPU",
                             "on a GPU machine: install the NVIDIA driver, then GPUTUI_TORCH=torch sh scripts/setup.sh")]


def _connection_checks(name: str, failure: Any, bastion_failed: bool = False) -> list[Check]:
    """Reachable / host key / login rows for a host that did not get as far as nvidia-smi."""
    reason, fix = clean(failure.reason or ""), clean(failure.fix or "")
    if bastion_failed:  # the host itself was never asked: only the bastion's row
        return [Check(name, "bastion", FAIL, reason, fix or "check the bastion's address, port, key and host key")]
    if failure.state in (HostState.UNREACHABLE, HostState.CONNECTING):
        return [Check(name, "reachable", FAIL, reason, fix or "check the address, the port and that sshd runs there")]
    rows = [Check(name, "reachable", PASS, "the SSH server answers")]
    if failure.state in (HostState.HOST_KEY_UNKNOWN, HostState.HOST_KEY_MISMATCH):
        rows.append(Check(name, "host key", FAIL, reason, fix))
    elif failure.state == HostState.AUTH_FAILED:
        rows.append(Check(name, "host key", PASS, "known"))
        rows.append(Check(name, "login", FAIL, reason, fix))
    else:
        rows.append(Check(name, "ssh", FAIL, reason, fix or "see the reason"))
    return rows


def remote_checks(spec: HostSpec, options: Any) -> list[Check]:
    """Connect to one host and check it end to end."""
    from gputui.sources.ssh import SshHost

    host = SshHost(spec, options)
    name = spec.name
    try:
        snap = host.poll_now()
        message = clean(snap.message or "")
        if host.failure is not None:
            return _connection_checks(name, host.failure, host.bastion_failed)
        route = host.target.route()
        rows = [Check(name, "bastion" if host.target.via else "proxy command", PASS, f"reached{route}")] if route else []
        rows += [Check(name, "reachable", PASS, f"{host.target.label()} answers"), Check(name, "host key", PASS, "known")]
        if snap.state == HostState.OK:
            rows.append(Check(name, "nvidia-smi", PASS, f"driver {snap.driver or 'n/a'}"))
            rows.append(
                Check(name, "gpus", PASS, f"{plural(len(snap.gpus), 'GPU')}: {', '.join(sorted({g.name or 'n/a' for g in snap.gpus}))}")
                if snap.gpus
                else Check(name, "gpus", WARN, "nvidia-smi sees no GPU", "check the GPUs there with nvidia-smi -L")
            )
        elif snap.state == HostState.NO_NVIDIA_SMI:
            rows.append(Check(name, "nvidia-smi", FAIL, message, f"install the NVIDIA driver on {name} (it brings nvidia-smi)"))
        else:
            rows.append(Check(name, "nvidia-smi", FAIL, message, f"run nvidia-smi on {name} and fix what it says"))
        rows.extend(_python_checks(host, name))
        return rows
    finally:
        host.close()


def _python_checks(host: Any, name: str) -> list[Check]:
    command = "sh -c " + shlex.quote('command -v python3 >/dev/null 2>&1 || exit 127; exec python3 -c "$0"') + " " + shlex.quote(_REMOTE_PROBE)
    try:
        code, out, _ = host.run(command, timeout=REMOTE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        return [Check(name, "python", FAIL, f"could not run python3: {type(exc).__name__}", "check the connection")]
    if code == 127:
        return [Check(name, "python", FAIL, "python3 not found", f"install Python {'.'.join(map(str, MIN_PYTHON))}+ on {name}")]
    words = [clean(line).split() for line in out.splitlines()]  # what the remote python3 printed is data
    lines = {w[0]: w[1:] for w in words if w}
    rows = []
    version = (lines.get("python") or ["n/a"])[0]
    rows.append(Check(name, "python", PASS if _version_ok(version) else FAIL, f"Python {version}", "" if _version_ok(version) else f"install Python 3.10+ on {name}"))
    if "torch" in lines:
        torch_version, device, count = (lines["torch"] + ["", "", ""])[:3]
        detail = f"torch {torch_version}, " + (f"CUDA, {plural(int(count), 'GPU') if count.isdigit() else 'n/a GPUs'}" if device == "cuda" else "no CUDA")
        rows.append(Check(name, "torch", PASS if device == "cuda" else WARN, detail, "" if device == "cuda" else f"install the CUDA build of torch on {name}"))
    else:
        rows.append(Check(name, "torch", WARN, "torch not installed", f"python3 -m pip install torch on {name}"))
    return rows


def _version_ok(version: str) -> bool:
    try:
        return tuple(int(p) for p in version.split(".")[:2]) >= MIN_PYTHON
    except ValueError:
        return False


def all_remote_checks(specs: Sequence[HostSpec], options: Any) -> list[Check]:
    """Every host checked concurrently; rows in host order."""
    results: list[list[Check]] = [[] for _ in specs]

    def work(i: int, spec: HostSpec) -> None:
        results[i] = remote_checks(spec, options)

    threads = [threading.Thread(target=work, args=(i, s), name=f"gputui-doctor-{s.name}", daemon=True) for i, s in enumerate(specs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [row for rows in results for row in rows]
