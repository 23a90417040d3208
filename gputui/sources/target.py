"""Where an SSH host is and the route to it: `Target`, once ~/.ssh/config and the defaults are applied.

gputui.sources.jump resolves a `[[hosts]]` entry into one; gputui.sources.hostkeys names the
host in its verdicts; gputui.sources.ssh connects along its route.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A host's connection parameters once ~/.ssh/config and defaults are applied, and its route."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    via: "Target | None" = None  # the last bastion of the chain (its own `via`: the one before)
    proxy_command: str | None = None  # ProxyCommand with %h %p %r already substituted

    def label(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"

    def route(self) -> str:
        """" via bastion a, b" (first hop first), " via ProxyCommand ..." or ""."""
        hops: list[str] = []
        hop = self.via
        while hop is not None:
            hops.insert(0, hop.label())
            hop = hop.via
        if hops:
            return f" via bastion {', '.join(hops)}"
        return f" via ProxyCommand {self.proxy_command!r}" if self.proxy_command else ""
