"""The `[[hosts]]` profile tables: remote GPU hosts reached over SSH, and OpenSSH's ProxyJump syntax.

Declared once, as `HostSpec`; gputui.sources.hostspecs resolves a profile's tables into HostSpecs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.config.schema import REQUIRED, key, section_of

_NAME = re.compile(r"^[A-Za-z0-9_.:@\[\]\-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:\-%]+$")
USER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-$]{0,63}$")  # never starts with "-"
# Jump hops also end up in a shell command (OpenSSH's -J runs `ssh -l USER ... HOST`): no shell
# metacharacters, and neither part may start with "-".
_JUMP_HOP = re.compile(r"^(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,63})@)?"
                       r"(?:\[(?P<v6>[0-9A-Fa-f:.%]+)\]|(?P<addr>[A-Za-z0-9_.%][A-Za-z0-9_.\-%]*))(?::(?P<port>\d{1,5}))?$")


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


def check_jump(value: str) -> str | None:
    try:
        parse_proxy_jump(value)
    except ValueError as exc:
        return f'[user@]host[:port], comma-separated for a chain, e.g. "me@bastion:22" ({exc})'
    return None


@dataclass(frozen=True)
class HostSpec:
    """One remote host as configured; None fields fall back to ~/.ssh/config, then defaults."""

    name: str = key("str", "Short name shown in tables (default: the address).", None, attr=REQUIRED,
                    check=_check(_NAME, "a short name (letters, digits, . _ - :)"))
    address: str = key("str", "Host name or IP address; a Host alias of ~/.ssh/config works too.", None,
                       attr=REQUIRED, check=_check(_ADDRESS, "a host name or IP address"))
    port: int | None = key("int", "SSH port (default: ~/.ssh/config's, else 22).", None, minimum=1, maximum=65535)
    user: str | None = key("str", "Login user (default: ~/.ssh/config's, else yours).", None,
                           check=_check(USER_NAME, "a user name"))
    # a string in the profile (relative to it), a checked Path once hosts_from_profile resolved it
    identity_file: Path | None = key("str", "Private key file, relative to the profile (default: ssh-agent, then "
                                     "~/.ssh/id_*).", None)
    trust_on_first_use: bool = key("bool", "Accept and record an unknown host key on first contact (default: refuse "
                                   "it).", False)
    connect_timeout: float = key("float", "Seconds allowed for TCP, the SSH banner and authentication.", 5.0,
                                 minimum=0.1, maximum=300)
    command_timeout: float = key("float", "Seconds allowed for one poll's answer.", 10.0, minimum=0.1, maximum=600)
    # OpenSSH's ProxyJump syntax (parse_proxy_jump); None: ~/.ssh/config's
    proxy_jump: str | None = key("str", "Jump hosts to reach it through, as OpenSSH's ProxyJump: \"user@bastion:port\", "
                                 "comma-separated for a chain, \"none\" to ignore ~/.ssh/config's (default: "
                                 "~/.ssh/config's ProxyJump or ProxyCommand).", None, check=check_jump)

    def label(self) -> str:
        """user@address:port as far as known, for tables and messages."""
        address = f"[{self.address}]" if ":" in self.address else self.address
        text = f"{self.user}@{address}" if self.user else address
        return f"{text}:{self.port}" if self.port else text


HOSTS_SECTION = section_of(HostSpec, "hosts", "Remote GPU hosts reached over SSH, one [[hosts]] table each.",
                           many=True, required=("address",))
