"""The EC2 provider and `gputui cloud` against moto's EC2 server on loopback."""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cli import main
from gputui.cloud.ec2 import Ec2Provider
from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import key_pair_name

from .moto_fixture import (DUMMY_KEY_ID, DUMMY_SECRET, DUMMY_TOKEN, OWNER, REGION, SSH_CIDR, Aws, aws,  # noqa: F401
                           cli, moto_server)
from .proc_support import wait_until


@contextmanager
def echo_server(body: bytes) -> Iterator[str]:
    """A loopback HTTP server answering every GET with `body` (a stand-in for checkip)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def up(aws: Aws, *extra: str) -> int:
    return main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard", *extra])


def instances(aws: Aws, **filters: str) -> list[dict[str, Any]]:
    f = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    f += [{"Name": f"tag:{k}", "Values": [v]} for k, v in filters.items()]
    pages = aws.ec2().describe_instances(Filters=f)["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def ingress(aws: Aws) -> list[dict[str, Any]]:
    group = aws.ec2().describe_security_groups(Filters=[{"Name": "group-name", "Values": ["gputui-cluster"]}])
    assert len(group["SecurityGroups"]) == 1
    return list(group["SecurityGroups"][0]["IpPermissions"])


def test_up_launches_tagged_spot_instances_with_an_imported_key(aws: Aws, capsys: pytest.CaptureFixture[str]) -> None:
    operations: list[str] = []
    import botocore.client  # type: ignore[import-untyped]

    original = botocore.client.BaseClient._make_api_call

    def spy(self: Any, name: str, params: Any) -> Any:
        operations.append(name)
        return original(self, name, params)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(botocore.client.BaseClient, "_make_api_call", spy)
        assert up(aws, "--count", "3") == 0
    out = capsys.readouterr()
    found = instances(aws, **{"gputui:cluster": "cluster"})
    assert len(found) == 3
    for inst in found:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["gputui:managed"] == "true" and tags["gputui:owner"] == OWNER and tags["Name"] == "gputui-cluster"
        assert inst["InstanceLifecycle"] == "spot"
        assert inst["Placement"]["AvailabilityZone"] in (f"{REGION}a", f"{REGION}b")
        assert inst["KeyName"] == key_pair_name(aws.public_key)
        assert inst["State"]["Name"] == "running" and inst["PublicIpAddress"]
        assert inst["InstanceId"] in out.out  # the table names each instance and its address
        assert inst["PublicIpAddress"] in out.out
    # The key pair was imported from the public key; no private key was ever made.
    assert "ImportKeyPair" in operations and "CreateKeyPair" not in operations
    assert "GetParameter" in operations  # the ssm: AMI was resolved
    key = aws.ec2().describe_key_pairs(KeyNames=[key_pair_name(aws.public_key)])["KeyPairs"][0]
    assert key["KeyType"] == "ed25519"
    assert not list(aws.home.rglob("*id_*")) and not list(aws.home.rglob("*.pem"))
    # SSH from the configured CIDR only; everything within the group; never the whole internet.
    rules = ingress(aws)
    ssh = [r for r in rules if r["IpProtocol"] == "tcp"]
    assert len(ssh) == 1 and (ssh[0]["FromPort"], ssh[0]["ToPort"]) == (22, 22)
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == [SSH_CIDR]
    everything = [r for r in rules if r["IpProtocol"] == "-1"]
    assert len(everything) == 1 and not everything[0]["IpRanges"]
    assert [g["GroupId"] for g in everything[0]["UserIdGroupPairs"]] == [found[0]["SecurityGroups"][0]["GroupId"]]
    assert "0.0.0.0/0" not in json.dumps(rules) and "::/0" not in json.dumps(rules)
    # The ledger knows them, as spot instances of this cluster, running.
    with Ledger() as ledger:
        records = ledger.instances(running=True)
    assert {r.instance_id for r in records} == {i["InstanceId"] for i in found}
    assert all(r.cluster == "cluster" and r.lifecycle == "spot" and r.state == "running" for r in records)


def test_rerunning_up_reuses_key_and_group_and_moves_the_ssh_rule(aws: Aws) -> None:
    assert up(aws) == 0
    first_rules = ingress(aws)
    aws.write_profile(ssh_cidr="203.0.113.0/28")
    assert up(aws) == 0
    assert len(aws.ec2().describe_key_pairs()["KeyPairs"]) == 1
    rules = ingress(aws)
    cidrs = [r["CidrIp"] for rule in rules if rule["IpProtocol"] == "tcp" for r in rule["IpRanges"]]
    assert cidrs == ["203.0.113.0/28"]  # the old address is revoked, not left open
    assert len([r for r in rules if r["IpProtocol"] == "-1"]) == len([r for r in first_rules if r["IpProtocol"] == "-1"]) == 1
    assert len(instances(aws)) == 2


def test_open_ssh_only_when_written_explicitly(aws: Aws) -> None:
    aws.write_profile(ssh_cidr="0.0.0.0/0")
    assert up(aws) == 0
    assert "0.0.0.0/0" in json.dumps(ingress(aws))


def test_ssh_cidr_defaults_to_the_callers_address(aws: Aws, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    aws.write_profile(ssh_cidr=None)
    # The lookup URL points at a closed port: a one-line error telling the user what to set.
    assert up(aws) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "set ssh_cidr in [cloud]" in err and "Traceback" not in err
    assert instances(aws) == []
    # With an address found (an echo service on loopback here), the rule is that address as a /32.
    with echo_server(b"192.0.2.44\n") as url:
        monkeypatch.setenv("GPUTUI_PUBLIC_IP_URL", url)
        assert up(aws) == 0
    assert [r["CidrIp"] for rule in ingress(aws) if rule["IpProtocol"] == "tcp" for r in rule["IpRanges"]] == ["192.0.2.44/32"]


def test_ls_marks_orphans_and_sweep_terminates_only_them(aws: Aws, capsys: pytest.CaptureFixture[str]) -> None:
    assert up(aws, "--count", "2") == 0
    ec2 = aws.ec2()
    def orphan(owner: str) -> str:
        tags = [{"Key": "gputui:managed", "Value": "true"}, {"Key": "gputui:cluster", "Value": "lost"},
                {"Key": "gputui:owner", "Value": owner}]
        reply = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g4dn.xlarge",
                                  TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        return str(reply["Instances"][0]["InstanceId"])
    mine, theirs = orphan(OWNER), orphan("someone@else")
    stranger = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    capsys.readouterr()
    assert main(["cloud", "ls", "--profile", str(aws.profile), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    by_id = {i["id"]: i for i in listing["instances"]}
    assert stranger not in by_id  # only gputui's instances
    assert by_id[mine]["orphan"] and by_id[theirs]["orphan"] and by_id[mine]["cost_usd"] is None
    assert sum(not i["orphan"] for i in listing["instances"]) == 2
    # Each known rate names its source (EC2's spot price history, asked today); orphans have none yet.
    assert all(i["price_source"].startswith("api 20") for i in listing["instances"] if not i["orphan"])
    assert by_id[mine]["price_source"] is None
    assert main(["cloud", "ls", "--profile", str(aws.profile)]) == 0
    table = capsys.readouterr().out
    assert "ORPHAN" in table and "(api 20" in table
    # Without a terminal and without --yes, a destructive command refuses.
    assert main(["cloud", "sweep", "--profile", str(aws.profile)]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert main(["cloud", "sweep", "--profile", str(aws.profile), "--yes"]) == 0
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert states[mine] == "terminated" and states[theirs] == "running" and states[stranger] == "running"
    assert sum(s == "running" for s in states.values()) == 4
    with Ledger() as ledger:
        swept = ledger.get(mine)
    assert swept is not None and swept.ended_by == "sweep" and swept.cluster == "lost"
    # An on-demand orphan is metered at the region's on-demand price: the Pricing API cannot be
    # reached here, so the table's, saying so.
    assert swept.hourly_price == 0.526 and getattr(swept.hourly_price, "source", None) == "table 2024-06-01"
    assert main(["cloud", "sweep", "--profile", str(aws.profile), "--yes", "--any-owner"]) == 0
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert states[theirs] == "terminated" and states[stranger] == "running"


def test_down_by_id_and_all(aws: Aws, capsys: pytest.CaptureFixture[str]) -> None:
    assert up(aws, "--count", "3") == 0
    ids = sorted(i["InstanceId"] for i in instances(aws))
    stranger = aws.ec2().run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    assert main(["cloud", "down", "--profile", str(aws.profile), stranger, "--yes"]) == 2
    assert "not launched by gputui" in capsys.readouterr().err
    assert main(["cloud", "down", "--profile", str(aws.profile), "i-0123456789abcdef0", "--yes"]) == 2
    assert main(["cloud", "down", "--profile", str(aws.profile), "--yes"]) == 2  # neither ids nor --all
    assert main(["cloud", "down", "--profile", str(aws.profile), ids[0], "--yes"]) == 0
    assert sorted(i["InstanceId"] for i in instances(aws, **{"gputui:managed": "true"})) == ids[1:]
    assert main(["cloud", "down", "--profile", str(aws.profile), "--all", "--yes"]) == 0
    assert instances(aws, **{"gputui:managed": "true"}) == []
    assert [i["InstanceId"] for i in instances(aws)] == [stranger]
    with Ledger() as ledger:
        records = ledger.instances()
    assert len(records) == 3 and all(r.ended_by == "user" and r.terminated is not None for r in records)
    capsys.readouterr()
    assert main(["cloud", "down", "--profile", str(aws.profile), "--all", "--yes"]) == 0  # idempotent
    assert "nothing to stop" in capsys.readouterr().err


def test_poll_records_instances_ended_outside_gputui(aws: Aws, capsys: pytest.CaptureFixture[str]) -> None:
    assert up(aws, "--count", "2") == 0
    gone = instances(aws)[0]["InstanceId"]
    aws.ec2().terminate_instances(InstanceIds=[gone])
    capsys.readouterr()
    assert main(["cloud", "ls", "--profile", str(aws.profile), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in listing["events"]] == ["terminated"] and listing["events"][0]["instance_id"] == gone
    with Ledger() as ledger:
        rec = ledger.get(gone)
    assert rec is not None and rec.ended_by == "external" and rec.terminated is not None


def test_prices_table_and_json(aws: Aws, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cloud", "prices", "--profile", str(aws.profile), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [q["zone"] for q in data["quotes"]] == [f"{REGION}a", f"{REGION}b"]
    quote = data["quotes"][0]
    assert quote["spot_usd_per_hour"] > 0 and quote["on_demand_usd_per_hour"] == 0.526
    # moto has no Pricing API: the shipped table stands in, and says so
    assert quote["on_demand_source"] == "table 2024-06-01" and quote["spot_source"].startswith("api 20")
    assert quote["saving"] == pytest.approx(1 - quote["spot_usd_per_hour"] / 0.526, abs=1e-4)
    assert main(["cloud", "prices", "--profile", str(aws.profile), "--type", "p3.2xlarge"]) == 0
    out = capsys.readouterr().out
    assert "p3.2xlarge" in out and "$3.0600" in out and "on-demand (table 2024-06-01)" in out


def test_provider_lists_zones_and_resolves_ssm(aws: Aws) -> None:
    provider = Ec2Provider(REGION)
    assert f"{REGION}a" in provider.zones()
    assert provider.resolve_image("ami-0123456789abcdef0") == "ami-0123456789abcdef0"
    assert provider.resolve_image("ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64").startswith("ami-")
    from gputui.model.errors import UserError

    with pytest.raises(UserError, match="no such SSM parameter"):
        provider.resolve_image("ssm:/no/such/parameter")


def test_cli_up_then_down_and_nothing_leaks(aws: Aws) -> None:
    # How long up + down take (10 s target) is measured by benchmarks/bench_cloud_updown.py.
    launched = cli("cloud", "up", "--count", "4", "--yes", "--guard-interval", "0.5", "--profile", str(aws.profile))
    downed = cli("cloud", "down", "--all", "--yes", "--profile", str(aws.profile))
    assert launched.returncode == 0, launched.stderr
    assert downed.returncode == 0, downed.stderr
    assert "4 instances up" in launched.stdout, launched.stdout
    assert instances(aws, **{"gputui:managed": "true"}) == []
    listed = cli("cloud", "ls", "--json", "--profile", str(aws.profile))
    cost = cli("cost", "--json")
    outputs = [r.stdout + r.stderr for r in (launched, downed, listed, cost)]
    # The background budget guard polled moto meanwhile and leaves once the slaves are gone.
    log = next((aws.home / "logs" / "guards").glob("*.log"))
    wait_until(lambda: "the guard stops" in log.read_text(), 60, "the guard to leave after the slaves went",
               detail=log.read_text)
    database = "\n".join(sqlite3.connect(aws.home / "ledger.sqlite3").iterdump())
    everything = "\n".join(outputs) + log.read_text() + database
    for secret in (DUMMY_KEY_ID, DUMMY_SECRET, DUMMY_TOKEN):
        assert secret not in everything
    assert "launched" in database and "terminated" in database  # the ledger did record events
    assert json.loads(cost.stdout)["clusters"][0]["cluster"] == "cluster"


def test_headless_up_without_yes_refuses(aws: Aws) -> None:
    result = cli("cloud", "up", "--profile", str(aws.profile))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("gputui: error: gputui cloud up launches paid instances")
    assert instances(aws) == []


def test_refused_credentials_are_one_line(aws: Aws, tmp_path: Path) -> None:
    import os

    env = dict(os.environ)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(name)
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "gputui", "cloud", "ls", "--profile", str(aws.profile)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("gputui: error: no AWS credentials found; run `aws configure`, set AWS_PROFILE, "
                                     "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


def test_without_an_endpoint_nothing_leaves_the_machine(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture's guard: a client that is not pointed at moto fails fast instead of calling AWS."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    from gputui.model.errors import GputuiError

    with pytest.raises(GputuiError, match="cannot reach AWS"):
        Ec2Provider(REGION).zones()
