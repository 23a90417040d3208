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
        for name in ("state", "proc", "home"):
            (self.root / name).mkdir()
        self.console.write_text("")
        self.set_gpu(None)

    @property
    def console(self) -> Path:
        return self.root / "console"

    @property
    def off(self) -> Path:
        return self.root / "powered-off"

    @property
    def home(self) -> Path:
        """The gputui home of the slave's runs (a node's GPUTUI_HOME: <remote_dir>/home)."""
        return self.root / "home"

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

    @property
    def hung(self) -> Path:
        return self.root / "nvidia-smi-started"

    def hang_gpu(self) -> None:
        """An nvidia-smi that never answers (a GPU off the bus, Xid 79); each start notes its pid."""
        smi = self.root / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho $$ >> '{self.hung}'\nexec sleep 1000\n")
        smi.chmod(0o755)

    def hung_starts(self) -> list[int]:
        return [int(p) for p in self.hung.read_text().split()] if self.hung.exists() else []

    def end_hung(self) -> None:
        for pid in self.hung_starts():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def register(self, pid: int, started: str = "") -> None:
        """A run registered as the spot watcher does it: <home>/watched/<pid> holding its start time."""
        (self.home / "watched").mkdir(exist_ok=True)
        (self.home / "watched" / str(pid)).write_text(started)

    def heartbeat(self, t: int) -> None:
        (self.home / "heartbeat").write_text(f"{t}\n")

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTUI_WATCHDOG_")}
        env.update(GPUTUI_WATCHDOG_IMDS=self.url, GPUTUI_WATCHDOG_STATE=str(self.root / "state"),
                   GPUTUI_WATCHDOG_NOW=str(self.root / "now"), GPUTUI_WATCHDOG_CONSOLE=str(self.console),
                   GPUTUI_WATCHDOG_POWEROFF=f'echo "$GPUTUI_WATCHDOG_REASON" > "{self.off}"',
                   GPUTUI_WATCHDOG_PROC=str(self.root / "proc"),
                   GPUTUI_WATCHDOG_NVIDIA_SMI=str(self.root / "nvidia-smi"), GPUTUI_WATCHDOG_INTERVAL="0.1",
                   GPUTUI_WATCHDOG_HOMES=str(self.home), GPUTUI_WATCHDOG_TIMEOUT="1")
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
def box(request: pytest.FixtureRequest, tmp_path: Path, imds: TagImds) -> Iterator[Box]:
    shell = request.param
    if shutil.which(shell[0]) is None:
        pytest.skip(f"no {shell[0]} here")
    made = Box(tmp_path, shell, imds.url)
    yield made
    made.end_hung()


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


# -- nothing that can hang comes before the lease, the budget and the maximum life ---------------

def test_a_hung_nvidia_smi_does_not_hold_back_a_passed_lease(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "1100", "gputui:idle-seconds": "600"})
    box.hang_gpu()
    assert box.at(1100).once() == STOPPED and box.reason() == "lease"
    assert box.hung_starts() == []  # decided from the stored lease, nvidia-smi never asked


def test_a_hung_nvidia_smi_is_cut_off_and_the_loop_stops_at_the_lease(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "1100", "gputui:idle-seconds": "600"})
    box.hang_gpu()
    box.at(1000)
    loop = subprocess.Popen([*box.shell, str(SCRIPT)], env=box.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # the loop goes on past a hung nvidia-smi: a second check starts it again
        wait_for("a second check after a hung nvidia-smi", lambda: len(box.hung_starts()) >= 2)
        assert loop.poll() is None and box.reason() is None
        box.at(1100)
        assert loop.wait(timeout=30) == STOPPED
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert box.reason() == "lease"


def test_a_probe_no_signal_reaches_is_never_waited_for_nor_started_twice(box: Box, imds: TagImds) -> None:
    """Without `timeout` the hung nvidia-smi stays (as one in uninterruptible sleep would): the check
    gives up on it, and no second one piles up while it hangs."""
    bin_dir = box.root / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name != "timeout" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(folder, name))
    imds.tags.update({"gputui:lease-until": "1100", "gputui:idle-seconds": "600"})
    box.hang_gpu()
    assert box.at(1000).once(PATH=str(bin_dir)) == RUNNING
    assert len(box.hung_starts()) == 1
    assert box.at(1050).once(PATH=str(bin_dir)) == RUNNING
    assert len(box.hung_starts()) == 1  # still hanging: not started again
    assert box.at(1100).once(PATH=str(bin_dir)) == STOPPED and box.reason() == "lease"


@pytest.mark.parametrize("name,reason", [("lease-until", "lease"), ("budget-until", "budget"),
                                         ("max-until", "max_hours")])
@pytest.mark.parametrize("text", ["", "11x0\n"])
def test_an_empty_or_garbled_stored_limit_counts_as_passed(box: Box, name: str, reason: str, text: str) -> None:
    if name != "lease-until":
        (box.root / "state" / "lease-until").write_text("9000\n")
    (box.root / "state" / name).write_text(text)
    assert box.at(1000).once(GPUTUI_WATCHDOG_IMDS=DEAD) == STOPPED and box.reason() == reason


def test_state_files_are_replaced_whole_never_rewritten_in_place(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "1100", "gputui:idle-seconds": "600"})
    assert box.at(1000).once() == RUNNING
    state = box.root / "state"
    before = {name: (state / name).stat().st_ino for name in ("lease-until", "read-at")}
    imds.tags["gputui:lease-until"] = "1200"
    assert box.at(1010).once() == RUNNING
    after = {name: (state / name).stat().st_ino for name in before}
    assert all(after[n] != before[n] for n in before), (before, after)  # a new file renamed over the old
    assert (state / "lease-until").read_text() == "1200\n"
    assert not [p.name for p in state.iterdir() if p.name.endswith(".tmp")]


# -- stalled: a run registered, no training step for stalled-seconds ------------------------------

def test_a_registered_run_without_a_step_for_stalled_seconds_powers_off(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:stalled-seconds": "600"})
    box.process(4242, "/home/u/.gputui-cluster/venv/bin/python -m gputui.cluster.node --spot-watcher")
    box.register(4242)
    box.heartbeat(1000)
    assert box.at(1000).once() == RUNNING
    box.heartbeat(1400)  # a step
    assert box.at(1999).once() == RUNNING and box.reason() is None  # 599 s since it
    assert box.at(2000).once() == STOPPED and box.reason() == "stalled"
    console = box.console.read_text()
    assert "gputui-watchdog: stopping: stalled (no training progress since 1400, now 2000)" in console
    assert parse_stop(console) == ("stalled", 2000.0)


def test_a_fresh_heartbeat_keeps_a_registered_run_going(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:stalled-seconds": "600"})
    box.process(4242, "python -m gputui worker --device cuda:0")
    box.register(4242)
    for t in (1000, 1500, 2000, 2500, 3000):
        box.heartbeat(t - 1)
        assert box.at(t).once() == RUNNING
    assert box.reason() is None


def test_without_a_registered_run_an_old_heartbeat_stops_nothing(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:stalled-seconds": "600"})
    box.heartbeat(100)
    assert box.at(1000).once() == RUNNING
    box.register(4242)  # an entry whose process is gone (no /proc entry) is no run either
    assert box.at(5000).once() == RUNNING and box.reason() is None


def test_a_run_that_never_steps_counts_from_when_it_was_first_seen(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:stalled-seconds": "600"})
    box.heartbeat(100)  # an earlier run's
    assert box.at(1000).once() == RUNNING
    box.process(4242, "python -m gputui.cluster.node")
    box.register(4242)
    assert box.at(1200).once() == RUNNING  # first seen now
    assert box.at(1799).once() == RUNNING
    assert box.at(1800).once() == STOPPED and box.reason() == "stalled"


def test_a_pid_reused_by_another_process_is_no_registered_run(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "9000", "gputui:stalled-seconds": "600"})
    box.process(4242, "vim notes.txt")
    stat = "4242 (vim) S" + "".join(f" {n}" for n in range(2, 60))  # field 22 (the start time): 20
    (box.root / "proc" / "4242" / "stat").write_text(stat)
    box.register(4242, started="19")  # the run registered had started at 19
    assert box.at(1000).once() == RUNNING and box.at(5000).once() == RUNNING
    box.register(4242, started="20")  # the same process: a run
    assert box.at(5000).once() == RUNNING
    assert box.at(5600).once() == STOPPED and box.reason() == "stalled"


def test_stalled_seconds_zero_never_stops(box: Box, imds: TagImds) -> None:
    imds.tags.update({"gputui:lease-until": "99999", "gputui:stalled-seconds": "0"})
    box.process(4242, "python -m gputui.cluster.node")
    box.register(4242)
    assert box.at(1000).once() == RUNNING and box.at(90000).once() == RUNNING


def test_the_user_data_carries_the_stalled_limit(tmp_path: Path) -> None:
    data = user_data({"gputui:lease-until": "1700000600", "gputui:stalled-seconds": "3600"})
    assert "GPUTUI_WATCHDOG_STALLED_SECONDS=3600" in data


def test_a_watchdog_stop_for_stalled_is_recorded_as_self_stalled() -> None:
    from gputui.cloud.lease import ended_how
    from gputui.cloud.tags import SELF_STOP_CODE
    from gputui.model.cloud import InstanceInfo

    info = InstanceInfo("i-1", "g4dn.xlarge", "us-east-1a", "terminated", "spot", 1000.0, None,
                        tags={"gputui:lease-until": "9000"}, state_reason=SELF_STOP_CODE)
    console = "gputui-watchdog: stopping: stalled (no training progress since 1400, now 2000)\n"
    ending = ended_how(None, info, 2100.0, console=lambda _id: console)
    assert (ending.kind, ending.ended_by, ending.when) == ("self_stop", "self:stalled", 2000.0)
    assert "no progress" in ending.why or "stalled" in ending.why
