"""`gputui serve`: the dashboard in a real browser. Debian's headless Chromium loads the page,
driven over the DevTools protocol with aiohttp's websocket client; the terminal's text is
read from xterm.js's buffer (the renderer draws on a canvas, so the DOM has no text).

Also: loopback by default, --public and its warning, one-line errors, the token (printed once
in the URL, traded for a cookie, required by the page and the websocket), the cap on
sessions, the clamped terminal size, the Host allow-list, a closed session's dashboard
ending, a page that loads nothing from elsewhere, and the websocket's guards against other
origins and DNS rebinding (no browser needed for those)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import psutil
import pytest

from tests.conftest import REPO

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)


@pytest.fixture
def chromium_installed() -> None:
    """Like a missing sshd or tmux: a failure, never a silent skip (CI installs all three)."""
    if CHROMIUM is None:
        pytest.fail("Debian's chromium is needed for this test (apt-get install chromium; "
                    "scripts/setup.sh --test installs it)", pytrace=False)


needs_chromium = pytest.mark.usefixtures("chromium_installed")

# Before textual.js runs: keep the object that owns the xterm Terminal (it is the one that sets
# `webglAddon` on itself) in window.__gputui, so the test can read the terminal's buffer.
HOOK = """
Object.defineProperty(Object.prototype, "webglAddon", {configurable: true, get() { return undefined; },
  set(v) { Object.defineProperty(this, "webglAddon", {value: v, writable: true, configurable: true});
           window.__gputui = this; }});
"""
SCREEN_JS = """(() => {
  const t = window.__gputui && window.__gputui.terminal;
  if (!t) return "";
  const b = t.buffer.active, out = [];
  for (let y = 0; y < t.rows; y++) { const l = b.getLine(b.viewportY + y); out.push(l ? l.translateToString(true) : ""); }
  return out.join("\\n");
})()"""


# the server --------------------------------------------------------------------------------------
class Serve:
    """`gputui serve --port 0` on the demo's simulated hosts, in its own session."""

    def __init__(self, home: Path, *flags: str, hosts: int = 2, gpus: int = 2) -> None:
        env = dict(os.environ, GPUTUI_HOME=str(home), GPUTUI_DEMO_HOSTS=str(hosts), GPUTUI_DEMO_GPUS=str(gpus),
                   PYTHONUNBUFFERED="1")
        self.home = home
        self.proc = subprocess.Popen([sys.executable, "-m", "gputui", "serve", "--port", "0", *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)  # it prints the line once it listens, or exits
        first = lines[0] if lines else "(nothing within 60 s)"
        found = re.search(r"http://[\d.]+:(\d+)/\?token=([A-Za-z0-9_-]+) ", first)
        if found is None:
            self.stop()
            said = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"gputui serve did not start: {first!r} {said}")
        self.first_line = first
        self.port = int(found.group(1))
        self.token = found.group(2)
        self.base = f"http://127.0.0.1:{self.port}/"
        self.url = f"{self.base}?token={self.token}"  # as printed: what a user opens
        self.cookie = {"Cookie": f"gputui-serve-{self.port}={self.token}"}

    def dashboards(self) -> list[psutil.Process]:
        """The dashboards the server runs, one per browser session."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for p in children:
            try:
                if p.status() != psutil.STATUS_ZOMBIE and "ui" in p.cmdline():
                    found.append(p)
            except psutil.NoSuchProcess:  # ended meanwhile (a zombie too)
                continue
        return found

    def stop(self) -> list[str]:
        """SIGTERM: the server closes the sessions and each dashboard quits. Returns what was left
        of its process tree after that (then killed)."""
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        left = []
        for p in tree:  # whatever outlived it (a failed test's training run)
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(p.cmdline()))
                    p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(10)
        return left


def training_processes(home: Path) -> list[psutil.Process]:
    """Every `gputui run` of this test's GPUTUI_HOME, wherever it was started from."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "gputui" not in cmd or "run" not in cmd:
            continue
        try:
            if p.environ().get("GPUTUI_HOME") == str(home) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# the browser -------------------------------------------------------------------------------------
class Cdp:
    """One DevTools websocket: commands by id, replies matched to them."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def __call__(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            reply = await asyncio.wait_for(self.ws.receive_json(), 30)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))


class Tab:
    def __init__(self, cdp: Cdp, target: str) -> None:
        self.cdp = cdp
        self.target = target

    async def screen(self) -> str:
        result = await self.cdp("Runtime.evaluate", expression=SCREEN_JS, returnByValue=True)
        return str(result.get("result", {}).get("value") or "")

    async def wait(self, check: Callable[[str], object], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = await self.screen()
            if check(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; the page shows:\n{text}")
            await asyncio.sleep(0.25)

    async def press(self, key: str) -> None:
        """One key, as a user types it: keyDown (with its text) and keyUp on the focused terminal."""
        await self.cdp("Runtime.evaluate", expression="window.__gputui.terminal.focus()")
        await self.cdp("Input.dispatchKeyEvent", type="keyDown", key=key, text=key, unmodifiedText=key)
        await self.cdp("Input.dispatchKeyEvent", type="keyUp", key=key)


class Chromium:
    """Headless Chromium with a DevTools port; nothing reaches the network but 127.0.0.1
    (the page asks for a web font: refused at once)."""

    def __init__(self, profile_dir: Path) -> None:
        assert CHROMIUM is not None
        self.profile_dir = profile_dir
        self.log = profile_dir.with_suffix(".log")
        self.log_file = self.log.open("wb")
        # Its own TMPDIR (short: a Unix socket goes in it), removed at close: a terminated Chromium
        # leaves its org.chromium.Chromium.* singleton directory behind.
        self.temp = Path(tempfile.mkdtemp(prefix="gputui-chromium-"))
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile_dir}", "--window-size=1600,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.log_file, start_new_session=True,
            env={**os.environ, "TMPDIR": str(self.temp)})
        self.sockets: list[Any] = []

    async def start(self) -> None:
        import aiohttp

        port_file = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = self.log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"chromium gave no DevTools port (exit {self.proc.poll()}): {said}")
            await asyncio.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        ws = await self.session.ws_connect(f"ws://127.0.0.1:{self.port}{port_file.read_text().split()[1]}",
                                           max_msg_size=0)
        self.sockets.append(ws)
        self.browser = Cdp(ws)

    async def open(self, url: str) -> Tab:
        target = (await self.browser("Target.createTarget", url="about:blank"))["targetId"]
        ws = await self.session.ws_connect(f"ws://127.0.0.1:{self.port}/devtools/page/{target}", max_msg_size=0)
        self.sockets.append(ws)
        tab = Tab(Cdp(ws), target)
        await tab.cdp("Page.enable")
        await tab.cdp("Page.addScriptToEvaluateOnNewDocument", source=HOOK)
        await tab.cdp("Page.navigate", url=url)
        return tab

    async def close(self) -> None:
        for ws in self.sockets:
            await ws.close()
        if hasattr(self, "session"):
            await self.session.close()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log_file.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def in_browser(tmp_path: Path, serve: Serve, scenario: Callable[[Chromium], Awaitable[None]]) -> list[str]:
    """Run the scenario in a fresh Chromium; then stop the server. Returns what outlived it."""
    async def main() -> None:
        browser = Chromium(tmp_path / "chromium")
        try:
            await browser.start()
            await scenario(browser)
        finally:
            await browser.close()

    try:
        asyncio.run(main())
    finally:
        left = serve.stop()
    return left


def gpu_row(text: str) -> bool:
    """A GPU of host sim-0 is listed: after the host's line, a line with its temperature and power."""
    lines = text.splitlines()
    host = next((i for i, line in enumerate(lines) if "sim-0" in line), None)
    return host is not None and any(re.search(r"\d+°C.*\d+ ?W", line) for line in lines[host + 1:host + 3])


# browser tests -----------------------------------------------------------------------------------
@needs_chromium
@pytest.mark.timeout(600)
def test_the_page_draws_the_dashboard_and_keys_act(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "home", "--demo")

    async def scenario(browser: Chromium) -> None:
        tab = await browser.open(serve.url)
        await tab.wait(lambda s: s.lstrip().startswith("gputui") and "Hosts & GPUs" in s and gpu_row(s), 90,
                       "the dashboard's title and a GPU row")
        assert len(serve.dashboards()) == 1, "one browser tab, one dashboard process"
        assert "Start the profile's training run" not in await tab.screen()
        await tab.press("?")
        await tab.wait(lambda s: "Start the profile's training run" in s, 30, "the help screen, after ?")
        await browser.browser("Target.closeTarget", targetId=tab.target)
        deadline = time.monotonic() + 60
        while serve.dashboards():  # closing the tab quits its dashboard
            assert time.monotonic() < deadline, "the dashboard outlived its closed tab by 60 s"
            await asyncio.sleep(0.2)

    left = in_browser(tmp_path, serve, scenario)
    assert left == [], f"left running after gputui serve got SIGTERM: {left}"


def step_shown(text: str) -> int:
    found = re.search(r"step ([\d,]+)/", text)
    return int(found.group(1).replace(",", "")) if found else -1


@needs_chromium
@pytest.mark.timeout(900)
def test_two_tabs_pressing_t_train_one_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    serve = Serve(home, "--demo")

    async def scenario(browser: Chromium) -> None:
        first = await browser.open(serve.url)
        second = await browser.open(serve.url)
        for tab in (first, second):
            await tab.wait(lambda s: "Hosts & GPUs" in s, 90, "the dashboard's first frame")
        await first.press("t")
        await first.wait(lambda s: step_shown(s) > 0, 180, "the first tab's run to train")
        await second.press("t")
        text = await second.wait(lambda s: step_shown(s) > 0, 120, "the second tab to show the run")
        runs = training_processes(home)
        assert len(runs) == 1, f"two tabs started {len(runs)} runs: {[p.cmdline() for p in runs]}\n{text}"

    try:
        in_browser(tmp_path, serve, scenario)
    finally:
        for p in training_processes(home):
            p.kill()


# the server without a browser ----------------------------------------------------------------------
def test_the_dashboard_command_carries_the_profile_and_flags(tmp_path: Path) -> None:
    import argparse

    from gputui.commands import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers(dest="command"))
    profile = REPO / "profiles" / "fast.toml"
    argv = serve.dashboard_argv(parser.parse_args(["serve", "--demo", "--light", "--profile", str(profile)]))
    assert argv[:4] == [sys.executable, "-m", "gputui", "ui"]
    assert argv[4:] == ["--profile", str(profile.resolve()), "--demo", "--light"]
    argv = serve.dashboard_argv(parser.parse_args(["serve", "--port", "9"]))
    assert argv[4:] == ["--profile", str((REPO / "profiles" / "local.toml").resolve())]


def test_loopback_by_default_and_public_warns(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "home")
    try:
        bound = {c.laddr.ip for c in psutil.Process(serve.proc.pid).net_connections("inet") if c.status == "LISTEN"}
        assert bound == {"127.0.0.1"}
    finally:
        serve.stop()
    assert serve.proc.stderr is not None and "warning" not in serve.proc.stderr.read()
    public = Serve(tmp_path / "home", "--public")
    try:
        bound = {c.laddr.ip for c in psutil.Process(public.proc.pid).net_connections("inet") if c.status == "LISTEN"}
        assert bound == {"0.0.0.0"}
    finally:
        public.stop()
    assert public.proc.stderr is not None
    warning = public.proc.stderr.read()
    assert "gputui: warning:" in warning and "whoever reaches this port controls" in warning, warning


def test_errors_are_one_line(tmp_path: Path) -> None:
    import socket

    from tests.conftest import run_cli

    done = run_cli("serve", "--host", "192.0.2.1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--public" in done.stderr and "Traceback" not in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run_cli("serve", "--port", str(taken.getsockname()[1]), timeout=60)
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot listen" in done.stderr and "--port" in done.stderr
    done = run_cli("serve", "--profile", str(tmp_path / "missing.toml"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_the_websocket_refuses_other_origins_and_hosts(tmp_path: Path) -> None:
    """A page on another site must not open the dashboard's websocket (websockets are not
    bound by CORS), and a rebound DNS name must not reach the loopback server."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            ws_url = f"ws://127.0.0.1:{serve.port}/ws"
            for headers in ({"Origin": "http://evil.example"}, {"Origin": f"http://evil.example:{serve.port}"},
                            {"Host": f"evil.example:{serve.port}", "Origin": f"http://evil.example:{serve.port}"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(ws_url, headers={**headers, **serve.cookie})  # with the token, even
                assert refused.value.status == 403, headers
            async with session.get(serve.url, headers={"Host": f"evil.example:{serve.port}"}) as page:
                assert page.status == 403
            async with session.get(serve.url) as page:
                assert page.status == 200 and f'ws://127.0.0.1:{serve.port}/ws' in await page.text()
            async with session.get(serve.url, headers={"Host": f"localhost:{serve.port}"}) as page:
                assert f'ws://localhost:{serve.port}/ws' in await page.text()  # a tunnel's own name and port
            assert serve.dashboards() == []  # none of the refused ones started a dashboard

    try:
        asyncio.run(main())
    finally:
        serve.stop()


@needs_chromium
@pytest.mark.timeout(900)
def test_closing_the_tab_of_a_running_run_quits_its_dashboard(tmp_path: Path) -> None:
    home = tmp_path / "home"
    serve = Serve(home, "--demo")

    async def scenario(browser: Chromium) -> None:
        tab = await browser.open(serve.url)
        await tab.wait(lambda s: "Hosts & GPUs" in s, 90, "the dashboard's first frame")
        await tab.press("t")
        await tab.wait(lambda s: step_shown(s) > 0, 180, "the run to train")
        assert len(training_processes(home)) == 1, "the tab's t started one run"
        await browser.browser("Target.closeTarget", targetId=tab.target)
        deadline = time.monotonic() + 120  # it stops the run with a checkpoint first
        while serve.dashboards():
            assert time.monotonic() < deadline, "the dashboard outlived its closed tab by 120 s"
            await asyncio.sleep(0.5)
        # it was not killed: it quit (textual-serve's session then ends with the process)

    try:
        left = in_browser(tmp_path, serve, scenario)
        assert left == [], f"left running after gputui serve got SIGTERM: {left}"
        # What happens to the run: the dashboard's quit sent it one SIGTERM, and it stopped with a
        # checkpoint (docs/stopping.md: SIGTERM to the dashboard does what q does with a run going).
        assert training_processes(home) == [], "the closed tab's run still trains"
        (events,) = (home / "runs").glob("*/events.jsonl")
        last = json.loads(events.read_text().splitlines()[-1])
        assert (last["event"], last["reason"]) == ("interrupted", "SIGTERM"), last
        assert Path(last["checkpoint"]).is_file(), last
    finally:
        for p in training_processes(home):
            p.kill()


# the token, the cap, the size ------------------------------------------------------------------------
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


async def wait_for_text(ws: Any, text: str, timeout: float, what: str) -> None:
    """Read the session's output until `text` shows in it (escape sequences stripped)."""
    import aiohttp

    seen = ""
    deadline = time.monotonic() + timeout
    while text not in ANSI.sub("", seen):
        left = deadline - time.monotonic()
        try:
            message = await asyncio.wait_for(ws.receive(), max(left, 0.01))
        except asyncio.TimeoutError:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}") from None
        if message.type == aiohttp.WSMsgType.BINARY:
            seen += message.data.decode("utf-8", "replace")
        elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            raise AssertionError(f"the websocket closed while waiting for {what}")


def wait_for_dashboards(serve: Serve, count: int, timeout: float, what: str) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while len(found := serve.dashboards()) != count:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {len(found)} dashboard(s)")
        time.sleep(0.1)
    return found


def served(serve: Serve, main: Callable[[], Awaitable[None]]) -> None:
    try:
        asyncio.run(main())
    finally:
        left = serve.stop()
    assert left == [], f"left running after gputui serve got SIGTERM: {left}"


def test_without_the_token_nothing_opens_and_no_dashboard_starts(tmp_path: Path) -> None:
    """A script or another local user sends no Origin: before the token, it got the websocket and
    drove a dashboard. Now: no token, or a wrong one (in the URL or the cookie), is a 403."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = f"ws://127.0.0.1:{serve.port}/ws?width=80&height=24"
            wrong = {"Cookie": f"gputui-serve-{serve.port}={serve.token[:-1]}x"}
            for url, headers in ((ws, {}), (f"{ws}&token=", {}), (f"{ws}&token={serve.token[:-1]}", {}), (ws, wrong),
                                 (f"{ws}&token=x", serve.cookie)):  # a token given is the one checked
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(url, headers=headers)
                assert refused.value.status == 403, (url, headers)
            for url, headers in ((serve.base, {}), (f"{serve.base}?token=nope", {}), (serve.base, wrong)):
                async with session.get(url, headers=headers, allow_redirects=False) as page:
                    assert page.status == 403 and "token" in await page.text()
            assert psutil.Process(serve.proc.pid).children(recursive=True) == [], "a refused request started a process"

    served(serve, main)


def test_the_token_url_trades_the_token_for_a_cookie_and_drops_it_from_the_address(tmp_path: Path) -> None:
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            async with session.get(f"{serve.url}&fontsize=20", allow_redirects=False) as moved:
                assert moved.status == 303 and moved.headers["Location"] == "/?fontsize=20"
                cookie = moved.headers["Set-Cookie"]
                assert cookie.startswith(f"gputui-serve-{serve.port}={serve.token};"), cookie
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
            async with session.get(f"{serve.base}?fontsize=20", allow_redirects=False) as page:  # the cookie alone
                assert page.status == 200 and 'data-font-size="20"' in await page.text()
                assert serve.token not in await page.text()

    served(serve, main)


def test_with_the_token_a_websocket_drives_a_dashboard_that_never_sees_it(tmp_path: Path) -> None:
    """The cookie (a browser) or ?token= (a script) opens a session whose keys act. The token is
    nowhere but the one URL line: not in the dashboard's command line or environment, not on
    stderr."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = f"ws://127.0.0.1:{serve.port}/ws?width=120&height=40"
            by_cookie = await session.ws_connect(ws, headers=serve.cookie, max_msg_size=0)
            by_query = await session.ws_connect(f"{ws}&token={serve.token}", max_msg_size=0)
            for session_ws in (by_cookie, by_query):
                await wait_for_text(session_ws, "Hosts & GPUs", 90, "the dashboard's first frame")
            await by_query.send_json(["stdin", "?"])
            await wait_for_text(by_query, "Start the profile's training run", 60, "the help screen, after ?")
            tree = psutil.Process(serve.proc.pid).children(recursive=True)
            assert len(serve.dashboards()) == 2
            for proc in tree:
                seen = " ".join(proc.cmdline()) + " ".join(f"{k}={v}" for k, v in proc.environ().items())
                assert serve.token not in seen, proc.cmdline()
            await by_cookie.close()
            await by_query.close()

    served(serve, main)
    assert serve.proc.stdout is not None and serve.proc.stderr is not None
    said = serve.first_line + serve.proc.stdout.read()
    assert said.count(serve.token) == 1 and serve.token not in serve.proc.stderr.read()


def test_sessions_over_the_cap_are_refused(tmp_path: Path) -> None:
    import aiohttp

    serve = Serve(tmp_path / "home", "--max-sessions", "1")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = f"ws://127.0.0.1:{serve.port}/ws?width=80&height=24"
            first = await session.ws_connect(ws, headers=serve.cookie, max_msg_size=0)
            await wait_for_text(first, "Hosts & GPUs", 90, "the first session's dashboard")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(ws, headers=serve.cookie)
            assert refused.value.status == 503
            assert len(serve.dashboards()) == 1
            await first.close()
            wait_for_dashboards(serve, 0, 60, "the first session's dashboard to quit")
            deadline = time.monotonic() + 30  # its place is free once the server has reaped it, just after
            while True:
                try:
                    second = await session.ws_connect(ws, headers=serve.cookie, max_msg_size=0)
                    break
                except aiohttp.WSServerHandshakeError as still:
                    assert still.status == 503 and time.monotonic() < deadline, "the first session's place stayed taken"
                    await asyncio.sleep(0.1)
            await wait_for_text(second, "Hosts & GPUs", 90, "the second session's dashboard")
            await second.close()

    served(serve, main)


def test_a_huge_terminal_is_clamped(tmp_path: Path) -> None:
    """3000x1500 kept a 130 MB dashboard; the size a session asks for is held to 500x200."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"ws://127.0.0.1:{serve.port}/ws?width=3000&height=1500",
                                          headers=serve.cookie, max_msg_size=0)
            [dashboard] = wait_for_dashboards(serve, 1, 60, "the session's dashboard")
            size = {k: v for k, v in dashboard.environ().items() if k in ("COLUMNS", "ROWS")}
            assert size == {"COLUMNS": "500", "ROWS": "200"}
            await ws.close()

    served(serve, main)


def test_a_resize_is_clamped_and_a_malformed_message_dropped() -> None:
    from gputui.ui.web import Guard, make_server

    class Message:
        def __init__(self, data: str) -> None:
            import aiohttp

            self.type = aiohttp.WSMsgType.TEXT
            self.data = data

    class Socket:
        def __init__(self, *data: str) -> None:
            self.messages = [Message(d) for d in data]

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Message:
            if not self.messages:
                raise StopAsyncIteration
            return self.messages.pop(0)

    class Service:
        def __init__(self) -> None:
            self.sizes: list[tuple[int, int]] = []
            self.sent: list[bytes] = []

        async def set_terminal_size(self, width: int, height: int) -> None:
            self.sizes.append((width, height))

        async def send_bytes(self, data: bytes) -> None:
            self.sent.append(data)

    server = make_server("true", Guard("t" * 43, "127.0.0.1"), 1.0)
    service = Service()
    messages = ['["resize", {"width": 3000, "height": 1500}]', '["resize", {"width": 1, "height": -5}]',
                '["resize", {"width": "x", "height": 1e400}]', "not json", '{"a": 1}', "[]", '["stdin", 5]',
                '["resize", 7]', '["stdin", "q"]']
    asyncio.run(server._process_messages(Socket(*messages), service))
    assert service.sizes == [(500, 200), (40, 10), (80, 24)]
    assert service.sent == [b"q"]


def test_a_huge_sessions_dashboard_ends_when_its_socket_closes(tmp_path: Path) -> None:
    """A 3000x1500 session's dashboard lived on over 60 s (130 MB) after its socket closed."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"ws://127.0.0.1:{serve.port}/ws?width=3000&height=1500",
                                          headers=serve.cookie, max_msg_size=0)
            await wait_for_text(ws, "Hosts & GPUs", 90, "the dashboard's first frame")
            await ws.close()
        wait_for_dashboards(serve, 0, 45, "the closed session's dashboard to quit")

    served(serve, main)


def test_public_answers_only_to_host_names_it_knows(tmp_path: Path) -> None:
    """DNS rebinding with --public: the page and the websocket under a foreign Host name are
    refused, token or not, unless --allow-host names it; an address is no rebound name."""
    import aiohttp

    async def check(serve: Serve, foreign_ok: bool) -> None:
        async with aiohttp.ClientSession() as session:
            for host, ok in ((f"evil.example:{serve.port}", foreign_ok), (f"EVIL.example.:{serve.port}", foreign_ok),
                             (f"localhost:{serve.port}", True), (f"10.1.2.3:{serve.port}", True)):
                async with session.get(serve.base, headers={"Host": host, **serve.cookie}) as page:
                    assert page.status == (200 if ok else 403), host
                if not ok:
                    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                        await session.ws_connect(f"ws://127.0.0.1:{serve.port}/ws", headers={"Host": host, **serve.cookie})
                    assert refused.value.status == 403
            assert serve.dashboards() == []

    for flags, foreign_ok in (((), False), (("--allow-host", "evil.example"), True)):
        serve = Serve(tmp_path / "home", "--public", *flags)
        served(serve, lambda: check(serve, foreign_ok))


def test_the_page_loads_nothing_from_elsewhere(tmp_path: Path) -> None:
    """textual-serve's page asked fonts.googleapis.com for its font; every stylesheet, script,
    image and font now comes from this server."""
    import aiohttp

    serve = Serve(tmp_path / "home")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(serve.base, headers=serve.cookie) as page:
                html = await page.text()
            wanted = re.findall(r"""(?:href|src)\s*=\s*["']([^"']+)|url\(\s*["']?([^"')]+)""", html)
            urls = [a or b for a, b in wanted]
            assert any("RobotoMono" in u for u in urls) and any(u.endswith("textual.js") for u in urls), urls
            for url in urls:
                assert not re.match(r"(?:https?:)?//", url) or url.startswith(f"http://127.0.0.1:{serve.port}/"), url
                async with session.get(url if url.startswith("http") else serve.base.rstrip("/") + url,
                                       headers=serve.cookie) as asset:
                    assert asset.status == 200, url

    served(serve, main)


def test_the_tunnel_hint_is_a_command_ssh_takes(tmp_path: Path) -> None:
    """The hint names the user and this machine and the port bound: `ssh -G` (which parses a
    command line and connects nowhere) takes it as written."""
    serve = Serve(tmp_path / "home")
    try:
        assert serve.proc.stdout is not None
        hint = serve.proc.stdout.readline()
    finally:
        serve.stop()
    command = re.search(r"`([^`]+)`", hint)
    assert command is not None and command.group(1).startswith("ssh "), hint
    argv = shlex.split(command.group(1))
    assert argv[-1].endswith("@" + socket.gethostname())
    parsed = subprocess.run(["ssh", "-G", *argv[1:]], capture_output=True, text=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr
    assert f"localforward {serve.port} [127.0.0.1]:{serve.port}" in parsed.stdout.lower()


FLOODING_APP = """
import os, sys, threading
out = sys.stdout.buffer.fileno()
open(sys.argv[1], "w").write(str(os.getpid()))
def packet(kind, payload):
    return kind + len(payload).to_bytes(4, "big") + payload
quit, go = threading.Event(), threading.Event()
def read():
    while True:
        head = sys.stdin.buffer.read(5)
        if len(head) < 5:
            return
        body = sys.stdin.buffer.read(int.from_bytes(head[1:], "big"))
        if head[:1] == b"M" and b'"quit"' in body:
            quit.set()
        if head[:1] == b"D" and body == b"go":
            go.set()
threading.Thread(target=read, daemon=True).start()
os.write(out, b"__GANGLION__\\n" + packet(b"D", b"ready"))
go.wait()
frame = packet(b"D", b"x" * (4 << 20))  # a big screen's frame
while not quit.is_set():  # drawing, until it reads the quit
    os.write(out, frame)
os.write(out, frame)  # and on its way out, a last frame (what it had queued, the screen restored)
"""


def test_a_closed_sessions_dashboard_is_read_until_it_quits(tmp_path: Path) -> None:
    """textual-serve stops reading a dashboard's output at its first write to a closed socket;
    a dashboard that still writes (a big last frame) then blocks on the full pipe for good. A
    stand-in dashboard draws 4 MB frames until it reads the quit, and one more after: the
    session reads it all, and it ends."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from gputui.ui.web import Guard, make_server

    script, pid_file = tmp_path / "flood.py", tmp_path / "pid"
    script.write_text(FLOODING_APP)
    token = "t" * 43
    server = make_server(shlex.join([sys.executable, str(script), str(pid_file)]), Guard(token, "127.0.0.1"), 300.0)

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    async def main() -> None:
        async with TestServer(await server._make_app(), host="127.0.0.1") as site:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(site.make_url(f"/ws?token={token}"), max_msg_size=0)
                assert (await asyncio.wait_for(ws.receive(), 60)).data == b"ready"
                await ws.send_json(["stdin", "go"])
                await asyncio.wait_for(ws.receive(), 60)  # it is flooding
                await ws.close()
            pid = int(pid_file.read_text())
            deadline = time.monotonic() + 30
            while alive(pid):
                assert time.monotonic() < deadline, "the closed session's dashboard lived on 30 s (blocked on its pipe)"
                await asyncio.sleep(0.1)

    asyncio.run(main())
