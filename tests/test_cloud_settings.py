"""The [cloud] profile table, the public key, the SSH source address, the provider switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui.cloud.address import ssh_cidr
from gputui.cloud.lifecycle import key_pair_name
from gputui.cloud.provider import check_cluster_name
from gputui.cloud.factory import make_provider
from gputui.cloud.settings import CLOUD_SECTION, load_cloud_settings
from gputui.cloud.sim import SimProvider
from gputui.model.errors import UserError
from gputui.model.paths import profiles_dir

from .moto_fixture import public_key_line

KEYS = ("region", "zones", "instance_type", "count", "ami", "ssh_user", "public_key", "ssh_cidr", "max_price",
        "on_demand_fallback", "budget_usd", "kwh_price")


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text("[cloud]\n" + body)
    return path


def test_shipped_profile_documents_every_key() -> None:
    path = profiles_dir() / "aws-spot.toml"
    settings = load_cloud_settings(path)
    assert settings.region == "us-east-1" and settings.instance_type == "g4dn.xlarge"
    assert settings.ssh_cidr is None  # default: the caller's own address, found at launch
    assert settings.ami.startswith("ssm:/aws/service/")
    text = path.read_text()
    for key in KEYS + ("on_demand_price",):
        assert key in CLOUD_SECTION.fields and CLOUD_SECTION.fields[key].doc
        assert f"{key} =" in text  # set or shown commented out, with its explanation above
    assert load_cloud_settings(None) == settings  # the default profile of the cloud commands


@pytest.mark.parametrize("body, message", [
    ("region = \"us-east-1\"\n", r"p.toml:1: \[cloud\]: \[cloud\] needs `budget_usd`"),
    ("budget_usd = 5\nbudget = 5\n", r"p.toml:3: \[cloud\] budget: unknown key"),
    ("budget_usd = 0\n", r"p.toml:2: \[cloud\] budget_usd: expected a number > 0"),
    ("budget_usd = 5\nssh_cidr = \"10.0.0.1/8\"\n", r"p.toml:3: \[cloud\] ssh_cidr: expected a network in CIDR form"),
    ("budget_usd = 5\nssh_cidr = \"everyone\"\n", r"\[cloud\] ssh_cidr: expected a network in CIDR form"),
    ("budget_usd = 5\nregion = \"moon-1\"\n", r"\[cloud\] region: expected an AWS region"),
    ("budget_usd = 5\nzones = [\"eu-west-1a\"]\n", r"p.toml:3: \[cloud\] zones: 'eu-west-1a' is not a zone of region 'us-east-1'"),
    ("budget_usd = 5\nzones = \"us-east-1a\"\n", r"\[cloud\] zones: expected a list of strings"),
    ("budget_usd = 5\nami = \"ubuntu\"\n", r"\[cloud\] ami: expected an AMI id"),
    ("budget_usd = 5\ncount = 0\n", r"\[cloud\] count: expected a whole number >= 1"),
    ("budget_usd = 5\ninstance_type = \"big\"\n", r"\[cloud\] instance_type: expected an instance type"),
    ("budget_usd = 5\non_demand_fallback = \"yes\"\n", r"\[cloud\] on_demand_fallback: expected true or false"),
    ("budget_usd = 5\nmax_price = -1\n", r"\[cloud\] max_price: expected a number > 0"),
])
def test_bad_cloud_tables(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_cloud_settings(write(tmp_path, body))


def test_good_cloud_table_and_explicit_open_ssh(tmp_path: Path) -> None:
    settings = load_cloud_settings(write(tmp_path, 'budget_usd = 5\nssh_cidr = "0.0.0.0/0"\nzones = ["us-east-1c"]\n'
                                                   'ami = "ami-0123456789abcdef0"\nmax_price = 0.2\n'))
    assert settings.ssh_cidr == "0.0.0.0/0" and settings.zones == ("us-east-1c",) and settings.max_price == 0.2
    with pytest.raises(UserError, match="no \\[cloud\\] table"):
        load_cloud_settings(profiles_dir() / "local.toml")


def test_public_key_checks(tmp_path: Path) -> None:
    settings = load_cloud_settings(write(tmp_path, 'budget_usd = 5\npublic_key = "keys/me.pub"\n'))
    with pytest.raises(UserError, match="public key not found.*ssh-keygen"):
        settings.read_public_key()
    (tmp_path / "keys").mkdir()
    key = tmp_path / "keys" / "me.pub"  # relative to the profile
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(UserError, match="this is a private key"):
        settings.read_public_key()
    key.write_text("hello\n")
    with pytest.raises(UserError, match="not an OpenSSH public key"):
        settings.read_public_key()
    line = public_key_line()
    key.write_text(line + "\n")
    assert settings.read_public_key() == line
    # The key pair's name follows the key, not the comment.
    assert key_pair_name(line) == key_pair_name(line.rsplit(" ", 1)[0] + " other@host")
    assert key_pair_name(line) != key_pair_name(public_key_line())


def test_ssh_source_address() -> None:
    assert ssh_cidr("203.0.113.0/24", "p.toml", lambda: pytest.fail("no lookup when configured")) == "203.0.113.0/24"
    assert ssh_cidr(None, "p.toml", lambda: "192.0.2.7") == "192.0.2.7/32"
    assert ssh_cidr(None, "p.toml", lambda: "2001:db8::7") == "2001:db8::7/128"

    def offline() -> str:
        raise OSError("Network is unreachable")

    with pytest.raises(UserError, match=r"could not find this machine's public address to allow SSH from \(Network is unreachable\); "
                                        r"set ssh_cidr in \[cloud\] of p.toml"):
        ssh_cidr(None, "p.toml", offline)
    with pytest.raises(UserError, match="set ssh_cidr"):
        ssh_cidr(None, "p.toml", lambda: "<html>captive portal</html>")


def test_provider_switch(monkeypatch: pytest.MonkeyPatch, gputui_home: Path) -> None:
    monkeypatch.setenv("GPUTUI_CLOUD", "sim")
    sim = make_provider(None, "eu-west-1")
    assert isinstance(sim, SimProvider) and sim.zones() == ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    assert sim.state_path == gputui_home / "cloud-sim.json"
    assert make_provider("ec2", "eu-west-1").name == "ec2"  # the flag wins over the variable
    with pytest.raises(UserError, match="provider 'gcp'"):
        make_provider("gcp", "eu-west-1")
    assert check_cluster_name("exp-1.a") == "exp-1.a"
    with pytest.raises(UserError, match="--cluster"):
        check_cluster_name("no spaces")


def test_cloud_help_is_fast_and_imports_no_cloud_sdk() -> None:
    import subprocess
    import sys

    code = ("import sys, gputui.cli; gputui.cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'textual', 'torch')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_cloud_proxy_jump_reaches_the_slaves_ssh_spec(tmp_path: Path) -> None:
    """[cloud] proxy_jump is validated as [[hosts]] proxy_jump is, and cloud slaves' SSH goes through it."""
    from gputui.cluster.manager import default_host_spec
    from gputui.cluster.settings import load_cluster

    path = tmp_path / "c.toml"
    path.write_text('[cloud]\nbudget_usd = 1\nproxy_jump = "me@bastion:2222,jump2"\n'
                    '[cluster]\nname = "c"\nnodes = 2\ncloud_slaves = 1\n')
    settings = load_cluster(path)
    assert settings.cloud is not None and settings.cloud.proxy_jump == "me@bastion:2222,jump2"
    from gputui.model.cloud import InstanceInfo

    info = InstanceInfo("i-1", "g4dn.xlarge", "us-east-1a", "running", "spot", 0.0, public_ip="203.0.113.9")
    spec = default_host_spec(settings)(info)
    assert spec.proxy_jump == "me@bastion:2222,jump2" and spec.address == "203.0.113.9"
    with pytest.raises(UserError, match="proxy_jump"):
        load_cloud_settings(write(tmp_path, 'budget_usd = 1\nproxy_jump = "-oProxyCommand=touch /tmp/x"\n'))
