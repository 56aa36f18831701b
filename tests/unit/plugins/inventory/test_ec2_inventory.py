"""fleetops.node.ec2 through the real ansible-inventory against a real moto_server (loopback only).

No boto3 mocks: moto_server is a real HTTP EC2 endpoint on 127.0.0.1, and fleetops_lab.ec2sim.Ec2Proxy sits in
front of it to add what moto does not model (scheduled events) and to throttle (503
RequestLimitExceeded). The proxy's per-Action counters prove retries happened and that a cached
listing made no API call.

The 5,000-instance fleet lives in its own moto_server, filled in a background thread while the
other tests run, so the file stays under a minute.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab.ec2sim import Ec2Proxy, MotoServer, client, free_port, launch_many, register_ami
from tests.paths import REPO

ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"
REGION = "us-east-1"
SCALE_REGION = "eu-west-1"
SCALE_COUNT = 5000
SCALE_TEST = "test_5000_instances_list_across_pages_and_cache_makes_no_call"
FAST_RETRIES = {"initial_backoff": 0.02, "max_backoff": 0.1}
AUTO_FAILED = "[WARNING]: Failed to parse inventory with 'auto' plugin: "


# ---- running ansible-inventory ----------------------------------------------------------------


def _plain(value: Any) -> Any:
    """ansible-inventory writes untrusted strings as {"__ansible_unsafe": "..."}; unwrap them."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class Listing:
    def __init__(self, proc: subprocess.CompletedProcess[str], output: Path, seconds: float) -> None:
        self.rc = proc.returncode
        self.stdout = proc.stdout  # -vvv messages
        self.stderr = proc.stderr
        self.seconds = seconds
        self.data: dict[str, Any] = _plain(json.loads(output.read_text())) if proc.returncode == 0 else {}
        self.calls: dict[str, int] = {}

    @property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        hv: dict[str, dict[str, Any]] = self.data["_meta"]["hostvars"]
        return hv

    def group(self, name: str) -> set[str]:
        return set(self.data.get(name, {}).get("hosts", []))

    def by_name(self) -> dict[str, str]:
        """Name tag -> inventory hostname."""
        return {v["ec2_tags"]["Name"]: h for h, v in self.hostvars.items() if "Name" in v["ec2_tags"]}


def ansible_env(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """This environment less AWS_*/ANSIBLE_*, plus the collection path and dummy credentials."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ANSIBLE_")) and k != "BOTO_CONFIG"
    }
    full_env.update(
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_INVENTORY_UNPARSED_FAILED="true",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    full_env.update(env or {})
    return full_env


def run_sources(
    tmp_path: Path,
    sources: dict[str, dict[str, Any]],
    env: dict[str, str] | None = None,
    verbose: bool = False,
) -> Listing:
    """Write tmp_path/<name>.fleet_ec2.yml per source; `ansible-inventory -i ... --list` as a user would."""
    paths = []
    for name, config in sources.items():
        path = tmp_path / f"{name}.fleet_ec2.yml"
        path.write_text(yaml.safe_dump({"plugin": "fleetops.node.ec2", **config}, sort_keys=False))
        paths.append(str(path))
    full_env = ansible_env(tmp_path, env)
    output = tmp_path / "inventory.json"
    output.unlink(missing_ok=True)
    args = [str(ANSIBLE_INVENTORY), *(a for p in paths for a in ("-i", p)), "--list", "--output", str(output)]
    started = time.monotonic()
    proc = subprocess.run(
        args + (["-vvv"] if verbose else []),
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    return Listing(proc, output, time.monotonic() - started)


def run_inventory(
    tmp_path: Path, config: dict[str, Any], env: dict[str, str] | None = None, verbose: bool = False
) -> Listing:
    return run_sources(tmp_path, {"test": config}, env=env, verbose=verbose)


def plugin_failures(stderr: str) -> dict[str, str]:
    """Source file name -> the plugin's one-line error, from ansible-inventory's warnings.

    For a source that fails, ansible-inventory prints "[WARNING]: Failed to parse inventory with
    'auto' plugin: <the error>", details, and "Origin: <inventory plugin 'auto' with source 'PATH'>".
    """
    failures: dict[str, str] = {}
    message = None
    for line in stderr.splitlines():
        if line.startswith(AUTO_FAILED):
            message = line[len(AUTO_FAILED) :]
        elif message is not None and line.startswith("Origin: <inventory plugin 'auto' with source '"):
            failures[Path(line.split("'")[3]).name] = message
            message = None
    return failures


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


class ScaleFleet:
    """A second moto_server with SCALE_COUNT instances, filled in a background thread."""

    def __init__(self) -> None:
        self.server = MotoServer()
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.instance_ids: list[str] = []
        self.thread = threading.Thread(target=self._fill, name="scale-fleet", daemon=True)

    def start(self) -> None:
        self.server.start()
        self.thread.start()

    def _fill(self) -> None:
        started = time.monotonic()
        try:
            self.instance_ids = launch_many(self.server.url, SCALE_REGION, SCALE_COUNT)
        except BaseException as e:  # re-raised by ready(), in the test that waits for it
            self.error = e
        self.seconds = time.monotonic() - started

    def ready(self) -> str:
        self.thread.join(timeout=300)
        if self.error is not None:
            raise self.error
        assert not self.thread.is_alive(), "moto took more than 300 s to register the instances"
        return self.server.url


@pytest.fixture(scope="module", autouse=True)
def scale_fleet(request: pytest.FixtureRequest) -> Iterator[ScaleFleet | None]:
    """Starts filling the big fleet as the module starts, if the scale test is selected."""
    if not any(item.name == SCALE_TEST for item in request.session.items):
        yield None
        return
    fleet = ScaleFleet()
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.thread.join(timeout=300)
        fleet.server.stop()


# name tag (or None), instance type, az, private ip, other tags
FLEET = [
    (
        "gpu-a1",
        "g5.xlarge",
        "a",
        "10.42.1.11",
        {"fleetops": "gpu", "team": "ml", "fleetops:event": "system-reboot"},
    ),
    ("gpu-a2", "g5.xlarge", "a", "10.42.1.12", {"fleetops": "gpu", "team": "infra", "drain": "true"}),
    ("gpu-b1", "p4d.24xlarge", "b", "10.42.2.11", {"fleetops": "gpu", "team": "ml"}),
    (None, "m5.large", "b", "10.42.2.12", {"fleetops": "cpu"}),  # "cpu-b2": no Name tag
    ("gpu-stopped", "g5.xlarge", "b", "10.42.2.13", {"fleetops": "gpu"}),
]
RUNNING = ("gpu-a1", "gpu-a2", "gpu-b1", "cpu-b2")


@pytest.fixture(scope="module")
def fleet(moto: MotoServer) -> dict[str, str]:
    """A VPC, subnets in two AZs, instances with chosen private IPs and tags; name -> instance id."""
    ec2 = client(moto.url, REGION)
    image_id = register_ami(moto.url, REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = {
        az: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{n}.0/24", AvailabilityZone=REGION + az)["Subnet"][
            "SubnetId"
        ]
        for n, az in ((1, "a"), (2, "b"))
    }
    ids: dict[str, str] = {"image": image_id}
    for name, itype, az, ip, tags in FLEET:
        all_tags = {**tags, **({"Name": name} if name else {})}
        answer = ec2.run_instances(
            ImageId=image_id,
            MinCount=1,
            MaxCount=1,
            InstanceType=itype,
            SubnetId=subnets[az],
            PrivateIpAddress=ip,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()]}
            ],
        )
        ids[name or "cpu-b2"] = answer["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[ids["gpu-stopped"]])
    return ids


@pytest.fixture
def proxy(moto: MotoServer, fleet: dict[str, str]) -> Iterator[Ec2Proxy]:
    with Ec2Proxy(moto.url) as p:
        yield p


@pytest.fixture(scope="module")
def default_listing(
    moto: MotoServer, fleet: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Listing:
    """One listing with every option at its default, shared by the tests that read it."""
    with Ec2Proxy(moto.url) as p:
        listing = run_inventory(
            tmp_path_factory.mktemp("default"), {"regions": [REGION], "endpoint_url": p.url}
        )
        listing.calls = dict(p.calls)
    assert listing.rc == 0, listing.stderr
    return listing


# ---- listing, hostvars, groups ----------------------------------------------------------------


def test_hostvars_are_set_for_every_running_instance(default_listing: Listing, fleet: dict[str, str]) -> None:
    hv = default_listing.hostvars
    # hostnames default to the instance ID; the stopped instance is left out by the default filter
    assert set(hv) == {fleet[n] for n in RUNNING}
    a1 = hv[fleet["gpu-a1"]]
    assert a1["ec2_instance_id"] == fleet["gpu-a1"]
    assert a1["ec2_instance_type"] == "g5.xlarge"
    assert a1["ec2_az"] == "us-east-1a"
    assert a1["ec2_region"] == REGION
    assert a1["ec2_image_id"] == fleet["image"]
    assert a1["ec2_tags"] == {
        "Name": "gpu-a1",
        "fleetops": "gpu",
        "team": "ml",
        "fleetops:event": "system-reboot",
    }
    assert a1["ec2_private_ip"] == "10.42.1.11"
    assert a1["ansible_host"] == "10.42.1.11"
    assert a1["ec2_state"] == "running"
    launched = datetime.datetime.fromisoformat(a1["ec2_launch_time"])
    assert launched.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.UTC) - launched).total_seconds()) < 3600
    assert a1["ec2_status_checks"] == {"system": "ok", "instance": "ok"}
    assert hv[fleet["gpu-b1"]]["ec2_private_ip"] == "10.42.2.11"
    # aws_ec2-style description variables are opt-in; 'tags' is never set (a reserved name)
    assert "private_ip_address" not in a1
    assert "tags" not in a1
    assert "reserved name" not in default_listing.stderr


def test_default_groups_per_az_and_instance_type(default_listing: Listing, fleet: dict[str, str]) -> None:
    def ids(*names: str) -> set[str]:
        return {fleet[n] for n in names}

    assert default_listing.group("ec2") == ids(*RUNNING)
    assert default_listing.group("az_us_east_1a") == ids("gpu-a1", "gpu-a2")
    assert default_listing.group("az_us_east_1b") == ids("gpu-b1", "cpu-b2")
    assert default_listing.group("type_g5_xlarge") == ids("gpu-a1", "gpu-a2")
    assert default_listing.group("type_p4d_24xlarge") == ids("gpu-b1")
    assert default_listing.group("type_m5_large") == ids("cpu-b2")


def test_scheduled_events_surface_from_describe_instance_status(
    default_listing: Listing, fleet: dict[str, str]
) -> None:
    events = default_listing.hostvars[fleet["gpu-a1"]]["ec2_scheduled_events"]
    assert len(events) == 1
    event = events[0]
    assert event["code"] == "system-reboot"
    assert event["description"] == "scheduled reboot"
    assert event["instance_event_id"].startswith("instance-event-")
    not_before = datetime.datetime.fromisoformat(event["not_before"])
    assert not_before > datetime.datetime.now(datetime.UTC)
    assert datetime.datetime.fromisoformat(event["not_after"]) > not_before
    for other in ("gpu-a2", "gpu-b1", "cpu-b2"):
        assert default_listing.hostvars[fleet[other]]["ec2_scheduled_events"] == []
    # the region-wide calls for what is not ok (events, instance checks, system checks); no ID asked
    assert default_listing.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 3}


# ---- options ----------------------------------------------------------------------------------


def test_hostnames_preference_first_value_wins(tmp_path: Path, proxy: Ec2Proxy) -> None:
    listing = run_inventory(
        tmp_path,
        {
            "regions": [REGION],
            "endpoint_url": proxy.url,
            "include_events": False,
            "hostnames": [
                {"name": "tag:Name", "prefix": "tag:team", "separator": "-"},
                "private-ip-address",
                "instance-id",
            ],
        },
    )
    assert listing.rc == 0, listing.stderr
    # gpu-* have a Name (and a team); the cpu host has no Name: its private IP comes next
    assert set(listing.hostvars) == {"ml-gpu-a1", "infra-gpu-a2", "ml-gpu-b1", "10.42.2.12"}
    assert "ec2_scheduled_events" not in listing.hostvars["ml-gpu-a1"]
    assert proxy.calls == {"DescribeInstances": 1}  # include_events: false -> no DescribeInstanceStatus


def test_the_store_a_source_names_is_published_on_the_ec2_group(tmp_path: Path, proxy: Ec2Proxy) -> None:
    """store_table (with the defaults applied: the first region, the source's endpoint) becomes the ec2
    group's fleetops_store_* variables, which the playbooks hand to fleetops.node.ec2_lease; without it
    there are none."""
    base = {"regions": [REGION], "endpoint_url": proxy.url, "include_events": False}
    listing = run_inventory(tmp_path, {**base, "store_table": "fleet-store"})
    assert listing.rc == 0, listing.stderr
    published = {
        "fleetops_store_table": "fleet-store",
        "fleetops_store_region": REGION,
        "fleetops_store_endpoint_url": proxy.url,
    }
    assert listing.hostvars and all(
        {k: v for k, v in hv.items() if k.startswith("fleetops_store_")} == published
        for hv in listing.hostvars.values()
    )
    own = run_inventory(
        tmp_path,
        {**base, "store_table": "t", "store_region": "eu-west-1", "store_endpoint_url": "http://127.0.0.1:1"},
    )
    for hv in own.hostvars.values():
        assert (
            hv["fleetops_store_region"] == "eu-west-1"
            and hv["fleetops_store_endpoint_url"] == "http://127.0.0.1:1"
        )
    without = run_inventory(tmp_path, base)
    assert not any(k.startswith("fleetops_store_") for hv in without.hostvars.values() for k in hv)


def test_shared_hostnames_are_made_unique_with_the_instance_id_never_dropped(
    tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str]
) -> None:
    config = {
        "regions": [REGION],
        "endpoint_url": proxy.url,
        "include_events": False,
        "hostnames": ["tag:fleetops"],
    }
    listing = run_inventory(tmp_path, config)
    assert listing.rc == 0, listing.stderr
    gpus = [fleet[n] for n in ("gpu-a1", "gpu-a2", "gpu-b1")]
    assert set(listing.hostvars) == {f"gpu-{i}" for i in gpus} | {"cpu"}
    for i in gpus:
        assert listing.hostvars[f"gpu-{i}"]["ec2_instance_id"] == i
    assert listing.stderr.count("3 instances share hostname 'gpu'") == 1, listing.stderr


def test_filters_include_and_exclude(tmp_path: Path, proxy: Ec2Proxy) -> None:
    listing = run_inventory(
        tmp_path,
        {
            "regions": [REGION],
            "endpoint_url": proxy.url,
            "include_events": False,
            "hostnames": ["tag:Name", "instance-id"],
            "filters": {
                "instance-state-name": "running",
                "tag:fleetops": "gpu",
                # EC2 also takes wildcards ("g5.*"); moto matches instance-type exactly
                "instance-type": ["g5.xlarge", "p4d.24xlarge"],
            },
            "include_filters": [{"tag:Name": "gpu-stopped", "instance-state-name": "stopped"}],
            "exclude_filters": [{"tag:drain": True}],
        },
    )
    assert listing.rc == 0, listing.stderr
    assert set(listing.hostvars) == {"gpu-a1", "gpu-b1", "gpu-stopped"}
    assert listing.hostvars["gpu-stopped"]["ec2_state"] == "stopped"
    assert proxy.calls == {"DescribeInstances": 3}  # one listing per filter set


def test_keyed_groups_compose_and_groups(tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str]) -> None:
    listing = run_inventory(
        tmp_path,
        {
            "regions": [REGION],
            "endpoint_url": proxy.url,
            "hostnames": ["tag:Name", "instance-id"],
            "strict": True,
            "keyed_groups": [{"key": "ec2_tags.team | default('none')", "prefix": "team"}],
            "compose": {
                "ansible_host": "'lab-' ~ ec2_private_ip",
                "gpu_count": "8 if ec2_instance_type == 'p4d.24xlarge' else 1",
            },
            "groups": {"maintenance_due": "ec2_scheduled_events | length > 0", "big": "gpu_count > 1"},
        },
    )
    assert listing.rc == 0, listing.stderr
    assert listing.group("team_ml") == {"gpu-a1", "gpu-b1"}
    assert listing.group("team_infra") == {"gpu-a2"}
    assert listing.group("team_none") == {fleet["cpu-b2"]}
    assert listing.hostvars["gpu-a1"]["ansible_host"] == "lab-10.42.1.11"
    assert listing.hostvars["gpu-b1"]["gpu_count"] == 8
    assert listing.group("maintenance_due") == {"gpu-a1"}
    assert listing.group("big") == {"gpu-b1"}


def test_aws_ec2_configs_keep_working_with_aws_ec2_hostvars(tmp_path: Path, proxy: Ec2Proxy) -> None:
    config: dict[str, Any] = {
        "regions": [REGION],
        "endpoint_url": proxy.url,
        "include_events": False,
        "hostnames": ["tag:Name", "instance-id"],
        "keyed_groups": [
            {"key": "placement.region", "prefix": "aws_region"},
            {"key": "tags", "prefix": "tag"},
        ],
        "compose": {"ansible_host": "private_dns_name"},
    }
    listing = run_inventory(tmp_path, {**config, "aws_ec2_hostvars": True})
    assert listing.rc == 0, listing.stderr
    a1 = listing.hostvars["gpu-a1"]
    assert a1["private_ip_address"] == "10.42.1.11"
    assert a1["placement"]["availability_zone"] == "us-east-1a"
    assert a1["ansible_host"] == a1["private_dns_name"] != ""
    assert len(listing.group("aws_region_us_east_1")) == 4
    # 'tags' is not set (a reserved name in Ansible): the warning says what to use instead
    assert "keyed_groups[1].key uses 'tags'" in listing.stderr
    assert "use ec2_tags" in listing.stderr

    listing = run_inventory(tmp_path, config)  # aws_ec2_hostvars off: warned, not silently empty
    assert listing.rc == 0, listing.stderr
    assert "keyed_groups[0].key uses 'placement'" in listing.stderr
    assert "compose.ansible_host uses 'private_dns_name'" in listing.stderr
    assert "set aws_ec2_hostvars: true" in listing.stderr
    assert listing.group("aws_region_us_east_1") == set()


def test_empty_regions_means_every_region_of_the_account(tmp_path: Path, proxy: Ec2Proxy) -> None:
    listing = run_inventory(tmp_path, {"endpoint_url": proxy.url, "include_events": False})
    assert listing.rc == 0, listing.stderr
    assert len(listing.hostvars) == 4
    assert proxy.calls["DescribeRegions"] == 1
    assert proxy.calls["DescribeInstances"] > 10  # one per region moto reports


def test_example_inventory_lists_the_gpu_fleet(
    tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str]
) -> None:
    """inventory/example.fleet_ec2.yml as shipped, pointed at moto by AWS_ENDPOINT_URL."""
    example = yaml.safe_load((REPO / "inventory" / "example.fleet_ec2.yml").read_text())
    assert example.pop("plugin") == "fleetops.node.ec2"
    assert example["filters"]["instance-type"] == ["g5.*", "p4d.*", "p5.*"]
    example["filters"]["instance-type"] = [
        "g5.xlarge",
        "p4d.24xlarge",
        "p5.48xlarge",
    ]  # moto: no wildcards here
    example["cache_connection"] = str(tmp_path / "cache")
    listing = run_inventory(tmp_path, example, env={"AWS_ENDPOINT_URL": proxy.url})
    assert listing.rc == 0, listing.stderr
    assert set(listing.hostvars) == {"gpu-a1", "gpu-a2", "gpu-b1"}  # m5 and stopped hosts left out
    assert listing.group("family_g5") == {"gpu-a1", "gpu-a2"}
    assert listing.group("family_p4d") == {"gpu-b1"}
    assert listing.group("team_ml") == {"gpu-a1", "gpu-b1"}
    assert listing.group("maintenance_due") == {"gpu-a1"}
    assert listing.group("impaired") == set()
    assert listing.hostvars["gpu-a1"]["ansible_user"] == "ubuntu"
    assert proxy.calls["DescribeInstances"] == 4  # 2 regions x (filters + exclude_filters)


# ---- concurrency ------------------------------------------------------------------------------


def test_requests_run_side_by_side_within_the_bound_and_list_the_same(
    tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str]
) -> None:
    """Regions, filter sets and status calls run side by side, never more than max_concurrent_requests
    at once; the listing is the same at any bound, and statuses are asked only for the instances kept."""
    config = {
        "regions": [REGION, "us-west-2", "eu-west-1"],  # the fleet is in the first; the others answer empty
        "endpoint_url": proxy.url,
        "hostnames": ["tag:Name", "instance-id"],
        "filters": {"instance-state-name": "running"},
        "include_filters": [{"tag:Name": "gpu-stopped", "instance-state-name": "stopped"}],
        "exclude_filters": [{"tag:drain": True}],
        "keyed_groups": [{"key": "ec2_tags.team | default('none')", "prefix": "team"}],
    }
    proxy.delay = 0.2  # every request takes a while: requests sent side by side overlap at the proxy
    listings = {}
    for bound in (1, 3):
        proxy.reset_counters()
        listing = run_inventory(tmp_path, {**config, "max_concurrent_requests": bound})
        assert listing.rc == 0, listing.stderr
        # 3 regions x 3 listings (filters, include, exclude): 9 DescribeInstances; 3 regions x 3
        # region-wide status calls, and one by ID for the kept instance that is not running
        assert proxy.calls == {"DescribeInstances": 9, "DescribeInstanceStatus": 10}
        assert proxy.peak_in_flight == bound
        assert proxy.status_ids == [fleet["gpu-stopped"]]  # gpu-a2 is excluded (drain); the rest run
        listings[bound] = listing
    assert listings[3].data == listings[1].data
    assert set(listings[3].hostvars) == {"gpu-a1", "gpu-b1", fleet["cpu-b2"], "gpu-stopped"}
    assert listings[3].hostvars["gpu-a1"]["ec2_scheduled_events"][0]["code"] == "system-reboot"


# ---- throttling -------------------------------------------------------------------------------


def test_throttling_within_budget_is_retried(tmp_path: Path, proxy: Ec2Proxy) -> None:
    proxy.throttle(3, {"DescribeInstances"})  # the next 3 listing calls get 503 RequestLimitExceeded
    config = {"regions": [REGION], "endpoint_url": proxy.url, "max_attempts": 4, **FAST_RETRIES}
    listing = run_inventory(tmp_path, config, verbose=True)
    assert listing.rc == 0, listing.stderr
    assert len(listing.hostvars) == 4
    assert proxy.throttled == {"DescribeInstances": 3}
    assert proxy.calls == {"DescribeInstances": 4, "DescribeInstanceStatus": 3}
    retried = "ec2:DescribeInstances in us-east-1: RequestLimitExceeded: Request limit exceeded.; attempt 3 of 4 failed"
    assert retried in listing.stdout  # -vvv

    proxy.reset_counters()
    proxy.throttle(2, {"DescribeInstanceStatus"})
    listing = run_inventory(tmp_path, {**config, "max_attempts": 3})
    assert listing.rc == 0, listing.stderr
    assert proxy.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 5}


def test_throttling_beyond_budget_fails_naming_the_call(tmp_path: Path, proxy: Ec2Proxy) -> None:
    proxy.throttle(1000)
    listing = run_inventory(
        tmp_path, {"regions": [REGION], "endpoint_url": proxy.url, "max_attempts": 3, **FAST_RETRIES}
    )
    assert listing.rc != 0
    assert "Traceback" not in listing.stderr
    assert plugin_failures(listing.stderr) == {
        "test.fleet_ec2.yml": "Failed to call ec2:DescribeInstances in us-east-1 after 3 attempts: "
        "RequestLimitExceeded: Request limit exceeded."
    }
    # botocore's own retries are off: these 3 are ours; the 3 region-wide status calls, sent beside
    # the listing, ran out of their own 3 attempts (or were cancelled when the listing failed)
    assert proxy.calls["DescribeInstances"] == 3
    assert proxy.calls["DescribeInstanceStatus"] <= 3 * 3


def test_strict_permissions(tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str]) -> None:
    base = {"regions": [REGION], "endpoint_url": proxy.url, "hostnames": ["tag:Name", "instance-id"]}

    # May list instances, not their status: hosts kept, without the event variables
    proxy.deny({"DescribeInstanceStatus"})
    listing = run_inventory(tmp_path, {**base, "strict_permissions": False})
    assert listing.rc == 0, listing.stderr
    assert len(listing.hostvars) == 4
    assert "ec2_scheduled_events" not in listing.hostvars["gpu-a1"]
    assert "ec2_status_checks" not in listing.hostvars["gpu-a1"]
    assert "no scheduled events or status checks in us-east-1" in listing.stderr

    # May not list instances: strict (the default) fails naming the call; otherwise the region is skipped
    proxy.deny({"DescribeInstances"})
    listing = run_sources(tmp_path, {"strict": base, "lenient": {**base, "strict_permissions": False}})
    assert "Traceback" not in listing.stderr
    assert plugin_failures(listing.stderr) == {
        "strict.fleet_ec2.yml": "Failed to call ec2:DescribeInstances in us-east-1: "
        "UnauthorizedOperation: You are not authorized to perform this operation."
    }
    assert "fleetops.node.ec2: skipping us-east-1: UnauthorizedOperation" in listing.stderr
    assert listing.rc == 0, listing.stderr  # the lenient source parsed (to no host)
    assert listing.hostvars == {}


# ---- bad configuration ------------------------------------------------------------------------

BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-option": (
        {"regoins": ["us-east-1"]},
        "unknown option for fleetops.node.ec2: 'regoins' (did you mean 'regions'?)",
    ),
    "aws_ec2-option": (
        {"iam_role_arn": "arn:aws:iam::123456789012:role/x"},
        "'iam_role_arn' (an amazon.aws.aws_ec2 option this plugin does not implement)",
    ),
    "bad-region": (
        {"regions": ["us-esat-1"]},
        "regions: 'us-esat-1' is not an AWS region, did you mean 'us-east-1'? (botocore ",
    ),
    "bad-hostname": (
        {"hostnames": ["private-ip"]},
        "hostnames: unknown entry 'private-ip' (did you mean 'private-ip-address'?)",
    ),
    "bad-endpoint": ({"endpoint_url": "127.0.0.1:5000"}, "endpoint_url must be an http:// or https:// URL"),
    "bad-page-size": ({"page_size": 2}, "page_size must be between 5 and 1000, got 2"),
    "bad-concurrency": (
        {"max_concurrent_requests": 0},
        "max_concurrent_requests must be between 1 and 16, got 0",
    ),
    "bad-type": ({"max_attempts": "many"}, "max_attempts"),
    "half-credentials": (
        {"aws_access_key": "AKIAEXAMPLE"},
        "aws_access_key and aws_secret_key must be given together",
    ),
    "unknown-profile": (
        {"aws_profile": "nosuchprofile"},
        "The config profile (nosuchprofile) could not be found",
    ),
    "unreachable-endpoint": (
        {"endpoint_url": "UNREACHABLE", "max_attempts": 2},
        "Failed to call ec2:DescribeInstances in us-east-1 after 2 attempts: Could not connect to the endpoint URL",
    ),
}


def test_bad_config_gives_one_clear_error(tmp_path: Path, proxy: Ec2Proxy) -> None:
    """Every case is one source of a single ansible-inventory run (ansible reports each one)."""
    sources = {}
    for name, (config, _) in BAD_CONFIGS.items():
        full = {"regions": [REGION], "endpoint_url": proxy.url, **FAST_RETRIES, **config}
        if full["endpoint_url"] == "UNREACHABLE":
            full["endpoint_url"] = f"http://127.0.0.1:{free_port()}"
        sources[name] = full
    listing = run_sources(tmp_path, sources)
    assert listing.rc != 0
    assert "Traceback" not in listing.stderr
    failures = plugin_failures(listing.stderr)
    for name, (_, message) in BAD_CONFIGS.items():
        assert message in failures.get(f"{name}.fleet_ec2.yml", ""), (
            name,
            failures.get(f"{name}.fleet_ec2.yml"),
        )
    assert proxy.calls.total() == 0  # all refused before any request


def test_no_credentials_gives_one_clear_error(tmp_path: Path, proxy: Ec2Proxy) -> None:
    listing = run_inventory(
        tmp_path,
        {"regions": [REGION], "endpoint_url": proxy.url},
        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
    )
    assert listing.rc != 0
    assert "Traceback" not in listing.stderr
    failure = plugin_failures(listing.stderr)["test.fleet_ec2.yml"]
    assert failure.startswith(
        "Failed to call ec2:DescribeInstances in us-east-1: Unable to locate credentials (set "
    )
    assert proxy.calls.total() == 0


# ---- cache and scale --------------------------------------------------------------------------


def test_cache_serves_the_same_query_and_only_that_query(tmp_path: Path, proxy: Ec2Proxy) -> None:
    config: dict[str, Any] = {
        "regions": [REGION],
        "endpoint_url": proxy.url,
        "hostnames": ["tag:Name", "instance-id"],
        "cache": True,
        "cache_plugin": "ansible.builtin.jsonfile",
        "cache_connection": str(tmp_path / "cache"),
        "cache_timeout": 600,
    }
    first = run_inventory(tmp_path, config)
    assert first.rc == 0, first.stderr
    assert proxy.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 3}

    proxy.reset_counters()
    second = run_inventory(tmp_path, config)
    assert second.rc == 0, second.stderr
    assert proxy.calls.total() == 0
    assert second.data == first.data

    # Another query is another cache key: never another query's cached answer.
    third = run_inventory(tmp_path, {**config, "filters": {"tag:team": "ml"}})
    assert third.rc == 0, third.stderr
    assert set(third.hostvars) == {"gpu-a1", "gpu-b1"}
    assert proxy.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 3}

    # The cache holds shaped hosts: other hostnames or host variables are another key too.
    for other in ({"hostnames": ["instance-id"]}, {"aws_ec2_hostvars": True}):
        proxy.reset_counters()
        listing = run_inventory(tmp_path, {**config, **other})
        assert listing.rc == 0, listing.stderr
        assert proxy.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 3}, other
        again = run_inventory(tmp_path, {**config, **other})
        assert again.rc == 0, again.stderr
        assert again.data == listing.data
        assert proxy.calls == {"DescribeInstances": 1, "DescribeInstanceStatus": 3}, other
    assert set(listing.hostvars) == set(first.hostvars)
    assert listing.hostvars["gpu-a1"]["private_ip_address"] == "10.42.1.11"

    # compose, groups and keyed_groups apply to cached hosts on every listing
    proxy.reset_counters()
    composed = run_inventory(tmp_path, {**config, "compose": {"rack": "ec2_az ~ '-r1'"}})
    assert composed.rc == 0, composed.stderr
    assert proxy.calls.total() == 0
    assert composed.hostvars["gpu-a1"]["rack"] == "us-east-1a-r1"


# Builds the inventory in one process twice, the second time with _HostvarsWriter's batch path off
# (one set_variable per variable), and prints what each made: every variable with its exact type
# and its data tags (origin, trust) all the way down, group membership in order, and whether any
# container is shared between hosts. Ansible's tags are private API: read here, never in the plugin.
_SNAPSHOT = r"""
import json, sys
from ansible.plugins.loader import init_plugin_loader, inventory_loader
init_plugin_loader([sys.argv[1]])
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.module_utils._internal._datatag import AnsibleTagHelper

module = sys.modules[type(inventory_loader.get("fleetops.node.ec2")).__module__]

def describe(value, containers):
    tags = sorted(repr(tag) for tag in AnsibleTagHelper.tags(value))
    if isinstance(value, dict):
        containers.append(id(value))
        inner = {k: describe(v, containers) for k, v in value.items()}
    elif isinstance(value, list):
        containers.append(id(value))
        inner = [describe(v, containers) for v in value]
    else:
        inner = value
    return [type(value).__name__, tags, inner]

result = {}
for batch in (True, False):
    module._HostvarsWriter.batch = batch
    inventory = InventoryManager(loader=DataLoader(), sources=sys.argv[2:])
    containers = []
    hosts = {name: describe(dict(host.vars), containers) for name, host in inventory.hosts.items()}
    groups = {name: [[h.name for h in g.hosts], [c.name for c in g.child_groups], describe(dict(g.vars), [])]
              for name, g in inventory.groups.items()}
    result[str(batch)] = {"hosts": hosts, "groups": groups, "shared": len(containers) - len(set(containers))}
print(json.dumps(result))
"""


@pytest.mark.parametrize(
    "configs",
    [
        pytest.param([{}], id="defaults"),
        pytest.param(
            [
                {
                    "hostnames": ["tag:Name", "instance-id"],
                    "strict": True,
                    "keyed_groups": [{"key": "ec2_tags.team | default('none')", "prefix": "team"}],
                    "compose": {"ansible_host": "'lab-' ~ ec2_private_ip", "gpu_count": "ec2_tags | length"},
                    "groups": {"maintenance_due": "ec2_scheduled_events | length > 0"},
                }
            ],
            id="constructed",
        ),
        pytest.param([{"aws_ec2_hostvars": True, "hostvars_prefix": "aws_"}], id="aws_ec2_hostvars"),
        # names Ansible warns about, a host that is also a group's name, hosts an earlier source made
        pytest.param([{"aws_ec2_hostvars": True, "hostvars_prefix": "aws-"}], id="invalid-names"),
        pytest.param(
            [{"hostnames": ["tag:fleetops"]}, {"hostnames": ["tag:Name", "instance-id"]}], id="clashes"
        ),
        pytest.param(
            [{"hostnames": ["tag:Name"]}, {"hostnames": ["tag:Name"], "compose": {"x": "1"}}], id="twice"
        ),
    ],
)
def test_batched_hostvars_are_what_one_set_variable_per_variable_makes(
    tmp_path: Path, proxy: Ec2Proxy, configs: list[dict[str, Any]]
) -> None:
    sources = []
    for n, config in enumerate(configs):
        path = tmp_path / f"s{n}.fleet_ec2.yml"
        config = {"plugin": "fleetops.node.ec2", "regions": [REGION], "endpoint_url": proxy.url, **config}
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        sources.append(str(path))
    if configs[0].get("hostnames") == ["tag:fleetops"]:
        # a host named like a group: its variables go to the group, as with set_variable
        sources.insert(0, str(tmp_path / "groups.yml"))
        Path(sources[0]).write_text("all:\n  children:\n    gpu:\n      vars:\n        rack: r1\n")
    proc = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT, str(REPO / "collections"), *sources],
        capture_output=True,
        text=True,
        env=ansible_env(tmp_path),
        cwd=tmp_path,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    batched, ordinary = result["True"], result["False"]
    assert len(batched["hosts"]) >= 2
    assert batched["hosts"] == ordinary["hosts"]
    assert batched["groups"] == ordinary["groups"]
    assert batched["shared"] == ordinary["shared"] == 0
    # tagged with the source, as set_variable does
    zones = [variables["ec2_az"] for _, _, variables in batched["hosts"].values() if "ec2_az" in variables]
    assert zones and all(any(tag.startswith("Origin(") for tag in tags) for _, tags, _ in zones)


def test_5000_instances_list_across_pages_and_cache_makes_no_call(
    tmp_path: Path, scale_fleet: ScaleFleet | None
) -> None:
    assert scale_fleet is not None
    upstream = scale_fleet.ready()
    with Ec2Proxy(upstream, inject_events=False) as proxy:
        config = {
            "regions": [SCALE_REGION],
            "endpoint_url": proxy.url,
            # moto pages by reservation (100 instances each, see launch_many): 50 of them, 20 a page
            "page_size": 20,
            "cache": True,
            "cache_plugin": "ansible.builtin.jsonfile",
            "cache_connection": str(tmp_path / "cache"),
            "cache_timeout": 600,
        }
        first = run_inventory(tmp_path, config, verbose=True)
        assert first.rc == 0, first.stderr
        # the status of running instances is asked region-wide, for what is not ok: 3 calls, not 50
        assert proxy.calls == {"DescribeInstances": 3, "DescribeInstanceStatus": 3}
        hostvars = first.hostvars
        assert set(hostvars) == set(scale_fleet.instance_ids)
        assert len(first.group("ec2")) == SCALE_COUNT
        assert len(first.group("az_eu_west_1a")) == len(first.group("az_eu_west_1b")) == SCALE_COUNT // 2
        assert len(first.group("type_g5_xlarge")) == SCALE_COUNT
        assert all(v["ec2_status_checks"] == {"system": "ok", "instance": "ok"} for v in hostvars.values())

        proxy.reset_counters()
        second = run_inventory(tmp_path, config)
        assert second.rc == 0, second.stderr
        assert proxy.calls.total() == 0  # served from the cache: no API call at all
        assert second.hostvars == hostvars
        timings = [line for line in first.stdout.splitlines() if line.startswith("fleetops.node.ec2: ")]
        print(
            f"\nfill {SCALE_COUNT} in moto: {scale_fleet.seconds:.1f}s; ansible-inventory --list: "
            f"{first.seconds:.1f}s from the API ({'; '.join(timings)}), {second.seconds:.1f}s from the cache"
        )
