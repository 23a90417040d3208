"""moto's EC2/SSM server on loopback for the cloud tests, with dummy credentials.

Nothing can reach AWS: every AWS client goes to moto through AWS_ENDPOINT_URL, and
HTTP(S)_PROXY point at a closed loopback port with only loopback exempt, so a request
that escaped the endpoint setting would fail instead of leaving the machine. moto has no
Pricing API (its server prints to stdout when asked), so AWS_ENDPOINT_URL_PRICING points
at that closed port too: on-demand prices come from the shipped table, as with no network.
"""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import cli_env

# Dummy credentials; the tests grep every output for them.
DUMMY_KEY_ID = "AKIAGPUTUITESTDUMMY7"
DUMMY_SECRET = "gputui+Dummy/Secret/Key/0123456789abcdefXYZ"
DUMMY_TOKEN = "FwoGZXIvYXdzEGputuiDummySessionToken0123456789"
DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens
REGION = "us-east-1"
SSM_AMI = "ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
OWNER = "tester@gputui-tests"
SSH_CIDR = "198.51.100.7/32"


@dataclass(frozen=True)
class Aws:
    """A reset moto server and a profile pointing at it."""

    endpoint: str
    profile: Path
    public_key: str
    home: Path

    def ec2(self) -> Any:
        import boto3  # type: ignore[import-untyped]

        return boto3.session.Session(region_name=REGION).client("ec2")

    def write_profile(self, **overrides: Any) -> Path:
        """The test profile with some keys changed (None drops a key)."""
        values: dict[str, Any] = {
            "region": REGION, "zones": [f"{REGION}a", f"{REGION}b"], "instance_type": "g4dn.xlarge", "count": 1,
            "ami": SSM_AMI, "ssh_user": "ec2-user", "public_key": "id_test.pub", "ssh_cidr": SSH_CIDR,
            "on_demand_fallback": False, "budget_usd": 50.0,
        }
        values.update(overrides)
        lines = ["[cloud]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items() if v is not None]
        self.profile.write_text("\n".join(lines) + "\n")
        return self.profile


def public_key_line() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode() + " tester@gputui-tests"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws_environment(endpoint: str, home: Path) -> dict[str, str]:
    """The variables every cloud test (and every CLI it starts) runs with."""
    return {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
        "AWS_SESSION_TOKEN": DUMMY_TOKEN, "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY, "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "AWS_ENDPOINT_URL_PRICING": DEAD_PROXY,
        "GPUTUI_OWNER": OWNER, "GPUTUI_PUBLIC_IP_URL": DEAD_PROXY + "/", "GPUTUI_CLOUD": "ec2",
    }


@pytest.fixture
def aws(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gputui_home: Path) -> Aws:
    """A freshly reset moto, dummy credentials, and a profile with a public key next to it."""
    for name in ("AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_environment(moto_server, tmp_path).items():
        monkeypatch.setenv(name, value)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=10).read()
    key = public_key_line()
    (tmp_path / "id_test.pub").write_text(key + "\n")
    aws = Aws(moto_server, tmp_path / "cluster.toml", key, gputui_home)
    aws.write_profile()
    return aws


def cli(*args: str, timeout: float = 60, **popen: Any) -> Any:
    """`python -m gputui ARGS` in a subprocess with the current (test) environment."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "gputui", *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(), stdin=subprocess.DEVNULL, **popen)


def sim_cloud_profile(tmp_path: Path, monkeypatch: Any, name: str, budget: float, launch_delay: str,
                      extra: str = "") -> Path:
    """A profile whose [cloud] runs on the simulated cloud (GPUTUI_CLOUD=sim), with `extra` tables after it."""
    monkeypatch.setenv("GPUTUI_CLOUD", "sim")
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", launch_delay)
    monkeypatch.setenv("GPUTUI_PUBLIC_IP_URL", "http://127.0.0.1:9/")
    (tmp_path / "id.pub").write_text(public_key_line() + "\n")
    profile = tmp_path / f"{name}.toml"
    profile.write_text('[cloud]\nzones = ["us-east-1a", "us-east-1b"]\npublic_key = "id.pub"\n'
                       f'ssh_cidr = "198.51.100.7/32"\nbudget_usd = {budget}\n' + extra)
    return profile

