"""Remote GPU hosts ("slaves") reached over SSH: the `[[hosts]]` profile tables and `--host`.

```toml
[[hosts]]
name = "rig1"                 # shown in tables (default: the address)
address = "10.0.0.5"          # or a Host alias from ~/.ssh/config
user = "gpu"
identity_file = "~/.ssh/id_ed25519"
proxy_jump = "me@bastion.example.org:22"   # optional: reach it through a jump host (a chain: "a,b")
```

Host keys are checked against ~/.ssh/known_hosts and gputui's own known-hosts file;
an unknown key is refused unless `trust_on_first_use = true` (or --trust-on-first-use).
A bastion's key is checked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from gputui.errors import UserError
from gputui.schema import Field, Section

if TYPE_CHECKING:
    from gputui.profiles import Profile

_NAME = re.compile(r"^[A-Za-z0-9_.:@\[\]\-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:\-%]+$")
USER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-$]{0,63}$")  # never starts with "-"
# Jump hops also end up in a shell command (OpenSSH's -J runs `ssh -l USER ... HOST`): no shell
# metacharacters, and neither part may start with "-".
_JUMP_HOP = re.compile(r"^(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,63})@)?"
                       r"(?:\[(?P<v6>[0-9A-Fa-f:.%]+)\]|(?P<addr>[A-Za-z0-9_.%][A-Za-z0-9_.\-%]*))(?::(?P<port>\d{1,5}))?$")
_HOST_ARG = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%]+)\]|(?P<addr>[^:@\s\[\]]+))(?::(?P<port>\d{1,5}))?$")


def _check(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: str) -> str | None:
        return None if pattern.match(value) else what

    return check


@dataclass(frozen=True)
class Hop:
    """One jump host of a ProxyJump chain: [user@]host[:port] (None: from ~/.ssh/config)."""

    host: str
    user: str | None = None
    port: int | None = None


def parse_proxy_jump(text: str) -> tuple[Hop, ...]:
    """OpenSSH's ProxyJump value: `[user@]host[:port]`, comma-separated for a chain (first hop
    first); "none" is no jump. ValueError names the hop that is not one."""
    text = text.strip()
    if text.lower() == "none":
        return ()
    hops = []
    for word in text.split(","):
        word = word.strip()
        if word.startswith("ssh://"):
            word = word[len("ssh://"):]
        m = _JUMP_HOP.match(word)
        port = int(m.group("port")) if m and m.group("port") else None
        user = m.group("user") if m else None
        if not m or (port is not None and not 1 <= port <= 65535):
            raise ValueError(f"{word!r} is not [user@]host[:port]")
        hops.append(Hop(m.group("v6") or m.group("addr"), user, port))
    return tuple(hops)


def _check_jump(value: str) -> str | None:
    try:
        parse_proxy_jump(value)
    except ValueError as exc:
        return f'[user@]host[:port], comma-separated for a chain, e.g. "me@bastion:22" ({exc})'
    return None


HOSTS_SECTION = Section(
    name="hosts",
    doc="Remote GPU hosts reached over SSH, one [[hosts]] table each.",
    many=True,
    required=("address",),
    fields={
        "name": Field("str", "Short name shown in tables (default: the address).", None, check=_check(_NAME, "a short name (letters, digits, . _ - :)")),
        "address": Field("str", "Host name or IP address; a Host alias of ~/.ssh/config works too.", None, check=_check(_ADDRESS, "a host name or IP address")),
        "port": Field("int", "SSH port (default: ~/.ssh/config's, else 22).", None, minimum=1, maximum=65535),
        "user": Field("str", "Login user (default: ~/.ssh/config's, else yours).", None, check=_check(USER_NAME, "a user name")),
        "identity_file": Field("str", "Private key file, relative to the profile (default: ssh-agent, then ~/.ssh/id_*).", None),
        "proxy_jump": Field("str", "Jump host(s) to reach it through, as OpenSSH's ProxyJump: \"user@bastion:port\", "
                            "comma-separated for a chain, \"none\" to ignore ~/.ssh/config's (default: ~/.ssh/config's "
                            "ProxyJump or ProxyCommand).", None, check=_check_jump),
        "trust_on_first_use": Field("bool", "Accept and record an unknown host key on first contact (default: refuse it).", False),
        "connect_timeout": Field("float", "Seconds allowed for TCP, the SSH banner and authentication.", 5.0, minimum=0.1, maximum=300),
        "command_timeout": Field("float", "Seconds allowed for one poll's answer.", 10.0, minimum=0.1, maximum=600),
    },
)


@dataclass(frozen=True)
class HostSpec:
    """One remote host as configured; None fields fall back to ~/.ssh/config, then defaults."""

    name: str
    address: str
    port: int | None = None
    user: str | None = None
    identity_file: Path | None = None
    trust_on_first_use: bool = False
    connect_timeout: float = 5.0
    command_timeout: float = 10.0
    proxy_jump: str | None = None  # OpenSSH's ProxyJump syntax (parse_proxy_jump); None: ~/.ssh/config's

    def label(self) -> str:
        """user@address:port as far as known, for tables and messages."""
        address = f"[{self.address}]" if ":" in self.address else self.address
        text = f"{self.user}@{address}" if self.user else address
        return f"{text}:{self.port}" if self.port else text


def parse_host_arg(text: str) -> HostSpec:
    """A `--host [user@]address[:port]` argument (IPv6 in brackets: `user@[::1]:22`)."""
    m = _HOST_ARG.match(text.strip())
    port = int(m.group("port")) if m and m.group("port") else None
    if not m or (port is not None and not 1 <= port <= 65535):
        raise UserError(f"--host {text!r}: expected [user@]address[:port], e.g. gpu@10.0.0.5:22")
    address = m.group("v6") or m.group("addr")
    user = m.group("user")
    if user is not None and not USER_NAME.match(user):
        raise UserError(f"--host {text!r}: {user!r} is not a user name")
    name = address if port is None else f"{address}:{port}"
    return HostSpec(name=name, address=address, port=port, user=user)


def hosts_from_profile(profile: "Profile") -> list[HostSpec]:
    """The profile's [[hosts]], with identity files resolved (relative to the profile) and checked."""
    where = str(profile.path) if profile.path else "profile"
    base = profile.path.parent if profile.path else Path.cwd()
    specs = []
    for table in profile.tables.get("hosts", ()):
        values = dict(table)
        values.setdefault("name", values["address"])
        identity = values.pop("identity_file", None)
        spec = HostSpec(**values)
        if identity is not None:
            path = Path(identity).expanduser()
            path = path if path.is_absolute() else (base / path)
            if not path.is_file():
                raise UserError(f"{where}: [[hosts]] {spec.name}: identity_file {path} not found")
            spec = replace(spec, identity_file=path)
        specs.append(spec)
    return specs


def check_unique(specs: Iterable[HostSpec]) -> list[HostSpec]:
    """The hosts, refusing two with the same name."""
    seen: set[str] = set()
    out = []
    for spec in specs:
        if spec.name in seen:
            raise UserError(f"host {spec.name!r} is listed twice (give each [[hosts]] a distinct name)")
        seen.add(spec.name)
        out.append(spec)
    return out
