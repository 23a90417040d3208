"""The command a remote poll runs, and a pure parser of what it prints.

One `sh` script per poll prints, between `@@` markers: /proc/stat's cpu line before and
after, /proc/meminfo's totals, `nvidia-smi --query-gpu=...` and `--query-compute-apps=...`
in CSV (no header, no units) with their exit codes, and `ps` rows (pid, user, CPU %, RSS,
elapsed seconds, command; `@@ps2`) for the compute processes the master does not already
know (see poll_request), or (pid, user, command;
`@@ps`) where that `ps` lacks those columns. Everything is parsed here without I/O, so
drivers' quirks
(`[N/A]`, `[Not Supported]`, missing columns, odd spacing, fields an old driver rejects)
are unit-tested.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from gputui.model.telemetry import GpuProcess, GpuSample, HostState, throttle_codes
from gputui.model.text import clean
from gputui.sources.host import CpuTimes, parse_meminfo, parse_proc_stat_line

# nvidia-smi --query-gpu field -> GpuSample attribute ("driver_version" goes to the host).
GPU_FIELDS: dict[str, str] = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "utilization.gpu": "util_pct",
    "utilization.memory": "mem_util_pct",
    "memory.used": "mem_used_mib",
    "memory.total": "mem_total_mib",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_w",
    "power.limit": "power_limit_w",
    "fan.speed": "fan_pct",
    "clocks.sm": "clock_sm_mhz",
    "clocks.mem": "clock_mem_mhz",
    "pstate": "pstate",
    "ecc.errors.corrected.volatile.total": "ecc_corrected",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected",
    "clocks_event_reasons.active": "throttle",  # a hex bit mask (R535 and later)
    "driver_version": "driver",
}
# A field a driver rejects -> the older name of the same field, asked for instead (once).
OLDER_FIELD_NAMES: dict[str, str] = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
FIELD_ATTRS: dict[str, str] = {**GPU_FIELDS, **{old: GPU_FIELDS[new] for new, old in OLDER_FIELD_NAMES.items()}}
REQUIRED_GPU_FIELDS = ("index",)
APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_memory")
_TEXT_ATTRS = {"name", "uuid", "pstate", "driver"}
_INT_ATTRS = {"index", "ecc_corrected", "ecc_uncorrected"}

# Values nvidia-smi prints for a metric it cannot give.
_MISSING = re.compile(r"^\[?\s*(n/?a|not supported|unknown error|unknown|gpu requires reset|insufficient permissions|gpu is lost|no data)\s*\]?$", re.I)
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?")
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query', re.I)

MAX_COMMAND_CHARS = 200


def retry_fields(gpu_fields: tuple[str, ...], rejected: tuple[str, ...]) -> tuple[str, ...]:
    """The fields to ask next time: each rejected one dropped for good, or replaced by its
    older name where it has one (`index` is never dropped)."""
    out = []
    for name in gpu_fields:
        if name in rejected and name not in REQUIRED_GPU_FIELDS:
            older = OLDER_FIELD_NAMES.get(name)
            if older is not None and older not in gpu_fields:
                out.append(older)
            continue
        out.append(name)
    return tuple(out)


# The poll as a shell function (one definition for both ways of running it): $1 is the
# --query-gpu field list; $2, if set, seconds to wait before the last /proc/stat reading (while
# the master has no CPU % of the host yet, one poll's own span must be long enough to tell one). The compute processes' pids are picked out with shell builtins only
# (no sed, tr or pipeline), so a poll starts nvidia-smi twice and `ps` once, nothing else. It
# writes in few pieces (few SSH packets for the master to take apart), but writes right after the
# first nvidia-smi: if the channel is gone by then, the shell dies of SIGPIPE there and buffers
# nothing more (the compute-apps answer is kept in the shell until it is printed).
_POLL_FUNCTION = r"""export LC_ALL=C
gputui_poll() {
read -r l < /proc/stat
o="@@gputui 1
@@stat0 $l
@@meminfo"
while read -r k v _; do case $k in MemTotal:|MemAvailable:|MemFree:) o="$o
$k $v kB";; esac; done < /proc/meminfo
if ! command -v nvidia-smi >/dev/null 2>&1; then sleep 0.2 2>/dev/null || sleep 1
  read -r l < /proc/stat; printf '%s\n@@stat1 %s\n@@missing nvidia-smi\n%s\n' "$o" "$l" "$3"; return 0; fi
printf '%s\n@@gpu\n' "$o"
nvidia-smi --query-gpu="$1" --format=csv,noheader,nounits 2>&1; printf '\n@@rc %s\n' $?
a=$(nvidia-smi --query-compute-apps=APPS --format=csv,noheader,nounits 2>&1); r=$?
p=
case $a in *[0-9]*) while IFS=', ' read -r _ i _; do case $i in ''|*[!0-9]*) ;; *) case ,$4, in *,$i,*) ;; *) p=$p$i,;; esac;; esac; done <<GPUTUI_EOF
$a
GPUTUI_EOF
esac
s=
[ -n "$p" ] && { s=$(ps -o pid=,user:32=,pcpu=,rss=,etimes=,args= -p "${p%,}" 2>/dev/null) ||
  s="@@ps
$(ps -o pid=,user=,args= -p "${p%,}" 2>/dev/null)"; }
case $2 in ''|0) ;; *) sleep "$2";; esac
read -r l < /proc/stat
printf '@@apps\n%s\n@@rc %s\n@@ps2\n%s\n@@stat1 %s\n%s\n' "$a" $r "$s" "$l" "$3"
}
""".replace("APPS", ",".join(APP_FIELDS))
_FIELD_LIST = re.compile(r"^[A-Za-z0-9_.]+(,[A-Za-z0-9_.]+)*$")


def _query(gpu_fields: tuple[str, ...]) -> str:
    query = ",".join(gpu_fields)
    if not _FIELD_LIST.match(query):  # our own tables only; never text from elsewhere
        raise ValueError(f"not a --query-gpu field list: {query!r}")
    return query


def remote_script(gpu_fields: tuple[str, ...]) -> str:
    """The POSIX sh script one poll runs on a remote host (one command per poll)."""
    return _POLL_FUNCTION + f"gputui_poll {shlex.quote(_query(gpu_fields))} '' @@end\n"


def remote_command(gpu_fields: tuple[str, ...]) -> str:
    """The script wrapped for whatever login shell the remote user has (bash, zsh, fish...)."""
    return "sh -c " + shlex.quote(remote_script(gpu_fields))


# The long-lived form: one `sh` per host that answers a request line `TOKEN FIELDS [WAIT [KNOWN]]`
# with the same report followed by `@@end TOKEN`, until its stdin closes. KNOWN lists the pids
# whose `ps` row the master already holds (comma-separated): `ps` runs only for the others, and
# not at all when there are none (on a loopback host `ps` is two thirds of a poll's processes'
# CPU). A request that is not a token and a field list gets `@@bad` and no poll. The poll's
# commands read /dev/null, not the requests.
_LOOP = r"""while read -r t q w k; do
case $t$q$w$k in *[!A-Za-z0-9_.,]*|'') printf '@@gputui 1\n@@bad request\n@@end %s\n' "$t";;
*) gputui_poll "$q" "$w" "@@end $t" "$k" </dev/null;; esac
done
"""


def remote_loop_command() -> str:
    """The command of a host's long-lived poll channel (see poll_request)."""
    return "sh -c " + shlex.quote(_POLL_FUNCTION + _LOOP)


MAX_KNOWN_PIDS = 64  # pids a request says it knows (the others are looked up again: a bounded line)


def poll_request(token: int, gpu_fields: tuple[str, ...], wait_s: float = 0.0, known: tuple[int, ...] = ()) -> bytes:
    """One request to the long-lived poll channel; the answer ends with end_marker(token).
    With `wait_s`, the poll waits that long before its last /proc/stat reading; the `ps` rows of
    the `known` pids are not asked for (at most MAX_KNOWN_PIDS of them are named)."""
    wait = f" {wait_s:.3f}" if wait_s > 0 else ""
    pids = ",".join(str(int(pid)) for pid in known[:MAX_KNOWN_PIDS] if int(pid) > 0)
    if pids:
        wait = (wait or " 0") + " " + pids
    return f"{token:d} {_query(gpu_fields)}{wait}\n".encode()


def end_marker(token: int) -> bytes:
    """The line that ends the answer to request `token` (with the newline before it)."""
    return f"\n@@end {token:d}\n".encode()


def parse_value(text: str) -> str | None:
    """A CSV cell: stripped of control characters and blanks, with "[N/A]", "[Not Supported]"
    and the like mapped to None."""
    text = clean(text.strip()).strip()
    if not text or _MISSING.match(text):
        return None
    return text


def parse_number(text: str | None) -> float | None:
    """A number from a cell, ignoring a unit left after it ("45 %", "250.00 W")."""
    if text is None:
        return None
    m = _NUMBER.match(text.strip())
    return float(m.group(0)) if m else None


def split_row(line: str, n_fields: int, wide: int | None = None) -> list[str | None]:
    """Split a CSV row into exactly `n_fields` cells: missing ones are None; extra commas
    belong to the cell at index `wide` (a name that contains a comma)."""
    cells = [c for c in line.split(",")]
    if len(cells) > n_fields and wide is not None:
        extra = len(cells) - n_fields
        cells = cells[:wide] + [",".join(cells[wide : wide + extra + 1])] + cells[wide + extra + 1 :]
    values = [parse_value(c) for c in cells[:n_fields]]
    return values + [None] * (n_fields - len(values))


def parse_gpu_rows(text: str, gpu_fields: tuple[str, ...]) -> tuple[list[GpuSample], str | None]:
    """GPUs from `--query-gpu` CSV output, and the driver version if it was asked for."""
    attrs = [FIELD_ATTRS.get(f, "") for f in gpu_fields]
    wide = attrs.index("name") if "name" in attrs else None
    gpus: list[GpuSample] = []
    driver = None
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = split_row(line, len(gpu_fields), wide)
        values: dict[str, Any] = {}
        for attr, cell in zip(attrs, cells):
            if not attr:
                continue
            if attr in _TEXT_ATTRS:
                values[attr] = cell
            elif attr == "throttle":
                values[attr] = parse_reasons(cell)
            else:
                number = parse_number(cell)
                values[attr] = None if number is None else (int(number) if attr in _INT_ATTRS else number)
        driver = values.pop("driver", None) or driver
        if values.get("index") is None:
            values["index"] = len(gpus)
        gpus.append(GpuSample(**values))
    return gpus, driver


def parse_apps(text: str) -> list[tuple[str | None, GpuProcess]]:
    """(GPU uuid, process) pairs from `--query-compute-apps` CSV output."""
    out: list[tuple[str | None, GpuProcess]] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().lower().startswith("no running"):
            continue
        uuid, pid, name, memory = split_row(line, len(APP_FIELDS), wide=2)
        pid_number = parse_number(pid)
        if pid_number is None:
            continue
        out.append((uuid, GpuProcess(pid=int(pid_number), name=name, gpu_memory_mib=parse_number(memory))))
    return out


def parse_reasons(cell: str | None) -> tuple[str, ...] | None:
    """Throttle reason codes from `clocks_event_reasons.active` ("0x0000000000000004")."""
    if cell is None:
        return None
    try:
        return throttle_codes(int(cell, 16))
    except ValueError:
        return None


def parse_ps(text: str) -> dict[int, tuple[str, str | None]]:
    """pid -> (user, command) from `ps -o pid=,user=,args=` rows."""
    out: dict[int, tuple[str, str | None]] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit():
            command = clean(parts[2], MAX_COMMAND_CHARS).strip() if len(parts) > 2 else None
            out[int(parts[0])] = (clean(parts[1]), command or None)
    return out


@dataclass(frozen=True)
class PsRow:
    """What the remote `ps` says of one process."""

    user: str | None
    command: str | None
    cpu_pct: float | None = None  # ps's %CPU: CPU time over the time since it started
    rss_mib: float | None = None
    running_s: float | None = None


def parse_ps_full(text: str) -> dict[int, PsRow]:
    """pid -> PsRow from `ps -o pid=,user:32=,pcpu=,rss=,etimes=,args=` rows."""
    out: dict[int, PsRow] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        cpu, rss, age = parse_number(parts[2]), parse_number(parts[3]), parse_number(parts[4])
        command = clean(parts[5], MAX_COMMAND_CHARS).strip() if len(parts) > 5 else None
        out[int(parts[0])] = PsRow(clean(parts[1]), command or None, cpu, None if rss is None else rss / 1024.0, age)
    return out


def _ps_rows(bodies: dict[str, str]) -> dict[int, PsRow]:
    """The ps answer in whichever form this host's ps could give."""
    rows = parse_ps_full(bodies.get("ps2", ""))
    for pid, (user, command) in parse_ps(bodies.get("ps", "")).items():
        rows.setdefault(pid, PsRow(user, command))
    return rows


@dataclass(frozen=True)
class RemoteReading:
    """What one remote poll found."""

    state: HostState
    message: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    driver: str | None = None
    cpu_before: CpuTimes | None = None
    cpu_after: CpuTimes | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    invalid_fields: tuple[str, ...] = field(default=())  # --query-gpu fields this driver rejects
    ps: dict[int, PsRow] = field(default_factory=dict)  # the `ps` rows this poll read (not the known ones)


def _sections(text: str) -> tuple[dict[str, str], dict[str, int], dict[str, str]]:
    """Marker name -> body, marker name -> exit code, and one-line markers (`@@stat0 ...`)."""
    bodies: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    inline: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            name, _, rest = line[2:].partition(" ")
            if name == "rc" and current is not None:
                codes[current] = int(rest) if rest.strip().lstrip("-").isdigit() else -1
            elif rest:
                inline[name] = rest
            else:
                current = name
                bodies.setdefault(name, [])
            continue
        if current is not None:
            bodies[current].append(line)
    return {k: "\n".join(v) for k, v in bodies.items()}, codes, inline


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = clean(line, 200).strip()
        if line:
            return line
    return "no output"


def _smi_failure(body: str, code: int) -> tuple[HostState, str] | None:
    """The state a failed nvidia-smi run means, or None if its output is data."""
    lowered = body.lower()
    if "no devices were found" in lowered:
        return None
    if "couldn't communicate with the nvidia driver" in lowered or "driver not loaded" in lowered:
        return HostState.NO_DRIVER, "no NVIDIA driver (nvidia-smi cannot talk to it)"
    if code != 0:
        return HostState.ERROR, f"nvidia-smi failed (exit {code}): {_first_line(body)}"
    return None


def parse_report(text: str, gpu_fields: tuple[str, ...], known: dict[int, PsRow] | None = None) -> RemoteReading:
    """Parse everything the remote script printed; `known`: the `ps` rows of the pids the
    request said it knew (a row read by this poll wins)."""
    bodies, codes, inline = _sections(text)
    used, total = parse_meminfo(bodies.get("meminfo", ""))
    base = RemoteReading(
        HostState.OK,
        cpu_before=parse_proc_stat_line("cpu " + inline["stat0"].split(None, 1)[-1]) if "stat0" in inline else None,
        cpu_after=parse_proc_stat_line("cpu " + inline["stat1"].split(None, 1)[-1]) if "stat1" in inline else None,
        mem_used_mib=used,
        mem_total_mib=total,
    )
    if "gputui" not in inline:
        return replace(base, state=HostState.ERROR, message=f"unexpected answer: {_first_line(text)}")
    if inline.get("missing") == "nvidia-smi":
        return replace(base, state=HostState.NO_NVIDIA_SMI, message="nvidia-smi not found on the PATH (no NVIDIA driver installed?)")
    if "gpu" not in bodies:
        return replace(base, state=HostState.ERROR, message="the poll was cut short (no nvidia-smi output)")
    gpu_body, gpu_code = bodies["gpu"], codes.get("gpu", -1)
    invalid = tuple(clean(f) for f in _INVALID_FIELD.findall(gpu_body))
    if invalid:
        message = f"nvidia-smi rejects {'field' if len(invalid) == 1 else 'fields'} {', '.join(invalid)}"
        return replace(base, state=HostState.ERROR, message=message, invalid_fields=invalid)
    failure = _smi_failure(gpu_body, gpu_code)
    if failure is not None:
        return replace(base, state=failure[0], message=failure[1])
    if "no devices were found" in gpu_body.lower():
        return replace(base, message="no GPU")
    gpus, driver = parse_gpu_rows(gpu_body, gpu_fields)
    apps_body = bodies.get("apps", "")
    read: dict[int, PsRow] = {}
    if codes.get("apps", 0) == 0 and not _INVALID_FIELD.search(apps_body):
        read = _ps_rows(bodies)
        gpus = _attach_processes(gpus, parse_apps(apps_body), {**(known or {}), **read})
    return replace(base, message=None if gpus else "no GPU", gpus=tuple(gpus), driver=driver, ps=read)


def _attach_processes(
    gpus: list[GpuSample], apps: list[tuple[str | None, GpuProcess]], ps: dict[int, PsRow]
) -> list[GpuSample]:
    by_uuid: dict[str | None, list[GpuProcess]] = {}
    for uuid, proc in apps:
        row = ps.get(proc.pid, PsRow(None, None))
        by_uuid.setdefault(uuid, []).append(replace(proc, user=row.user, name=row.command or proc.name, cpu_pct=row.cpu_pct,
                                                    rss_mib=row.rss_mib, running_s=row.running_s))
    if len(gpus) == 1 and None in by_uuid:  # a driver that gave no uuid: one GPU is unambiguous
        by_uuid.setdefault(gpus[0].uuid, []).extend(by_uuid.pop(None))
    return [replace(g, processes=tuple(by_uuid.get(g.uuid, ()))) if g.uuid in by_uuid else g for g in gpus]
