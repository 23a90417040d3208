"""The EC2 provider, through boto3 (imported here, lazily, only when EC2 is used).

Every AWS error becomes one line: refused credentials and missing permissions are
UserError (exit 2), capacity/price/quota refusals CapacityError, the rest GputuiError.
Messages pass through `redact` so no credential can reach a terminal, a log or the ledger.
`AWS_ENDPOINT_URL` (standard in botocore) points the clients elsewhere, e.g. at moto.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from gputui.cloud.pricing import OnDemandBook, SourcedPrice, api_source
from gputui.cloud.provider import QUOTA_ERRORS, ZONE_ERRORS, CapacityError, LaunchRequest, parse_console_host_keys
from gputui.cloud.redact import redact
from gputui.cloud.userdata import user_data
from gputui.model.errors import GputuiError, UserError
from gputui.model import outside
from gputui.model.cloud import InstanceInfo

CREDENTIAL_CODES = frozenset({
    "AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
    "RequestExpired", "UnrecognizedClientException", "InvalidToken", "MissingAuthenticationToken",
})
PERMISSION_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired", "Blocked"})
Atom = tuple[str, Any, Any, str, str]  # protocol, from port, to port, "cidr"|"cidr6"|"group", value
# Spot prices of plain Linux, filtered by EC2 (accounts from the EC2-Classic days, and moto, say "(Amazon VPC)").
SPOT_PRODUCTS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
# The Price List attributes of a plain Linux on-demand instance: shared tenancy, no
# pre-installed software, a normal (not capacity-reservation) hour.
ON_DEMAND_ATTRIBUTES = (("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
                        ("capacitystatus", "Used"))


@functools.lru_cache(maxsize=1)
def _shared_loader() -> Any:
    """botocore's model loader, kept for the process: parsing the EC2 model takes ~0.2 s."""
    import botocore.loaders  # type: ignore[import-untyped]

    return botocore.loaders.create_loader()


def _one_line(message: str) -> str:
    message = message.split("Encoded authorization failure message:")[0]
    return redact(" ".join(message.split())).rstrip(". ")


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Turn botocore exceptions raised while doing `action` (an IAM action name) into one-line errors."""
    from botocore import exceptions as bx

    try:
        yield
    except bx.ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "Unknown")), _one_line(str(error.get("Message", "")))
        if code in CREDENTIAL_CODES:
            raise UserError(f"AWS refused the credentials ({code}: {message}); check `aws configure`, AWS_PROFILE or the AWS_* variables") from None
        if code in PERMISSION_CODES:
            raise UserError(f"AWS denied {action} ({code}); allow it for your IAM user or role") from None
        if code in ZONE_ERRORS or code in QUOTA_ERRORS:
            raise CapacityError(code, message) from None
        raise GputuiError(f"{action} failed: {code}: {message}") from None
    except bx.NoCredentialsError:
        raise UserError("no AWS credentials found; run `aws configure`, set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
    except (bx.PartialCredentialsError, bx.ProfileNotFound, bx.NoRegionError, bx.InvalidConfigError) as exc:
        raise UserError(f"AWS configuration: {_one_line(str(exc))}") from None
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError, bx.ProxyConnectionError) as exc:
        raise GputuiError(f"cannot reach AWS for {action}: {_one_line(str(exc))}") from None
    except bx.BotoCoreError as exc:
        raise GputuiError(f"{action} failed: {_one_line(str(exc))}") from None


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _tag_specs(kinds: Sequence[str], tags: Mapping[str, str]) -> list[dict[str, Any]]:
    pairs = [{"Key": k, "Value": v} for k, v in tags.items()]
    return [{"ResourceType": kind, "Tags": pairs} for kind in kinds]


def parse_instance(raw: Mapping[str, Any]) -> InstanceInfo:
    """An InstanceInfo from one element of describe_instances/run_instances."""
    launched = raw.get("LaunchTime")
    reason = (raw.get("StateReason") or {}).get("Code") or None
    return InstanceInfo(
        instance_id=raw["InstanceId"],
        instance_type=raw.get("InstanceType", ""),
        zone=(raw.get("Placement") or {}).get("AvailabilityZone", ""),
        state=(raw.get("State") or {}).get("Name", "unknown"),
        lifecycle="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
        launched=launched.timestamp() if isinstance(launched, dt.datetime) else 0.0,
        public_ip=raw.get("PublicIpAddress") or None,
        state_reason=reason,
        tags={t["Key"]: t["Value"] for t in raw.get("Tags") or ()},
    )


def pricing_region(region: str) -> str:
    """Where to ask the Pricing API about an EC2 region: it answers only in us-east-1 and ap-south-1,
    each for every region, so regions in Asia, the Middle East and Africa ask the nearer one."""
    return "ap-south-1" if region.startswith(("ap-", "me-", "af-")) else "us-east-1"


def parse_on_demand(price_list: Sequence[Any]) -> float | None:
    """The hourly USD on-demand price in a get_products PriceList (JSON strings, one per product).

    Plain RunInstances products are preferred over any other operation left by the filters;
    zero prices and non-hourly units are skipped. None: no price there.
    """
    found: list[tuple[bool, float]] = []
    for item in price_list:
        try:  # the Pricing API's answer is data: a line that is not a JSON object is skipped
            product = outside.parse(item, max_chars=len(item)) if isinstance(item, str) else item
        except outside.Refused:
            continue
        if not isinstance(product, dict):
            continue
        attributes = (product.get("product") or {}).get("attributes") or {}
        plain = attributes.get("operation", "RunInstances") == "RunInstances"
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                try:
                    usd = float((dimension.get("pricePerUnit") or {}).get("USD", "nan"))
                except (TypeError, ValueError):
                    continue
                if dimension.get("unit") == "Hrs" and usd > 0:
                    found.append((not plain, usd))
    return min(found)[1] if found else None


class Ec2Provider:
    """CloudProvider on AWS EC2. Clients may be injected (botocore Stubber in tests).

    On-demand prices come from the Pricing API through an OnDemandBook (cached a day in
    `price_cache`, default the user cache directory; the dated table when it cannot answer).
    """

    name = "ec2"

    def __init__(self, region: str, client: Any = None, ssm_client: Any = None, pricing_client: Any = None,
                 price_cache: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.region = region
        self._client = client
        self._ssm = ssm_client
        self._pricing = pricing_client
        self.clock = clock
        self.on_demand_book = OnDemandBook(region, self._on_demand_usd, price_cache, clock)

    def _make(self, service: str, region: str | None = None, quick: bool = False) -> Any:
        import boto3  # type: ignore[import-untyped]
        import botocore.session  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        if quick:  # a lookup with a fallback: one try, short waits
            options: dict[str, Any] = {"connect_timeout": 3, "read_timeout": 10, "retries": {"total_max_attempts": 1}}
        else:  # standard retries (3 attempts) unless the user configured their own (AWS_MAX_ATTEMPTS, ...)
            retries = {} if os.environ.get("AWS_MAX_ATTEMPTS") else {"retries": {"max_attempts": 3, "mode": "standard"}}
            options = {"connect_timeout": 5, "read_timeout": 30, **retries}
        config = Config(user_agent_extra="gputui", **options)
        with aws_errors(f"{service} client"):
            # A fresh session (credentials and endpoint read now) sharing the parsed service models.
            core = botocore.session.Session()
            core.register_component("data_loader", _shared_loader())
            session = boto3.session.Session(botocore_session=core, region_name=region or self.region)
            return session.client(service, config=config)

    @property
    def ec2(self) -> Any:
        if self._client is None:
            self._client = self._make("ec2")
        return self._client

    @property
    def ssm(self) -> Any:
        if self._ssm is None:
            self._ssm = self._make("ssm")
        return self._ssm

    @property
    def pricing(self) -> Any:
        if self._pricing is None:
            self._pricing = self._make("pricing", pricing_region(self.region), quick=True)
        return self._pricing

    def _on_demand_usd(self, instance_type: str) -> float | None:
        """Ask the Pricing API for the region's plain Linux on-demand price (raises on failure)."""
        filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in
                   (("instanceType", instance_type), ("regionCode", self.region), *ON_DEMAND_ATTRIBUTES)]
        items: list[Any] = []
        with aws_errors("pricing:GetProducts"):
            pages = self.pricing.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1")
            for page in pages:
                items += page.get("PriceList", [])
        return parse_on_demand(items)

    def on_demand_price(self, instance_type: str) -> SourcedPrice | None:
        return self.on_demand_book.price(instance_type)

    def spot_source(self) -> str:
        return api_source(self.clock())

    def zones(self) -> list[str]:
        with aws_errors("ec2:DescribeAvailabilityZones"):
            reply = self.ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
        return sorted(z["ZoneName"] for z in reply["AvailabilityZones"]
                      if z.get("ZoneType", "availability-zone") == "availability-zone")

    def spot_prices(self, instance_type: str, zones: Sequence[str]) -> dict[str, float]:
        newest: dict[str, tuple[dt.datetime, float]] = {}
        with aws_errors("ec2:DescribeSpotPriceHistory"):
            pages = self.ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=[instance_type], ProductDescriptions=SPOT_PRODUCTS, StartTime=dt.datetime.now(dt.timezone.utc),
            )
            for page in pages:
                for item in page["SpotPriceHistory"]:
                    zone, when = item["AvailabilityZone"], item["Timestamp"]
                    if not item.get("ProductDescription", "").startswith("Linux/UNIX") or (zones and zone not in zones):
                        continue
                    if zone not in newest or when > newest[zone][0]:
                        newest[zone] = (when, float(item["SpotPrice"]))
        return {zone: price for zone, (_when, price) in sorted(newest.items())}

    def resolve_image(self, ami: str) -> str:
        if not ami.startswith("ssm:"):
            return ami
        name = ami[len("ssm:"):]
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        with aws_errors("ssm:GetParameter"):
            try:
                return str(self.ssm.get_parameter(Name=name)["Parameter"]["Value"])
            except ClientError as exc:
                if _code(exc) not in ("ParameterNotFound", "ValidationException"):
                    raise
        raise UserError(f"[cloud] ami {ami}: no such SSM parameter in {self.region}")

    def ensure_key_pair(self, name: str, public_key: str, tags: Mapping[str, str]) -> str:
        from botocore.exceptions import ClientError

        with aws_errors("ec2:DescribeKeyPairs"):
            try:
                self.ec2.describe_key_pairs(KeyNames=[name])
                return name
            except ClientError as exc:
                if _code(exc) != "InvalidKeyPair.NotFound":
                    raise
        with aws_errors("ec2:ImportKeyPair"):
            try:
                self.ec2.import_key_pair(KeyName=name, PublicKeyMaterial=public_key.encode(),
                                         TagSpecifications=_tag_specs(["key-pair"], tags))
            except ClientError as exc:
                if _code(exc) != "InvalidKeyPair.Duplicate":  # another gputui imported it meanwhile
                    raise
        return name

    def _default_vpc(self) -> str:
        with aws_errors("ec2:DescribeVpcs"):
            vpcs = self.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise UserError(f"region {self.region} has no default VPC; create one with `aws ec2 create-default-vpc`")
        return str(vpcs[0]["VpcId"])

    def ensure_security_group(self, name: str, ssh_cidr: str, tags: Mapping[str, str]) -> str:
        vpc = self._default_vpc()
        with aws_errors("ec2:DescribeSecurityGroups"):
            groups = self.ec2.describe_security_groups(
                Filters=[{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
            )["SecurityGroups"]
        if groups:
            group_id, existing = str(groups[0]["GroupId"]), _atoms(groups[0].get("IpPermissions", []))
        else:
            with aws_errors("ec2:CreateSecurityGroup"):
                group_id = str(self.ec2.create_security_group(
                    GroupName=name, VpcId=vpc, Description="gputui slaves: SSH from the master, all traffic within",
                    TagSpecifications=_tag_specs(["security-group"], tags),
                )["GroupId"])
            existing = set()
        family = "cidr6" if ":" in ssh_cidr else "cidr"
        wanted: set[Atom] = {("tcp", 22, 22, family, ssh_cidr), ("-1", None, None, "group", group_id)}
        if existing - wanted:
            with aws_errors("ec2:RevokeSecurityGroupIngress"):
                self.ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=_permissions(existing - wanted, described=False))
        if wanted - existing:
            with aws_errors("ec2:AuthorizeSecurityGroupIngress"):
                self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=_permissions(wanted - existing))
        return group_id

    def launch(self, request: LaunchRequest) -> list[InstanceInfo]:
        params: dict[str, Any] = dict(
            # All or none in a zone: a cluster in one zone talks faster and without cross-zone fees.
            ImageId=request.image_id, InstanceType=request.instance_type, MinCount=request.count, MaxCount=request.count,
            KeyName=request.key_name, SecurityGroupIds=[request.security_group_id],
            Placement={"AvailabilityZone": request.zone},
            TagSpecifications=_tag_specs(["instance", "volume"], request.tags),
            # IMDSv2 only; the tags readable there, where the watchdog reads its lease
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled", "InstanceMetadataTags": "enabled"},
            # the watchdog powers off: that must end the bill (a one-time spot instance cannot stop anyway)
            InstanceInitiatedShutdownBehavior="terminate",
            UserData=user_data(request.tags),  # installs the watchdog; boto3 encodes it
            ClientToken=uuid.uuid4().hex,  # a retried request never launches twice
        )
        if request.lifecycle == "spot":
            options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if request.max_price is not None:
                options["MaxPrice"] = f"{request.max_price:.5f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        with aws_errors("ec2:RunInstances"):
            reply = self.ec2.run_instances(**params)
        return [parse_instance(raw) for raw in reply["Instances"]]

    def _describe(self, filters: list[dict[str, Any]]) -> list[InstanceInfo]:
        out: list[InstanceInfo] = []
        with aws_errors("ec2:DescribeInstances"):
            for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page["Reservations"]:
                    out.extend(parse_instance(raw) for raw in reservation["Instances"])
        return out

    def describe(self, ids: Sequence[str]) -> list[InstanceInfo]:
        out: list[InstanceInfo] = []
        for i in range(0, len(ids), 200):  # a filter takes at most 200 values
            out += self._describe([{"Name": "instance-id", "Values": list(ids[i:i + 200])}])
        return out

    def terminate(self, ids: Sequence[str]) -> None:
        for i in range(0, len(ids), 1000):
            with aws_errors("ec2:TerminateInstances"):
                self.ec2.terminate_instances(InstanceIds=list(ids[i:i + 1000]))

    def list_tagged(self, tags: Mapping[str, str]) -> list[InstanceInfo]:
        return self._describe([{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()])

    def set_tags(self, ids: Sequence[str], tags: Mapping[str, str]) -> None:
        """Create or overwrite `tags` on the instances (the lease renewal)."""
        for i in range(0, len(ids), 1000):
            with aws_errors("ec2:CreateTags"):
                self.ec2.create_tags(Resources=list(ids[i:i + 1000]), Tags=[{"Key": k, "Value": v} for k, v in tags.items()])

    def console_output(self, instance_id: str) -> str:
        """The instance's console output (the latest on Nitro instances, else the last buffered)."""
        with aws_errors("ec2:GetConsoleOutput"):
            try:
                answer = self.ec2.get_console_output(InstanceId=instance_id, Latest=True)
            except Exception as exc:  # noqa: BLE001 - botocore's ClientError, imported lazily
                if _code(exc) != "UnsupportedOperation":
                    raise
                answer = self.ec2.get_console_output(InstanceId=instance_id)
        return str(answer.get("Output") or "")

    def console_host_keys(self, instance_id: str) -> list[str]:
        return parse_console_host_keys(self.console_output(instance_id))


def _atoms(permissions: Sequence[Mapping[str, Any]]) -> set[Atom]:
    """Ingress rules as (protocol, from, to, kind, value) atoms, for set arithmetic."""
    out: set[Atom] = set()
    for perm in permissions:
        proto = str(perm.get("IpProtocol"))
        lo, hi = (None, None) if proto == "-1" else (perm.get("FromPort"), perm.get("ToPort"))
        out |= {(proto, lo, hi, "cidr", r["CidrIp"]) for r in perm.get("IpRanges", ())}
        out |= {(proto, lo, hi, "cidr6", r["CidrIpv6"]) for r in perm.get("Ipv6Ranges", ())}
        out |= {(proto, lo, hi, "group", g["GroupId"]) for g in perm.get("UserIdGroupPairs", ())}
    return out


def _permissions(atoms: set[Atom], described: bool = True) -> list[dict[str, Any]]:
    """Atoms back as IpPermissions (revoke requests carry no descriptions)."""
    out = []
    for proto, lo, hi, kind, value in sorted(atoms, key=str):
        perm: dict[str, Any] = {"IpProtocol": proto}
        if lo is not None:
            perm.update(FromPort=lo, ToPort=hi)
        key, field, note = {
            "cidr": ("IpRanges", "CidrIp", "gputui: SSH from the master"),
            "cidr6": ("Ipv6Ranges", "CidrIpv6", "gputui: SSH from the master"),
            "group": ("UserIdGroupPairs", "GroupId", "gputui: slaves talk to each other"),
        }[kind]
        perm[key] = [{field: value, "Description": note} if described else {field: value}]
        out.append(perm)
    return out
