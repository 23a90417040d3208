"""On-demand prices from the AWS Pricing API (botocore's Stubber answering in AWS's shape),
cached a day, with the dated table as the fallback; every price names its source."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest
from botocore.stub import ANY, Stubber  # type: ignore[import-untyped]

from gputui.cli import main
from gputui.cloud import factory as provider_module
from gputui.cloud.ec2 import Ec2Provider, parse_on_demand
from gputui.cloud.pricing import TABLE_SOURCE, launch_price, on_demand_price, price_cache_path, quotes
from gputui.cloud.sim import SimProvider
from gputui.views.cloud import launch_price_text
from gputui.model.cloud import PriceQuote

from .moto_fixture import DEAD_PROXY, DUMMY_KEY_ID, DUMMY_SECRET

REGION = "eu-west-1"
DAY = 86400.0
T0 = float(calendar.timegm((2026, 11, 25, 12, 0, 0)))  # 2026-11-25 12:00 UTC
# AWS's eu-west-1 on-demand Linux prices; the shipped us-east-1 table says 1.006 and 0.526.
EU_WEST_1 = {"g5.xlarge": 1.123, "g4dn.xlarge": 0.587}
FILTER_FIELDS = ("instanceType", "regionCode", "operatingSystem", "tenancy", "preInstalledSw", "capacitystatus")


def price_list_item(instance_type: str, usd: float, operation: str = "RunInstances") -> str:
    """One element of get_products' PriceList: a JSON string, as AWS sends it (trimmed attributes)."""
    sku = format(zlib.crc32(f"{instance_type} {operation}".encode()), "08X") + "JQ4FZ3NB"
    gpu_memory = {"g5.xlarge": "24 GiB", "g4dn.xlarge": "16 GiB"}[instance_type]
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
            "instanceType": instance_type, "regionCode": REGION, "location": "EU (Ireland)", "locationType": "AWS Region",
            "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
            "licenseModel": "No License required", "usagetype": f"EU-BoxUsage:{instance_type}", "operation": operation,
            "marketoption": "OnDemand", "servicecode": "AmazonEC2", "vcpu": "4", "gpu": "1", "gpuMemory": gpu_memory,
            "instanceFamily": "GPU instance", "currentGeneration": "Yes", "processorArchitecture": "64-bit",
        }},
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {f"{sku}.JRTCKXETXF": {
                "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                    "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                    "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                    "description": f"${usd:.3f} per On Demand Linux {instance_type} Instance Hour",
                    "pricePerUnit": {"USD": f"{usd:.10f}"}}},
                "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {}}},
            "Reserved": {f"{sku}.4NA7Y494T4": {  # a cheaper hourly rate that is not on-demand: never taken
                "priceDimensions": {f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                    "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                    "rateCode": f"{sku}.4NA7Y494T4.6YS6EN2CT7", "description": "Linux/UNIX (Amazon VPC), reserved",
                    "pricePerUnit": {"USD": f"{usd * 0.62:.10f}"}}},
                "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "4NA7Y494T4",
                "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard", "PurchaseOption": "No Upfront"}}},
        },
        "version": "20261120203539",
        "publicationDate": "2026-11-20T20:35:39Z",
    })


def products_params(instance_type: str) -> dict[str, Any]:
    values = (instance_type, REGION, "Linux", "Shared", "NA", "Used")
    return {"ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1",
            "Filters": [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in zip(FILTER_FIELDS, values)]}


def answer(instance_type: str, usd: float | None = None) -> dict[str, Any]:
    return {"FormatVersion": "aws_v1", "PriceList": [price_list_item(instance_type, usd or EU_WEST_1[instance_type])]}


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Aws:
    """Stubbed EC2 and Pricing clients for one region, and a way to make providers sharing them."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.clock = Clock()
        first = Ec2Provider(REGION)
        self.ec2, self.pricing = first.ec2, first.pricing
        self.pricing_calls = 0
        self.pricing.meta.events.register("before-parameter-build.pricing.GetProducts", self._count)

    def _count(self, **_: Any) -> None:
        self.pricing_calls += 1

    def provider(self) -> Ec2Provider:
        """A provider as a new process would make it: its own memory, the same cache file."""
        return Ec2Provider(REGION, client=self.ec2, pricing_client=self.pricing, price_cache=self.cache, clock=self.clock)


@pytest.fixture
def aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Aws, Stubber, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", DEAD_PROXY)  # the Stubbers answer; nothing is sent anywhere
    monkeypatch.setenv("HTTPS_PROXY", DEAD_PROXY)
    env = Aws(tmp_path / "cache" / "on-demand-prices.json")
    with Stubber(env.ec2) as ec2, Stubber(env.pricing) as pricing:
        yield env, ec2, pricing
        ec2.assert_no_pending_responses()
        pricing.assert_no_pending_responses()


def test_eu_west_1_on_demand_prices_come_from_the_pricing_api(aws: Any) -> None:
    env, _ec2, pricing = aws
    for instance_type in EU_WEST_1:
        pricing.add_response("get_products", answer(instance_type), products_params(instance_type))
    provider = env.provider()
    for instance_type, usd in EU_WEST_1.items():
        price = provider.on_demand_price(instance_type)
        assert price == usd and price.source == "api 2026-11-25" and price.note == ""
    assert env.pricing_calls == 2


def test_the_pricing_endpoint_is_us_east_1_or_ap_south_1_whatever_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert Ec2Provider("eu-west-1").pricing.meta.region_name == "us-east-1"
    assert Ec2Provider("ap-northeast-1").pricing.meta.region_name == "ap-south-1"


def test_without_permission_the_table_is_used_and_says_so(aws: Any) -> None:
    env, _ec2, pricing = aws
    pricing.add_client_error("get_products", "AccessDeniedException",
                             "User: arn:aws:iam::123456789012:user/gpu is not authorized to perform: pricing:GetProducts",
                             http_status_code=400, expected_params=products_params("g5.xlarge"))
    price = env.provider().on_demand_price("g5.xlarge")
    assert price == 1.006 and price.source == TABLE_SOURCE == "table 2024-06-01"
    assert "AWS denied pricing:GetProducts (AccessDeniedException)" in price.note
    assert not env.cache.exists()  # a refusal is not cached: the next process asks again


def test_without_network_the_table_is_used_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    provider = Ec2Provider(REGION, price_cache=tmp_path / "cache.json", clock=Clock())
    price = provider.on_demand_price("g4dn.xlarge")
    assert price == 0.526 and price.source == "table 2024-06-01"
    assert "cannot reach AWS for pricing:GetProducts" in price.note


def test_the_cache_answers_for_a_day_then_the_api_is_asked_again(aws: Any) -> None:
    env, _ec2, pricing = aws
    pricing.add_response("get_products", answer("g5.xlarge"), products_params("g5.xlarge"))
    assert env.provider().on_demand_price("g5.xlarge") == 1.123 and env.pricing_calls == 1
    env.clock.now = T0 + DAY - 1  # another process, a second short of a day later
    cached = env.provider().on_demand_price("g5.xlarge")
    assert cached == 1.123 and cached.source == "api 2026-11-25" and cached.note == "" and env.pricing_calls == 1
    env.clock.now = T0 + DAY
    pricing.add_response("get_products", answer("g5.xlarge", 1.187), products_params("g5.xlarge"))
    fresh = env.provider().on_demand_price("g5.xlarge")
    assert fresh == 1.187 and fresh.source == "api 2026-11-26" and env.pricing_calls == 2
    stored = json.loads(env.cache.read_text())["prices"][REGION]["g5.xlarge"]
    assert stored == {"usd": 1.187, "fetched": T0 + DAY}


def test_one_process_asks_once_a_day_even_without_a_cache_file(aws: Any) -> None:
    env, _ec2, pricing = aws
    pricing.add_response("get_products", answer("g5.xlarge"), products_params("g5.xlarge"))
    provider = env.provider()
    assert provider.on_demand_price("g5.xlarge") == 1.123
    env.cache.unlink()
    env.clock.now = T0 + DAY - 1
    assert provider.on_demand_price("g5.xlarge") == 1.123 and env.pricing_calls == 1


def test_an_old_api_price_beats_the_table_when_the_api_cannot_answer(aws: Any) -> None:
    env, _ec2, pricing = aws
    pricing.add_response("get_products", answer("g5.xlarge"), products_params("g5.xlarge"))
    env.provider().on_demand_price("g5.xlarge")
    env.clock.now = T0 + 3 * DAY
    pricing.add_client_error("get_products", "ThrottlingException", "Rate exceeded", http_status_code=400)
    price = env.provider().on_demand_price("g5.xlarge")
    assert price == 1.123 and price.source == "api 2026-11-25"  # its own date: three days old, and it says so
    assert "ThrottlingException" in price.note


@pytest.mark.parametrize("content", [
    "{not json", "", "[1, 2]", '{"prices": []}', '{"prices": {"eu-west-1": []}}',
    '{"prices": {"eu-west-1": {"g5.xlarge": {"usd": "cheap", "fetched": 1}}}}',
    '{"prices": {"eu-west-1": {"g5.xlarge": {"usd": -1.0, "fetched": %r}}}}' % T0,
    '{"prices": {"eu-west-1": {"g5.xlarge": {"usd": NaN, "fetched": %r}}}}' % T0,
    '{"prices": {"eu-west-1": {"g5.xlarge": {"usd": 0.01}}}}',
])
def test_a_corrupt_cache_is_ignored(aws: Any, content: str) -> None:
    env, _ec2, pricing = aws
    env.cache.parent.mkdir(parents=True)
    env.cache.write_text(content)
    pricing.add_response("get_products", answer("g5.xlarge"), products_params("g5.xlarge"))
    price = env.provider().on_demand_price("g5.xlarge")
    assert price == 1.123 and price.source == "api 2026-11-25" and env.pricing_calls == 1
    assert json.loads(env.cache.read_text())["prices"][REGION]["g5.xlarge"]["usd"] == 1.123  # rewritten whole


def spot_answer() -> dict[str, Any]:
    when = dt.datetime(2026, 11, 25, 11, 0, tzinfo=dt.timezone.utc)
    return {"SpotPriceHistory": [
        {"AvailabilityZone": f"{REGION}a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.404100", "Timestamp": when},
        {"AvailabilityZone": f"{REGION}b", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.449300", "Timestamp": when},
    ], "NextToken": ""}


def spot_params() -> dict[str, Any]:
    return {"InstanceTypes": ["g5.xlarge"], "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            "StartTime": ANY}


def test_spot_prices_are_filtered_to_linux_by_the_server(aws: Any) -> None:
    env, ec2, _pricing = aws
    ec2.add_response("describe_spot_price_history", spot_answer(), spot_params())
    assert env.provider().spot_prices("g5.xlarge", []) == {f"{REGION}a": 0.4041, f"{REGION}b": 0.4493}


def prices_cli(aws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> int:
    env, ec2, _pricing = aws
    ec2.add_response("describe_spot_price_history", spot_answer(), spot_params())
    monkeypatch.setattr(provider_module, "make_provider", lambda kind, region: env.provider())
    profile = tmp_path / "p.toml"
    profile.write_text(f'[cloud]\nregion = "{REGION}"\ninstance_type = "g5.xlarge"\nzones = ["{REGION}a", "{REGION}b"]\n'
                       'budget_usd = 5\nssh_cidr = "198.51.100.7/32"\n')
    return main(["cloud", "prices", "--profile", str(profile), *extra])


def test_cloud_prices_json_names_each_prices_source(aws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    aws[2].add_response("get_products", answer("g5.xlarge"), products_params("g5.xlarge"))
    assert prices_cli(aws, tmp_path, monkeypatch, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["on_demand_note"] is None
    assert [(q["zone"], q["spot_source"], q["on_demand_usd_per_hour"], q["on_demand_source"]) for q in data["quotes"]] == [
        (f"{REGION}a", "api 2026-11-25", 1.123, "api 2026-11-25"), (f"{REGION}b", "api 2026-11-25", 1.123, "api 2026-11-25")]
    assert data["quotes"][0]["saving"] == pytest.approx(1 - 0.4041 / 1.123, abs=1e-4)


def test_cloud_prices_table_says_when_it_fell_back_to_the_table(aws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    aws[2].add_client_error("get_products", "AccessDeniedException", "not authorized", http_status_code=400)
    aws[0].cache.parent.mkdir(parents=True)
    aws[0].cache.write_text("\x00garbage")
    assert prices_cli(aws, tmp_path, monkeypatch) == 0
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    assert "$/h on-demand (table 2024-06-01)" in out and "$1.0060" in out and "$/h spot (api 2026-11-25)" in out
    assert "gputui's us-east-1 list of 2024-06-01" in out and "allow it for your IAM user or role" in out
    assert "Traceback" not in captured.err


def test_a_profile_price_stands_and_says_so() -> None:
    asked: list[str] = []

    class Source:
        def spot_prices(self, instance_type: str, zones: Any) -> dict[str, float]:
            return {"z": 0.3}

        def spot_source(self) -> str:
            return "api 2026-11-25"

        def on_demand_price(self, instance_type: str) -> Any:
            asked.append(instance_type)
            return None

    [quote] = quotes(Source(), "g5.xlarge", ["z"], on_demand_price("g5.xlarge", 1.2))
    assert (quote.on_demand, quote.on_demand_source, asked) == (1.2, "profile", [])
    [quote] = quotes(Source(), "x9.huge", ["z"], on_demand_price("x9.huge"))  # the API does not know it either
    assert (quote.on_demand, quote.on_demand_source, asked) == (None, None, ["x9.huge"])


def test_the_simulated_cloud_names_its_sources() -> None:
    [quote, *_] = quotes(SimProvider("eu-west-1"), "g5.xlarge", [], on_demand_price("g5.xlarge"))
    assert (quote.spot_source, quote.on_demand, quote.on_demand_source) == ("sim", 1.006, "table 2024-06-01")


def test_the_launch_line_names_the_source_of_every_price() -> None:
    quote = PriceQuote("g5.xlarge", "eu-west-1a", 0.4041, 1.123, "api 2026-11-25", "api 2026-11-24")
    assert launch_price_text([quote], "eu-west-1a", "spot") == (
        "spot $0.4041/h (api 2026-11-24) in eu-west-1a, on-demand $1.1230/h (api 2026-11-25), saving 64%")
    assert launch_price_text([quote], "eu-west-1a", "on-demand") == "on-demand $1.1230/h (api 2026-11-25) in eu-west-1a"
    assert launch_price(quote, "spot", 0.3) == (0.3, "max_price")


def test_plain_linux_on_demand_hours_are_read_from_the_price_list() -> None:
    licensed = price_list_item("g5.xlarge", 0.9, operation="RunInstances:0g00")  # cheaper but not plain Linux
    assert parse_on_demand([licensed, price_list_item("g5.xlarge", 1.123)]) == 1.123
    assert parse_on_demand([licensed]) == 0.9
    assert parse_on_demand([]) is None


def test_the_cache_lives_in_the_user_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import platformdirs

    monkeypatch.delenv("GPUTUI_HOME")
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda name, appauthor=None: str(tmp_path / "user-cache" / name))
    assert price_cache_path() == tmp_path / "user-cache" / "gputui" / "on-demand-prices.json"
