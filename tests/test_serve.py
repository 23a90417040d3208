"""`gputui serve`: the dashboard in a real browser. Debian's headless Chromium loads the page,
driven over the DevTools protocol with aiohttp's websocket client; the terminal's text is
read from xterm.js's buffer (the renderer draws on a canvas, so the DOM has no text).

Also: loopback by default, --public and its warning, one-line errors, and the websocket's
guards against other origins and DNS rebinding (no browser needed for those)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import psutil
import pytest

from tests.conftest import REPO

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                    "(apt-get install chromium; scripts/setup.sh --test installs it)")

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
        found = re.search(r"http://[\d.]+:(\d+)", first)
        if found is None:
            self.stop()
            said = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"gputui serve did not start: {first!r} {said}")
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}/"

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
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile_dir}", "--window-size=1600,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.log_file, start_new_session=True)
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
        async with aiohttp.ClientSession() as session:
            ws_url = f"ws://127.0.0.1:{serve.port}/ws"
            for headers in ({"Origin": "http://evil.example"}, {"Origin": f"http://evil.example:{serve.port}"},
                            {"Host": f"evil.example:{serve.port}", "Origin": f"http://evil.example:{serve.port}"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(ws_url, headers=headers)
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
        await browser.browser("Target.closeTarget", targetId=tab.target)
        deadline = time.monotonic() + 120  # it may stop the run with a checkpoint first
        while serve.dashboards():
            assert time.monotonic() < deadline, "the dashboard outlived its closed tab by 120 s"
            await asyncio.sleep(0.5)
        # it was not killed: it quit (textual-serve's session then ends with the process)

    try:
        in_browser(tmp_path, serve, scenario)
    finally:
        for p in training_processes(home):
            p.kill()
