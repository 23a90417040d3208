"""The web server behind `gputui serve`: textual-serve's, with URLs built from the address the
browser used and a websocket that opens only from its own page (and, on loopback, only under
a loopback name: no DNS rebinding). The command line is gputui.commands.serve."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def loopback_name(host: str) -> bool:
    """A Host header's name that can only mean this machine."""
    from gputui.exporter import is_loopback

    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    return is_loopback(name.strip("[]")) or name.endswith(".localhost")


def same_origin(origin: str | None, host: str) -> bool:
    """The browser page that opens the websocket was served from this server."""
    if not origin:
        return True  # not a browser page (a script, a test client): origins are a browser's guard
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def make_server(command: str, loopback: bool) -> Any:
    """A textual-serve Server that builds its URLs from the address the browser used (an SSH
    tunnel's local port, a host name) and guards its websocket."""
    from aiohttp import web
    from textual_serve.server import Server

    class DashboardServer(Server):  # type: ignore[misc]
        async def handle_index(self, request: web.Request) -> Any:
            if loopback and not loopback_name(request.host):
                raise web.HTTPForbidden(text="gputui serve answers only to a loopback name (localhost, 127.0.0.1)")
            self.public_url = f"{request.scheme}://{request.host}"  # used synchronously by the template's URLs
            return await super().handle_index(request)

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            if (loopback and not loopback_name(request.host)) or not same_origin(request.headers.get("Origin"),
                                                                                 request.host):
                raise web.HTTPForbidden(text="this dashboard's websocket opens only from its own page")
            return await super().handle_websocket(request)

        async def on_startup(self, app: web.Application) -> None:
            """Quiet: `gputui serve` says itself where it serves."""

    return DashboardServer(command, title="gputui")
