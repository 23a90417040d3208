"""The web server behind `gputui serve`: textual-serve's, behind a token, with URLs built from
the address the browser used. The command line is gputui.commands.serve.

- Every request needs the server's token: `/?token=...` (the URL `gputui serve` prints) trades
  it for an HttpOnly, SameSite=Strict cookie and redirects to the same page without it (out of
  the address bar and the history); the websocket and downloads take the cookie (or
  `?token=`, for a script). Anything else: 403, and no dashboard starts.
- The Host header must name this machine (`host_allowed`: no DNS rebinding), and the
  websocket opens only from this server's own page (a browser's Origin).
- At most `max_sessions` dashboards live at once; a terminal's size is clamped to SIZE_LIMITS.
- A session whose socket closed ends its dashboard: textual-serve stops reading a dashboard's
  output at the first write to a closed socket, and a dashboard then blocks on a full pipe and
  lives on; here its output is read (and dropped) until it quits, and one that has not quit
  within the bound is killed.
- The page loads nothing from the internet: textual-serve's page asks Google Fonts for Roboto
  Mono, which textual-serve ships in its static folder; the page is given that one instead.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from gputui.monitor.exporter import host_allowed, host_name
from gputui.model import outside

SIZE_LIMITS = ((40, 500), (10, 200))  # (columns, rows): (least, most)
DEFAULT_SIZE = (80, 24)
DEFAULT_MAX_SESSIONS = 4
KILL_GRACE_S = 10.0
TOKEN_PARAM = "token"
LOCAL_FONT = """<style>
@font-face { font-family: "Roboto Mono"; font-style: normal; font-weight: 100 700;
  src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }
@font-face { font-family: "Roboto Mono"; font-style: italic; font-weight: 100 700;
  src: url("/static/fonts/RobotoMono-Italic-VariableFont_wght.ttf") format("truetype"); }
</style>
"""
_LOADS = re.compile(r"""<(?:link|script)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']*)["'][^>]*>(?:\s*</script>)?""",
                    re.IGNORECASE)
_ABSOLUTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)

log = logging.getLogger("gputui.serve")


@dataclass(frozen=True)
class Guard:
    """What a request must show: the token, and a Host naming this machine."""

    token: str
    bound: str  # the address listened on
    allow_hosts: tuple[str, ...] = ()
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def host_ok(self, host: str | None) -> bool:
        return host_allowed(host, self.bound, self.allow_hosts)

    def token_ok(self, given: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())


def cookie_name(port: int | None) -> str:
    """One cookie per port the browser uses (cookies do not tell ports apart: two servers on
    one machine would overwrite each other's)."""
    return f"gputui-serve-{port or 80}"


def same_origin(origin: str | None, host: str) -> bool:
    """The browser page that opens the websocket was served from this server (no Origin: not
    a browser; the token still guards it)."""
    if not origin:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def clamp(value: object, default: int, least: int, most: int) -> int:
    """A terminal dimension from outside (a query string, a JSON message), within bounds."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        number = default
    return max(least, min(most, number))


def terminal_size(width: object, height: object) -> tuple[int, int]:
    (wl, wm), (hl, hm) = SIZE_LIMITS
    return clamp(width, DEFAULT_SIZE[0], wl, wm), clamp(height, DEFAULT_SIZE[1], hl, hm)


def local_page(html: str, origin: str) -> str:
    """textual-serve's page without a stylesheet or script from anywhere but `origin` (this
    server, as the browser calls it), with its font from this server."""
    def keep(tag: re.Match[str]) -> str:
        url = tag.group(1)
        return "" if _ABSOLUTE.match(url) and not url.startswith(origin + "/") else tag.group(0)

    return _LOADS.sub(keep, html).replace("</head>", LOCAL_FONT + "</head>", 1)


async def end_dashboard(service: Any, bound_s: float) -> None:
    """Ask a session's dashboard to quit and wait for it (its output still read, so it
    cannot block on a full pipe); one that has not quit within bound_s is killed."""
    process = service._process
    task = service._task
    if process is None:
        return
    await service._download_manager.cancel_app_downloads(app_service_id=service.app_service_id)
    await service.send_meta({"type": "quit"})
    exited = asyncio.ensure_future(process.wait())
    done, _ = await asyncio.wait({exited}, timeout=bound_s)
    if not done:
        print(f"gputui: a dashboard had not quit {bound_s:.0f} s after its browser session closed: killed; a run "
              "it followed goes on (`gputui runs` lists it)", file=sys.stderr, flush=True)
        for stop in (process.terminate, process.kill):
            try:
                stop()
            except ProcessLookupError:
                break
            done, _ = await asyncio.wait({exited}, timeout=KILL_GRACE_S)
            if done:
                break
    await exited
    if task is not None:  # its output ends with it (unless a process it left holds the pipe)
        finished, _ = await asyncio.wait({task}, timeout=KILL_GRACE_S)
        if not finished:
            task.cancel()
    service._task = None


def make_server(command: str, guard: Guard, quit_bound_s: float) -> Any:
    """A textual-serve Server for `command` (one process per session) behind `guard`."""
    from aiohttp import WSMsgType, web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server

    @web.middleware
    async def guarded(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        host = request.headers.get("Host")
        if not guard.host_ok(host):
            raise web.HTTPForbidden(text=f"gputui serve does not answer to the name {host_name(host or '')!r}: "
                                    "open it by a loopback name (localhost, 127.0.0.1), or give "
                                    "gputui serve --allow-host NAME\n")
        try:
            name = cookie_name(request.url.port)
        except ValueError:  # a Host header with a port that is no number
            raise web.HTTPBadRequest(text="gputui serve: a Host header with a bad port\n") from None
        given = request.query.get(TOKEN_PARAM)
        if not guard.token_ok(given if given is not None else request.cookies.get(name)):
            raise web.HTTPForbidden(text="gputui serve needs its token: open the URL it printed "
                                    "(http://HOST:PORT/?token=...)\n")
        if given is not None and request.path == "/":
            rest = [(k, v) for k, v in request.query.items() if k != TOKEN_PARAM]
            moved = web.HTTPSeeOther(location=str(request.rel_url.with_query(rest)))
            moved.set_cookie(name, guard.token, path="/", httponly=True, samesite="Strict")
            moved.headers["Cache-Control"] = "no-store"
            moved.headers["Referrer-Policy"] = "no-referrer"
            raise moved
        return await handler(request)

    class DashboardServer(Server):  # type: ignore[misc]
        sessions = 0

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(guarded)
            return app

        async def handle_index(self, request: web.Request) -> Any:
            self.public_url = f"{request.scheme}://{request.host}"  # used synchronously by the template's URLs
            page = await super().handle_index(request)
            assert isinstance(page, web.Response)  # aiohttp_jinja2's template renders a Response (typed StreamResponse)
            page.text = local_page(page.text or "", self.public_url)
            page.headers["Cache-Control"] = "no-store"
            page.headers["Referrer-Policy"] = "no-referrer"
            return page

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            if not same_origin(request.headers.get("Origin"), request.host):
                raise web.HTTPForbidden(text="this dashboard's websocket opens only from its own page\n")
            if self.sessions >= guard.max_sessions:
                raise web.HTTPServiceUnavailable(
                    text=f"{self.sessions} dashboards are open, the most this server allows: close a tab, or "
                    "restart gputui serve with a larger --max-sessions\n")
            self.sessions += 1
            try:
                return await self._session(request)
            finally:
                self.sessions -= 1

        async def _session(self, request: web.Request) -> web.WebSocketResponse:
            websocket = web.WebSocketResponse(heartbeat=15)
            width, height = terminal_size(request.query.get("width"), request.query.get("height"))

            async def write_bytes(data: bytes) -> None:
                if not websocket.closed:
                    try:
                        await websocket.send_bytes(data)
                    except ConnectionError:  # closing: the dashboard's output is dropped until it quits
                        pass

            async def write_str(data: str) -> None:
                if not websocket.closed:
                    try:
                        await websocket.send_str(data)
                    except ConnectionError:
                        pass

            async def close() -> None:  # AppService awaits a close that returns nothing
                await websocket.close()

            await websocket.prepare(request)
            service = AppService(self.command, write_bytes=write_bytes, write_str=write_str, close=close,
                                 download_manager=self.download_manager, debug=False)
            try:
                await service.start(width, height)
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:  # the server stops
                await websocket.close()
            except Exception:
                log.exception("a dashboard session failed")
            finally:
                await end_dashboard(service, quit_bound_s)
            return websocket

        async def _process_messages(self, websocket: web.WebSocketResponse, app_service: Any) -> None:
            """The browser's messages (data from outside: malformed ones are dropped); a
            resize is clamped like the first size."""
            async for message in websocket:
                if message.type != WSMsgType.TEXT:
                    continue
                try:
                    envelope = outside.parse(message.data)  # the browser's words are data
                except outside.Refused:
                    continue
                if not isinstance(envelope, list) or not envelope:
                    continue
                kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
                if kind == "stdin" and isinstance(data, str):
                    await app_service.send_bytes(data.encode("utf-8", "replace"))
                elif kind == "resize" and isinstance(data, dict):
                    await app_service.set_terminal_size(*terminal_size(data.get("width"), data.get("height")))
                elif kind == "ping":
                    try:
                        await websocket.send_json(["pong", data])
                    except ConnectionError:
                        return
                elif kind == "blur":
                    await app_service.blur()
                elif kind == "focus":
                    await app_service.focus()

        async def on_startup(self, app: web.Application) -> None:
            """Quiet: `gputui serve` says itself where it serves."""

    return DashboardServer(command, title="gputui")
