"""The slaves' watchdog (gputui/cloud/watchdog.sh), run here with sh, dash and bash in POSIX
mode against a fake IMDSv2 server on loopback that serves the instance's tags. The time is a
file the test writes; power-off is a stand-in command that writes the reason to a file;
processes come from a fake /proc and GPU utilisation from a fake nvidia-smi."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cloud.lease import parse_stop
from gputui.cloud.userdata import INSTALL_PATH, user_data, watchdog_script

SCRIPT = Path(__file__).resolve().parents[1] / "gputui" / "cloud" / "watchdog.sh"
DEAD = "http://127.0.0.1:9"  # discard port: nothing answers
SHELLS = [pytest.param(["sh"], id="sh"), pytest.param(["dash"], id="dash"),
          pytest.param(["bash", "--posix"], id="bash-posix")]
STOPPED, RUNNING = 10, 0


class TagImds:
    """IMDSv2 with instance tags: a token (PUT) first; GETs without a valid one are refused (401)."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.tokens: set[str] = set()
        self.log: list[tuple[str, str, int]] = []  # (method, path, status)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def reply(self, code: int, body: str = "") -> None:
                with fake.lock:
                    fake.log.append((self.command, self.path, code))
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.reply(400)
                token = f"token-{len(fake.tokens)}"
                fake.tokens.add(token)
                self.reply(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    return self.reply(401)
                prefix = "/latest/meta-data/tags/instance/"
                key = self.path[len(prefix):] if self.path.startswith(prefix) else None
                with fake.lock:
                    value = fake.tags.get(key) if key else None
                self.reply(404, "Not Found") if value is None else self.reply(200, value)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def lease_reads(self) -> int:
        with self.lock:
            return sum(1 for m, p, c in self.log if m == "GET" and p.endswith("gputui:lease-until") and c == 200)


@pytest.fixture
def imds() -> Iterator[TagImds]:
    fake = TagImds()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@dataclass
class Box:
    """A stand-in instance: the watchdog's state, clock, console, power switch, /proc and nvidia-smi."""

    root: Path
    shell: list[str]
    url: str

    def __post_init__(self) -> None:
        for name in ("state", "proc"):
            (self.root / name).mkdir()
        self.console.write_text("")
        self.set_gpu(None)

    @property
    def console(self) -> Path:
        return self.root / "console"

    @property
    def off(self) -> Path:
        return self.root / "powered-off"

    def at(self, t: int) -> "Box":
        (self.root / "now").write_text(f"{t}\n")
        return self

    def process(self, pid: int, cmdline: str | None) -> None:
        """A process on the box (None: it ended)."""
        path = self.root / "proc" / str(pid)
        if cmdline is None:
            shutil.rmtree(path)
            return
        path.mkdir()
        (path / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")

    def set_gpu(self, utilisation: list[int] | None) -> None:
        """What nvidia-smi prints (None: there is no nvidia-smi)."""
        smi = self.root / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if utilisation is not None:
            smi.write_text("#!/bin/sh\n" + "".join(f"echo '{u}'\n" for u in utilisation))
            smi.chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTUI_WATCHDOG_")}
        env.update(GPUTUI_WATCHDOG_IMDS=self.url, GPUTUI_WATCHDOG_STATE=str(self.root / "state"),
                   GPUTUI_WATCHDOG_NOW=str(self.root / "now"), GPUTUI_WATCHDOG_CONSOLE=str(self.console),
                   GPUTUI_WATCHDOG_POWEROFF=f'echo "$GPUTUI_WATCHDOG_REASON" > "{self.off}"',
                   GPUTUI_WATCHDOG_PROC=str(self.root / "proc"),
                   GPUTUI_WATCHDOG_NVIDIA_SMI=str(self.root / "nvidia-smi"), GPUTUI_WATCHDOG_INTERVAL="0.1")
        env.update(extra)
        return env

    def once(self, **extra: str) -> int:
        """One check; its exit status (0: nothing done, 10: powered off)."""
        done = subprocess.run([*self.shell, str(SCRIPT)], env=self.env(GPUTUI_WATCHDOG_ONCE="1", **extra),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode in (RUNNING, STOPPED), done.stderr
        return done.returncode

    def reason(self) -> str | None:
        return self.off.read_text().strip() if self.off.exists() else None


@pytest.fixture(params=SHELLS)
def box(request: pytest.FixtureRequest, tmp_path: Path, imds: TagImds) -> Box:
    shell = request.param
    if shutil.which(shell[0]) is None:
        pytest.skip(f"no {shell[0]} here")
    return Box(tmp_path, shell, imds.url)


def wait_for(what: str, done: Any, bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while not done():
        assert time.monotonic() < deadline, f"gave up after {bound_s:g} s waiting for {what}"
        time.sleep(0.02)


def test_lease_passed_powers_off_and_says_why_on_the_console(box: Box, imds: TagImds) -> None:
    imds.tags["gputui:lease-until"] = "1100"
    assert box.at(1000).once() == RUNNING and box.reason() is None
    assert box.at(1099).once() == RUNNING and box.reason() is None
    assert box.at(1100).once() == STOPPED
    assert box.reason() == "lease"
    assert "gputui-watchdog: stopping: lease (lease ended at 1100, now 1100)" in box.console.read_text()
    assert parse_stop(box.console.read_text()) == ("lease", 1100.0)
    puts = [c for m, _p, c in imds.log if m == "PUT"]
    assert puts and all(c == 200 for c in puts)
    assert not [entry for entry in imds.log if entry[2] == 401]  # every GET carried its token (IMDSv2)


def test_a_lease_renewed_in_time_keeps_the_loop_running(box: Box, imds: TagImds) -> None:
    imds.tags["gputui:lease-until"] = "1100"
    box.at(1000)
    loop = subprocess.Popen([*box.shell, str(SCRIPT)], env=box.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for("two reads of the lease", lambda: imds.lease_reads() >= 2)
        imds.tags["gputui:lease-until"] = "1200"  # the master renews ...
        box.at(1090)
        seen = imds.lease_reads()
        wait_for("a read of the renewed lease", lambda: imds.lease_reads() >= seen + 2)
        box.at(1150)  # ... so the first lease passes unnoticed
        seen = imds.lease_reads()
        wait_for("two checks past the first lease", lambda: imds.lease_reads() >= seen + 2)
        assert loop.poll() is None and box.reason() is None
        box.at(1200)  # the renewed lease passes: no renewal came
        assert loop.wait(timeout=30) == STOPPED
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert box.reason() == "lease"


def test_budget_time_reached_is_its_own_reason(box: Box, imds: TagImds) -> None:
    # the master never sets the lease later than the budget's end: here they coincide
    imds.tags.update({"gputui:lease-until": "1100", "gputui:budget-until": "1100"})
    assert box.at(1099).once() == RUNNING
    assert box.at(1100).once() == STOPPED and box.reason() == "budget"
    assert "stopping: budget (budget time 1100 reached at 1100)" in box.console.read_text()


def test_idle_needs_no_gputui_run_and_gpus_under_5_percent(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:idle-seconds": "600"})
    box.process(4242, "/home/u/.gputui-cluster/venv/bin/python -m gputui.train --node 1")
    box.process(4243, "/bin/sh /usr/local/sbin/gputui-watchdog")  # the watchdog itself does not count
    assert box.at(1000).once() == RUNNING  # a run: busy
    box.process(4242, None)  # the run ends
    box.set_gpu([3, 2])
    assert box.at(1500).once() == RUNNING  # idle for 500 s of 600
    box.set_gpu([1, 40])  # a GPU busy without gputui (the user's own job)
    assert box.at(1700).once() == RUNNING
    box.set_gpu(None)  # no nvidia-smi: the GPUs count as idle
    assert box.at(2299).once() == RUNNING and box.reason() is None
    assert box.at(2300).once() == STOPPED and box.reason() == "idle"
    assert "stopping: idle (no gputui run and GPUs under 5% since 1700, now 2300)" in box.console.read_text()


def test_max_hours_from_launch(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "99999", "gputui:max-until": "2000", "gputui:launched-at": "1000"})
    assert box.at(1999).once() == RUNNING
    assert box.at(2000).once() == STOPPED and box.reason() == "max_hours"


def test_metadata_unreachable_stops_only_once_the_last_lease_read_has_passed(box: Box, imds: TagImds) -> None:
    imds.tags["gputui:lease-until"] = "1100"
    assert box.at(1000).once() == RUNNING  # read: lease 1100
    imds.tags["gputui:lease-until"] = "5000"  # renewed, but the slave can no longer read it:
    assert box.at(1050).once(GPUTUI_WATCHDOG_IMDS=DEAD) == RUNNING  # one failed read stops nothing
    assert box.reason() is None and "cannot read the instance's tags" in box.console.read_text()
    assert box.at(1099).once(GPUTUI_WATCHDOG_IMDS=DEAD) == RUNNING
    assert box.at(1100).once(GPUTUI_WATCHDOG_IMDS=DEAD) == STOPPED
    assert box.reason() == "lease"
    assert "metadata service unreachable since 1000" in box.console.read_text()


def test_metadata_unreachable_from_boot_uses_the_lease_of_the_user_data(box: Box) -> None:
    box.url = DEAD
    assert box.at(1000).once(GPUTUI_WATCHDOG_LEASE_UNTIL="1100") == RUNNING
    assert box.at(1100).once() == STOPPED and box.reason() == "lease"  # kept in the state directory


def test_a_failed_power_off_is_tried_again(box: Box, imds: TagImds) -> None:
    imds.tags["gputui:lease-until"] = "1100"
    assert box.at(1100).once(GPUTUI_WATCHDOG_POWEROFF="exit 1") == RUNNING
    assert "power-off command failed" in box.console.read_text()
    assert box.at(1130).once() == STOPPED and box.reason() == "lease"


def test_wget_instead_of_curl(tmp_path: Path, imds: TagImds) -> None:
    if shutil.which("wget") is None:
        pytest.skip("no wget here")
    wget = Box(tmp_path, ["sh"], imds.url)
    imds.tags["gputui:lease-until"] = "1100"
    assert wget.at(1000).once(GPUTUI_WATCHDOG_HTTP="wget") == RUNNING
    assert imds.lease_reads() == 1
    assert wget.at(1100).once(GPUTUI_WATCHDOG_HTTP="wget", GPUTUI_WATCHDOG_IMDS=DEAD) == STOPPED
    assert wget.reason() == "lease"


def test_user_data_installs_this_script_and_a_unit_and_is_valid_sh(tmp_path: Path) -> None:
    data = user_data({"gputui:lease-until": "1700000600", "gputui:idle-seconds": "1800", "gputui:owner": "me@laptop",
                      "gputui:max-until": "$(reboot)"})
    assert data.startswith("#!/bin/sh\n") and len(data.encode()) < 16 * 1024  # EC2's limit
    assert watchdog_script().rstrip() in data and f"cat > {INSTALL_PATH} <<'GPUTUI_WATCHDOG_EOF'" in data
    assert "GPUTUI_WATCHDOG_LEASE_UNTIL=1700000600" in data and "GPUTUI_WATCHDOG_IDLE_SECONDS=1800" in data
    assert "me@laptop" not in data and "reboot" not in data  # numbers only leave the tags
    assert "systemctl daemon-reload && systemctl enable --now gputui-watchdog.service" in data and "nohup" in data
    script = tmp_path / "user-data.sh"
    script.write_text(data)
    for shell in ("sh", "dash"):
        assert subprocess.run([shell, "-n", str(script)], capture_output=True).returncode == 0
