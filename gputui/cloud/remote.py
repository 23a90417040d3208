"""Reaching the slaves from the master: ask every run on them to checkpoint, over SSH.

The OpenSSH client is used the way the cluster manager's paramiko connections are: the
private half of `[cloud] public_key` as the only identity, and the host key checked
against ~/.ssh/known_hosts and gputui's own known-hosts file (where the cluster manager
records the slaves' keys), strictly: an unknown or changed key is refused, never accepted.
A slave behind a bastion is reached with `-J` (the `proxy_jump` given, else ~/.ssh/config's
ProxyJump or ProxyCommand). The host-key policy goes into a small `-F` config that includes
the user's own, because OpenSSH hands `-F` (not `-o`) to the ssh it runs for each jump: a
bastion's key is checked exactly as the slave's.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gputui.cloud.budget import Checkpointer
from gputui.cloud.settings import DEFAULT_REMOTE_DIR
from gputui.model.errors import GputuiError
from gputui.model.cloud import InstanceRecord

if TYPE_CHECKING:
    from gputui.cloud.settings import CloudSettings

def remote_checkpoint(remote_dir: str = DEFAULT_REMOTE_DIR) -> str:
    """The shell the guard runs on a slave: `--checkpoint-all` in every gputui home runs register in.

    Cluster nodes and sweep workers run with GPUTUI_HOME=<remote_dir>/home (Bootstrapped.home),
    where their spot watcher registers them: each such home (`remote_dir`'s, and the default
    one's when they differ) is asked with its venv's python (else the first python3 with gputui).
    Then the login's own data home, where a watcher started by hand on a slave set up by hand
    registers (unless that is one of the homes asked: a run is asked once). Exit 3 when no gputui
    is found at all; else the last failure's status, or 0."""
    from gputui.cluster.sshnode import quote_path

    bases = list(dict.fromkeys(d.rstrip("/") or "/" for d in (remote_dir, DEFAULT_REMOTE_DIR)))
    words = " ".join(quote_path(d) for d in bases)
    pythons = " ".join(f"{quote_path(d)}/venv/bin/python" for d in bases) + " python3"
    return (
        "rc=3; asked=; gputui_py() { for py in " + pythons + "; do "
        "if \"$py\" -c 'import gputui' 2>/dev/null; then echo \"$py\"; return 0; fi; done; return 1; }; "
        "ask() { \"$@\" -m gputui.cloud.watcher --checkpoint-all; r=$?; if [ $r -ne 0 ]; then rc=$r; "
        "elif [ $rc -eq 3 ]; then rc=0; fi; }; "
        "for base in " + words + "; do [ -d \"$base/home\" ] || continue; py=\"$base/venv/bin/python\"; "
        "[ -x \"$py\" ] || py=$(gputui_py) || continue; asked=\"$asked|$base/home|\"; "
        "ask env GPUTUI_HOME=\"$base/home\" \"$py\"; done; "
        "case \"$asked\" in *\"|${GPUTUI_HOME:--}|\"*) ;; *) if py=$(gputui_py); then ask \"$py\"; fi ;; esac; "
        "[ $rc -ne 3 ] || echo 'gputui is not installed on this slave' >&2; exit $rc"
    )


# the command for [cluster] remote_dir's default
REMOTE_CHECKPOINT = remote_checkpoint()


def private_key(settings: "CloudSettings") -> Path | None:
    """The private half of `[cloud] public_key` when it exists (the key the cluster manager uses)."""
    public = settings.public_key_path()
    private = public.with_suffix("") if public.suffix == ".pub" else None
    return private if private is not None and private.is_file() else None


def known_hosts_files() -> list[Path]:
    """The files a slave's host key must be in: ~/.ssh/known_hosts and gputui's own (hostkeys.SshOptions)."""
    from gputui.sources.hostkeys import SshOptions

    return SshOptions().all_known_hosts()


def _ssh_word(path: Path) -> str:
    """A path as ssh_config reads it: '%' is a token there, whitespace separates files."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def policy_config(known_hosts: Sequence[Path] | None = None, identity: Path | None = None) -> str:
    """The `-F` file's text: strict host keys for every hop (slave and bastions), then the user's config."""
    files = list(known_hosts) if known_hosts is not None else known_hosts_files()
    lines = ["# gputui's budget guard: the same host-key policy for the slave and every bastion on the way",
             "BatchMode yes", "ConnectTimeout 5", "StrictHostKeyChecking yes",
             "UserKnownHostsFile " + " ".join(_ssh_word(f) for f in files)]
    if identity is not None:  # a bastion tries it after its own IdentityFile (the slave: only it, see -o below)
        lines.append("IdentityFile " + _ssh_word(identity))
    lines += ["Include ~/.ssh/config", "Include /etc/ssh/ssh_config"]
    return "\n".join(lines) + "\n"


def _check_jump(proxy_jump: str) -> str:
    from gputui.config.hosts import parse_proxy_jump

    try:
        parse_proxy_jump(proxy_jump)
    except ValueError as exc:
        raise GputuiError(f"proxy_jump {proxy_jump!r}: {exc}; expected [user@]host[:port], comma-separated for a chain") from None
    return proxy_jump.strip()


def ssh_command(ssh_user: str, address: str, identity: Path | None = None, port: int = 22,
                known_hosts: Sequence[Path] | None = None, ssh: str | None = None,
                proxy_jump: str | None = None, config: Path | None = None,
                remote_dir: str = DEFAULT_REMOTE_DIR) -> list[str]:
    """The ssh invocation that SIGTERMs every watched run on one slave (`GPUTUI_SSH` picks the client).

    `config`: a file holding `policy_config()` (what the jump hosts are checked with); `proxy_jump`:
    OpenSSH's ProxyJump ("user@bastion:port", comma-separated for a chain); `remote_dir`: [cluster]
    remote_dir, whose home/ the slave's nodes and sweep workers register in."""
    files = list(known_hosts) if known_hosts is not None else known_hosts_files()
    command = [ssh or os.environ.get("GPUTUI_SSH", "ssh")]
    if config is not None:
        command += ["-F", str(config)]
    command += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + " ".join(_ssh_word(f) for f in files)]
    if identity is not None:  # as an option, not -i: ssh checks -i's file before expanding its '%' tokens
        command += ["-o", "IdentityFile=" + _ssh_word(identity), "-o", "IdentitiesOnly=yes"]
    if port != 22:
        command += ["-p", str(port)]
    if proxy_jump:
        command += ["-J", _check_jump(proxy_jump)]
    # -l USER -- HOST: neither can be read as an ssh option, whatever the profile says
    return command + ["-l", ssh_user, "--", address, remote_checkpoint(remote_dir)]


_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./\-]+$")


def _config_file(text: str) -> Path:
    """A private temporary file holding `text`, under a path that is one shell word without '%'
    (OpenSSH pastes `-F`'s path into each jump's command line unquoted)."""
    folder = tempfile.gettempdir()
    fd, name = tempfile.mkstemp(prefix="gputui-ssh-", suffix=".conf", dir=folder if _SHELL_SAFE.match(folder) else "/tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return Path(name)


def _bastion_reason(text: str, proxy_jump: str) -> str | None:
    """ssh's words when a jump host, not the slave, failed: "via bastion X: ..."; else None."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = re.search(r"connect to host (\S+) port (\d+): (.+)", ln)
        if m:
            return f"via bastion {m.group(1)}:{m.group(2)}: unreachable ({m.group(3)})"
        m = re.search(r"Could not resolve hostname (\S+?):", ln)
        if m:
            return f"via bastion {m.group(1)}: unreachable (unknown host name)"
    bastion_log = [ln for ln in lines if "stdio forwarding failed" in ln or "channel 0: open failed" in ln]
    if bastion_log:
        return f"the slave cannot be reached from bastion {proxy_jump} ({bastion_log[-1][-160:]})"
    return None


def _reason(stderr: str, ssh_user: str, address: str, port: int, identity: Path | None,
            proxy_jump: str | None = None) -> str:
    """ssh's failure as one line, with what to do about it."""
    text = stderr.strip()
    name = address if port == 22 else f"[{address}]:{port}"
    if proxy_jump:
        said = _bastion_reason(text, proxy_jump)
        if said is not None:
            return said
        closed = "Connection closed by UNKNOWN" in text or "kex_exchange_identification" in text
        if closed and "Host key verification failed" in text:
            return (f"via bastion {proxy_jump}: its host key is unknown or has changed: refused (strict checking); "
                    "if it is the bastion's key, add it to ~/.ssh/known_hosts (ssh-keyscan -p PORT BASTION)")
        if closed:
            last = [ln for ln in text.splitlines() if ln.strip() and "UNKNOWN" not in ln and "kex_exchange" not in ln]
            return f"via bastion {proxy_jump}: {(last or ['closed the connection'])[-1].strip()[-200:]}"
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        from gputui.sources.hostkeys import SshOptions

        keyscan = f"ssh-keyscan {'' if port == 22 else f'-p {port} '}{address} >> {SshOptions().gputui_known_hosts_path()}"
        return (f"host key of {name} is unknown or has changed: refused (strict checking); if it is the slave's key, "
                f"trust it with `{keyscan}`")
    if "Permission denied" in text:
        key = identity if identity is not None else "ssh's default keys (no private key next to [cloud] public_key)"
        return f"authentication failed for {ssh_user}@{name} (key {key})"
    return text.splitlines()[-1][-200:] if text else "no message"


def ssh_checkpointer(ssh_user: str, timeout_s: float = 20.0, identity: Path | None = None, port: int = 22,
                     known_hosts: Sequence[Path] | None = None, proxy_jump: str | None = None,
                     remote_dir: str = DEFAULT_REMOTE_DIR) -> Checkpointer:
    """A Checkpointer that reaches all slaves in parallel; raises once if any did not answer.

    `port`: slaves listen on 22; the tests point it at a loopback sshd. `proxy_jump`: the
    bastion(s) in front of them (default: ~/.ssh/config's ProxyJump, if any). `remote_dir`:
    [cluster] remote_dir (the runs register in its home/).
    """
    if proxy_jump:
        _check_jump(proxy_jump)

    def one(record: InstanceRecord) -> str | None:
        if not record.address:
            return f"{record.instance_id}: no address"
        try:
            config = _config_file(policy_config(known_hosts, identity))
        except OSError as exc:
            return f"{record.instance_id}: cannot write a temporary ssh config: {exc}"
        try:
            command = ssh_command(ssh_user, record.address, identity, port, known_hosts, proxy_jump=proxy_jump,
                                  config=config, remote_dir=remote_dir)
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{record.instance_id}: {exc}"
        finally:
            config.unlink(missing_ok=True)
        if done.returncode != 0:
            why = _reason(done.stderr, ssh_user, record.address, port, identity, proxy_jump)
            return f"{record.instance_id}: ssh exit {done.returncode}: {why}"
        return None

    def checkpoint(records: Sequence[InstanceRecord]) -> None:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(records)))) as pool:
            problems = [p for p in pool.map(one, records) if p]
        if problems:
            raise GputuiError("; ".join(problems))

    return checkpoint


def cloud_checkpointer(settings: "CloudSettings", timeout_s: float = 20.0, port: int = 22) -> Checkpointer:
    """The Checkpointer for a `[cloud]` table's slaves: its ssh_user, the private half of its public_key,
    its proxy_jump (when [cloud] has one) and the profile's [cluster] remote_dir."""
    return ssh_checkpointer(settings.ssh_user, timeout_s, private_key(settings), port,
                            proxy_jump=getattr(settings, "proxy_jump", None),
                            remote_dir=getattr(settings, "remote_dir", DEFAULT_REMOTE_DIR))
