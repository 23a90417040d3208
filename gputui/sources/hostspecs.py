"""Remote GPU hosts ("slaves") reached over SSH: a profile's `[[hosts]]` tables and `--host`, resolved.

The table itself is declared in gputui.config.hosts; this module reads it out of a profile.

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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from gputui.config.hosts import USER_NAME, HostSpec
from gputui.model.errors import UserError

if TYPE_CHECKING:
    from gputui.config.profile import Profile

_HOST_ARG = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%]+)\]|(?P<addr>[^:@\s\[\]]+))(?::(?P<port>\d{1,5}))?$")


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
