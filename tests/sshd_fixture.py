"""A real OpenSSH sshd on 127.0.0.1 for the telemetry tests and benchmarks.

Each server gets throwaway host and user keys, its own config (no PAM, keys only, its own
authorized_keys and pid file) and free ports; `SetEnv` puts a fake `nvidia-smi` (replaying
one recorded driver generation, see tests/data/nvsmi) first on the remote PATH and points
HOME at an empty directory, so the login shell reads no rc files. The process is killed
when the server is stopped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NVSMI_DATA = Path(__file__).resolve().parent / "data" / "nvsmi"


def logging_ps(bin_dir: Path, log: Path) -> None:
    """A `ps` in `bin_dir` that appends to `log` the arguments of each call asking for the poll's
    full columns (not its plain fallback), then runs the real `ps`."""
    real = shutil.which("ps") or "/bin/ps"
    (bin_dir / "ps").write_text(f'#!/bin/sh\ncase "$*" in *etimes*) echo "$*" >> {log};; esac\nexec {real} "$@"\n')
    (bin_dir / "ps").chmod(0o755)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A new key pair without passphrase: `path` and `path.pub`."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "gputui-test", "-f", str(path)], check=True)
    return path


@dataclass
class Sshd:
    """One sshd process serving `ports` on 127.0.0.1."""

    root: Path
    ports: list[int]
    host_key: Path
    user_key: Path
    fixture: str | None  # a directory under tests/data/nvsmi, or None: no nvidia-smi at all
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    address: str = "127.0.0.1"  # any 127.0.0.0/8 address: one "machine" per address
    path: str | None = None  # the session's PATH (default: BIN:/usr/local/bin:/usr/bin:/bin)
    extra_config: tuple[str, ...] = ()  # more sshd_config lines (e.g. the sftp Subsystem)
    home: Path | None = None  # the session's HOME (default: ROOT/home)
    log_level: str = "INFO"  # DEBUG logs each forwarded channel (a bastion's direct-tcpip requests)

    @property
    def port(self) -> int:
        return self.ports[0]

    def host_public_key(self) -> str:
        """"ssh-ed25519 AAAA..." of the server's host key."""
        return " ".join(self.host_key.with_suffix(".pub").read_text().split()[:2])

    def known_hosts_line(self, port: int | None = None) -> str:
        """A known_hosts line that trusts this server's host key on `port`."""
        return f"[{self.address}]:{port or self.port} {self.host_public_key()}\n"

    def start(self) -> "Sshd":
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        if self.fixture is not None:
            shutil.copy(NVSMI_DATA / "fake-nvidia-smi", bin_dir / "nvidia-smi")
        home = self.home or self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        (self.root / "authorized_keys").write_text(self.user_key.with_suffix(".pub").read_text())
        self.log = self.root / "sshd.log"
        env = f"PATH={self.path or f'{bin_dir}:/usr/local/bin:/usr/bin:/bin'} HOME={home}"
        if self.fixture is not None:
            env += f" NVSMI_FIXTURE={NVSMI_DATA / self.fixture}"
        lines = [f"Port {p}" for p in self.ports] + [
            f"ListenAddress {self.address}",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "UsePAM no",
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            f"SetEnv {env}",
            "MaxStartups 200",
            "MaxSessions 200",
            "PrintMotd no",
            f"LogLevel {self.log_level}",
            *self.extra_config,
        ]
        # A port free_port() found can be taken before sshd binds it (a torch store listens on every
        # interface, other tests start servers): then new ports, at most 5 tries.
        for attempt in range(5):
            config = self.root / "sshd_config"
            config.write_text("\n".join([f"Port {p}" for p in self.ports] + lines[len(self.ports):]) + "\n")
            check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
            assert check.returncode == 0, f"sshd -t: {check.stderr}"
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log,
                                                stderr=subprocess.STDOUT)
            # Ready once it says it listens on every port (connecting to check would leave a child behind).
            deadline = time.monotonic() + 10
            while True:
                said = self.log.read_text(errors="replace")
                if all(f"Server listening on {self.address} port {p}." in said for p in self.ports):
                    return self
                if self.process.poll() is not None:
                    break
                assert time.monotonic() < deadline, f"sshd did not listen on {self.ports}: {said}"
                time.sleep(0.01)
            assert "Address already in use" in said and attempt < 4, f"sshd exited: {said}"
            self.ports = [free_port() for _ in self.ports]
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """The host goes away for good: the listener first (so nothing can connect again while
        the rest goes), then every connection it forked (they outlive it otherwise)."""
        if self.process is not None and self.process.poll() is None:
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            for child in children:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(children, timeout=2)
        self.process = None


class SshdFactory:
    """Starts sshd servers sharing one host key and one authorised user key."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host_key = keygen(root / "host_ed25519")
        self.user_key = keygen(root / "user_ed25519")
        self.servers: list[Sshd] = []

    def __call__(self, fixture: str | None = "r535-a100x8", ports: int = 1) -> Sshd:
        root = self.root / f"sshd{len(self.servers)}"
        root.mkdir()
        server = Sshd(root, [free_port() for _ in range(ports)], self.host_key, self.user_key, fixture)
        self.servers.append(server)
        return server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFactory]:
    """sshd servers for a test module; all are killed when the module is done."""
    if not Path(SSHD).exists():
        pytest.fail("OpenSSH's sshd is needed (apt-get install openssh-server; .ci/run does it)")
    factory = SshdFactory(tmp_path_factory.mktemp("sshd"))
    try:
        yield factory
    finally:
        factory.stop()


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ssh-agent of the developer's may log in for a test."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
