"""A cloud slave's SSH host key is learnt from its console output (through the cloud's API,
which the network cannot forge), pinned in gputui's known_hosts, and forgotten when the
instance is terminated; a slave presenting another key is refused with one line."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cloud.ec2 import Ec2Provider
from gputui.cloud.lifecycle import terminate
from gputui.cloud.provider import parse_console_host_keys
from gputui.cloud.sim import SimScript
from gputui.cluster.manager import CloudSlave, SlaveManager
from gputui.model.errors import GputuiError, UserError

from .sshd_fixture import SSHD, Sshd, SshdFactory, keygen
from .test_cluster_manager import manager

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"


def block(*keys: str) -> str:
    return "-----BEGIN SSH HOST KEY KEYS-----\n" + "".join(f"{k} root@ip-10-0-0-1\n" for k in keys) + \
        "-----END SSH HOST KEY KEYS-----\n"


def test_console_keys_come_from_the_last_block_and_junk_is_ignored() -> None:
    text = ("boot 1\n" + block(RSA) + "reboot\nci-info: no-keys\n"
            + block(ED, "ssh-ed25519 not!base64", "fake-type AAAA", "ecdsa-sha2-nistp256") + "login:")
    assert parse_console_host_keys(text) == [ED]
    assert parse_console_host_keys("booting, no keys yet\n") == []
    assert parse_console_host_keys(block(RSA)) == [RSA]


def test_ec2_reads_the_latest_console_output() -> None:
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        encoded = base64.b64encode(("Cloud-init v. 24\n" + block(ED)).encode()).decode()
        stub.add_response("get_console_output", {"InstanceId": "i-1", "Output": encoded},
                          {"InstanceId": "i-1", "Latest": True})
        assert Ec2Provider("us-east-1", client=client).console_host_keys("i-1") == [ED]
        stub.assert_no_pending_responses()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SshdFactory, Sshd]]:
    if not Path(SSHD).exists():
        pytest.fail("OpenSSH's sshd is needed (apt-get install openssh-server; .ci/run does it)")
    factory = SshdFactory(tmp_path_factory.mktemp("hostkeys"))
    try:
        yield factory, factory(None)
    finally:
        factory.stop()


def slave_at(m: SlaveManager, clock: Any, server: Sshd, key: Path) -> CloudSlave:
    """A simulated cloud slave that "is" the loopback sshd."""
    (started,) = m.ensure(1)
    clock.now += 60  # it runs
    return replace(started, spec=replace(started.spec, address="127.0.0.1", port=server.port, user="root",
                                         identity_file=key))


def known(home: Path) -> list[str]:
    path = home / "known_hosts"
    return path.read_text().splitlines() if path.exists() else []


def test_the_console_key_is_pinned_and_the_slave_reached(
    sshd: tuple[SshdFactory, Sshd], tmp_path: Path, gputui_home: Path,
) -> None:
    factory, server = sshd
    # An old instance's key for the same address is in the file: the pin replaces it.
    gputui_home.mkdir(parents=True, exist_ok=True)
    (gputui_home / "known_hosts").write_text(f"[127.0.0.1]:{server.port} {ED}\nother.example {RSA}\n")
    m, clock = manager(tmp_path, SimScript(seed=3, launch_delay_s=20, host_keys=(server.host_public_key(),)))
    slave = slave_at(m, clock, server, factory.user_key)
    conn = m.connect(slave, wait_s=0)
    try:
        assert conn.check("echo up").strip() == "up"
    finally:
        conn.close()
    assert known(gputui_home) == [f"other.example {RSA}", f"[127.0.0.1]:{server.port} {server.host_public_key()}"]


def test_a_slave_presenting_another_key_is_refused_in_one_line(
    sshd: tuple[SshdFactory, Sshd], tmp_path: Path, gputui_home: Path,
) -> None:
    factory, server = sshd
    impostor = keygen(tmp_path / "impostor").with_suffix(".pub").read_text().split()[:2]
    m, clock = manager(tmp_path, SimScript(seed=3, launch_delay_s=20, host_keys=(" ".join(impostor),)))
    slave = slave_at(m, clock, server, factory.user_key)
    with pytest.raises(UserError) as info:
        m.connect(slave, wait_s=0)
    message = str(info.value)
    assert "\n" not in message and "has CHANGED" in message and "refused" in message, message
    # The fix names the file that holds the pinned key: gputui's own, not ~/.ssh/known_hosts.
    assert f"-f {gputui_home / 'known_hosts'}" in message, message


def test_no_console_key_is_an_error_unless_trust_on_first_use(
    sshd: tuple[SshdFactory, Sshd], tmp_path: Path, gputui_home: Path,
) -> None:
    factory, server = sshd
    m, clock = manager(tmp_path, SimScript(seed=3, launch_delay_s=20))  # its console never shows keys
    slave = slave_at(m, clock, server, factory.user_key)
    before = clock.now
    with pytest.raises(GputuiError, match=r"no SSH host key in its console output after 5 s .*trust_on_first_use"):
        m.connect(slave, wait_s=5)
    assert clock.now == before + 5, "it did not wait for the console for the time it was given"
    assert known(gputui_home) == []
    # Opting in accepts the first key offered, and records it.
    trusting = replace(slave, spec=replace(slave.spec, trust_on_first_use=True))
    m.connect(trusting, wait_s=0).close()
    assert known(gputui_home) == [f"[127.0.0.1]:{server.port} {server.host_public_key()}"]


def test_terminating_a_slave_forgets_its_pinned_key(tmp_path: Path, gputui_home: Path) -> None:
    m, clock = manager(tmp_path, SimScript(seed=3, launch_delay_s=20, shutdown_delay_s=5, host_keys=(ED,)))
    (slave,) = m.ensure(1)
    clock.now += 60
    m.pin_host_key(slave, wait_s=0)
    assert known(gputui_home) == [f"{slave.spec.address} {ED}"]
    terminate(m.ctx, m.ctx.provider.describe([slave.instance_id]), ended_by="user")
    assert known(gputui_home) == []
