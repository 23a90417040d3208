"""What moto cannot do: capacity, price and quota refusals, refused credentials and
missing permissions, through botocore's Stubber on a real EC2 client."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Iterator

import pytest
from botocore.stub import ANY, Stubber  # type: ignore[import-untyped]

from gputui.cli import main
from gputui.cloud import factory as provider_module
from gputui.cloud.ec2 import Ec2Provider
from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import key_pair_name, launch, plan_launch
from gputui.cloud.context import CloudContext
from gputui.cloud.settings import CloudSettings
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import LaunchAttempt

from .moto_fixture import DEAD_PROXY, DUMMY_KEY_ID, DUMMY_SECRET, public_key_line

REGION = "us-east-1"
CIDR = "198.51.100.7/32"


class FixedPrices:
    def __init__(self, prices: dict[str, float]) -> None:
        self.prices = prices

    def spot_prices(self, instance_type: str, zones: Any) -> dict[str, float]:
        return {z: p for z, p in self.prices.items() if not zones or z in zones}


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Ec2Provider, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", DEAD_PROXY)  # the Stubber answers; nothing is sent anywhere
    monkeypatch.setenv("HTTPS_PROXY", DEAD_PROXY)
    provider = Ec2Provider(REGION)
    with Stubber(provider.ec2) as stub:
        yield provider, stub
        stub.assert_no_pending_responses()


def context(tmp_path: Path, provider: Ec2Provider, fallback: bool = True, max_price: float | None = None) -> CloudContext:
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    settings = CloudSettings(budget_usd=10.0, region=REGION, zones=(f"{REGION}a", f"{REGION}b"), ssh_cidr=CIDR,
                             ami="ami-0123456789abcdef0", public_key=str(key), on_demand_fallback=fallback,
                             max_price=max_price, source=tmp_path / "p.toml")
    prices = FixedPrices({f"{REGION}a": 0.16, f"{REGION}b": 0.21})
    return CloudContext(settings, provider, Ledger(tmp_path / "ledger.sqlite3"), "c1", "me@here", prices=prices)


def stub_network_setup(stub: Stubber, ctx: CloudContext) -> None:
    """Key pair and security group already exactly as wanted: no changes requested."""
    name = key_pair_name(ctx.settings.read_public_key())
    stub.add_response("describe_key_pairs", {"KeyPairs": [{"KeyName": name}]}, {"KeyNames": [name]})
    stub.add_response("describe_vpcs", {"Vpcs": [{"VpcId": "vpc-1"}]}, {"Filters": ANY})
    group = {"GroupId": "sg-1", "GroupName": "gputui-c1", "IpPermissions": [
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": CIDR}]},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]},
    ]}
    stub.add_response("describe_security_groups", {"SecurityGroups": [group]}, {"Filters": ANY})


def run_params(zone: str, spot: bool, count: int = 2, max_price: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "ImageId": "ami-0123456789abcdef0", "InstanceType": "g4dn.xlarge", "MinCount": count, "MaxCount": count,
        "KeyName": ANY, "SecurityGroupIds": ["sg-1"], "Placement": {"AvailabilityZone": zone},
        "TagSpecifications": ANY, "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                                      "InstanceMetadataTags": "enabled"},
        "InstanceInitiatedShutdownBehavior": "terminate", "UserData": ANY, "ClientToken": ANY,
    }
    if spot:
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        if max_price is not None:
            params["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] = max_price
    return params


def started(zone: str, count: int, lifecycle: str | None) -> dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc)
    instances = []
    for n in range(count):
        raw: dict[str, Any] = {"InstanceId": f"i-{zone[-1]}{n:016x}", "InstanceType": "g4dn.xlarge",
                               "Placement": {"AvailabilityZone": zone}, "State": {"Name": "pending", "Code": 0},
                               "LaunchTime": now}
        if lifecycle:
            raw["InstanceLifecycle"] = lifecycle
        instances.append(raw)
    return {"Instances": instances}


def test_capacity_and_price_errors_try_the_next_zone_then_on_demand(tmp_path: Path, stubbed: Any) -> None:
    provider, stub = stubbed
    ctx = context(tmp_path, provider)
    plan = plan_launch(ctx, 2)
    assert plan.attempts == ((f"{REGION}a", "spot"), (f"{REGION}b", "spot"), (f"{REGION}a", "on-demand"),
                             (f"{REGION}b", "on-demand"))
    stub_network_setup(stub, ctx)
    stub.add_client_error("run_instances", "InsufficientInstanceCapacity", "We currently do not have sufficient capacity",
                          expected_params=run_params(f"{REGION}a", True))
    stub.add_client_error("run_instances", "SpotMaxPriceTooLow", "Your Spot request price is lower than the minimum",
                          expected_params=run_params(f"{REGION}b", True))
    stub.add_response("run_instances", started(f"{REGION}a", 2, None), run_params(f"{REGION}a", False))
    reported: list[LaunchAttempt] = []
    result = launch(ctx, plan, report=reported.append)
    assert [(a.zone, a.lifecycle, a.error_code, a.launched) for a in reported] == [
        (f"{REGION}a", "spot", "InsufficientInstanceCapacity", 0),
        (f"{REGION}b", "spot", "SpotMaxPriceTooLow", 0),
        (f"{REGION}a", "on-demand", None, 2),
    ]
    assert len(result.instances) == 2
    records = ctx.ledger.instances(running=True)
    assert [r.lifecycle for r in records] == ["on-demand", "on-demand"]
    assert all(r.hourly_price == 0.526 for r in records)  # metered at the on-demand list price


def test_a_spot_quota_skips_the_other_spot_zones(tmp_path: Path, stubbed: Any) -> None:
    provider, stub = stubbed
    ctx = context(tmp_path, provider, fallback=False)
    stub_network_setup(stub, ctx)
    stub.add_client_error("run_instances", "MaxSpotInstanceCountExceeded", "Max spot instance count exceeded",
                          expected_params=run_params(f"{REGION}a", True))
    reported: list[LaunchAttempt] = []
    result = launch(ctx, plan_launch(ctx, 2), report=reported.append)
    assert [a.error_code for a in reported] == ["MaxSpotInstanceCountExceeded"]  # zone b would hit the same quota
    assert result.instances == [] and ctx.ledger.instances() == []


def test_spot_launch_goes_to_the_cheapest_zone_at_its_price(tmp_path: Path, stubbed: Any) -> None:
    provider, stub = stubbed
    ctx = context(tmp_path, provider)
    stub_network_setup(stub, ctx)
    stub.add_response("run_instances", started(f"{REGION}a", 2, "spot"), run_params(f"{REGION}a", True))
    result = launch(ctx, plan_launch(ctx, 2))
    assert set(result.rates.values()) == {0.16}
    assert [r.lifecycle for r in ctx.ledger.instances()] == ["spot", "spot"]


def test_max_price_is_sent_as_MaxPrice_and_caps_the_metered_rate(tmp_path: Path, stubbed: Any) -> None:
    provider, stub = stubbed
    ctx = context(tmp_path, provider, max_price=0.15)  # below zone a's 0.16: never pay more than 0.15
    stub_network_setup(stub, ctx)
    stub.add_response("run_instances", started(f"{REGION}a", 2, "spot"), run_params(f"{REGION}a", True, max_price="0.15000"))
    result = launch(ctx, plan_launch(ctx, 2))
    assert set(result.rates.values()) == {0.15}
    assert [r.hourly_price for r in ctx.ledger.instances()] == [0.15, 0.15]


def test_max_price_goes_with_spot_requests_only(tmp_path: Path, stubbed: Any) -> None:
    provider, stub = stubbed
    ctx = context(tmp_path, provider, max_price=0.185)
    stub_network_setup(stub, ctx)
    stub.add_client_error("run_instances", "InsufficientInstanceCapacity", "no capacity",
                          expected_params=run_params(f"{REGION}a", True, max_price="0.18500"))
    stub.add_client_error("run_instances", "SpotMaxPriceTooLow", "Your Spot request price of 0.185 is lower than 0.21",
                          expected_params=run_params(f"{REGION}b", True, max_price="0.18500"))
    stub.add_response("run_instances", started(f"{REGION}a", 2, None), run_params(f"{REGION}a", False))  # no MaxPrice
    result = launch(ctx, plan_launch(ctx, 2))
    assert [(a.zone, a.lifecycle, a.error_code) for a in result.attempts] == [
        (f"{REGION}a", "spot", "InsufficientInstanceCapacity"), (f"{REGION}b", "spot", "SpotMaxPriceTooLow"),
        (f"{REGION}a", "on-demand", None)]
    assert set(result.rates.values()) == {0.526}  # on-demand, at the list price


@pytest.mark.parametrize("code, message, expected, kind", [
    ("AuthFailure", "AWS was not able to validate the provided access credentials", "AWS refused the credentials (AuthFailure", UserError),
    ("UnauthorizedOperation", "You are not authorized to perform this operation. Encoded authorization failure message: "
     "AbCdEf0123", "AWS denied ec2:DescribeAvailabilityZones (UnauthorizedOperation)", UserError),
    ("RequestExpired", "Request has expired", "AWS refused the credentials (RequestExpired", UserError),
    ("InternalError", "An internal error has occurred", "ec2:DescribeAvailabilityZones failed: InternalError", GputuiError),
])
def test_aws_errors_become_one_line(stubbed: Any, code: str, message: str, expected: str, kind: type) -> None:
    provider, stub = stubbed
    stub.add_client_error("describe_availability_zones", code, message)
    with pytest.raises(kind) as info:
        provider.zones()
    text = str(info.value)
    assert text.startswith(expected) and "\n" not in text
    assert "AbCdEf0123" not in text  # the encoded blob is left out
    assert isinstance(info.value, GputuiError) and (info.value.exit_code == 2) == (kind is UserError)


def test_error_messages_never_carry_credentials(stubbed: Any) -> None:
    provider, stub = stubbed
    stub.add_client_error("describe_availability_zones", "InvalidClientTokenId",
                          f"The security token {DUMMY_KEY_ID} with secret {DUMMY_SECRET} is invalid")
    with pytest.raises(UserError) as info:
        provider.zones()
    assert DUMMY_KEY_ID not in str(info.value) and DUMMY_SECRET not in str(info.value)
    assert "[redacted]" in str(info.value)


def test_cli_prints_permission_errors_as_one_line(tmp_path: Path, stubbed: Any, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    provider, stub = stubbed
    stub.add_client_error("describe_instances", "UnauthorizedOperation", "You are not authorized to perform this operation.")
    monkeypatch.setattr(provider_module, "make_provider", lambda kind, region: provider)
    profile = tmp_path / "p.toml"
    profile.write_text(f'[cloud]\nbudget_usd = 5\nssh_cidr = "{CIDR}"\n')
    assert main(["cloud", "ls", "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert err == ("gputui: error: AWS denied ec2:DescribeInstances (UnauthorizedOperation); "
                   "allow it for your IAM user or role\n")


class NoCredentials:
    """A cloud that refuses every call as botocore does without credentials (gputui's one line)."""

    name = "ec2"

    def zones(self) -> list[str]:
        raise UserError("no AWS credentials found; run `aws configure`")

    def spot_prices(self, instance_type: str, zones: Any) -> dict[str, float]:
        raise UserError("no AWS credentials found; run `aws configure`")


@pytest.mark.parametrize("zones", [(), (f"{REGION}a",)])
def test_missing_credentials_are_said_before_the_public_address_is_looked_up(tmp_path: Path, zones: tuple[str, ...]) -> None:
    """A newcomer without AWS credentials and without ssh_cidr hears about the credentials (the
    zones or the prices ask AWS first), not about a public address the echo service could not give."""
    looked: list[str] = []

    def resolver() -> str:
        looked.append("public address")
        raise OSError("Name or service not known")

    cloud = NoCredentials()
    settings = CloudSettings(budget_usd=10.0, region=REGION, zones=zones, ssh_cidr=None, source=tmp_path / "p.toml")
    ctx = CloudContext(settings, cloud, Ledger(tmp_path / "ledger.sqlite3"), "c1", "me@here", prices=cloud)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="no AWS credentials found"):
        plan_launch(ctx, 1, resolver=resolver)
    assert looked == []
    ctx.ledger.close()
