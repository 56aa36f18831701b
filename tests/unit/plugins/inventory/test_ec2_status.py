"""fleetops.node.ec2's status variables from the region-wide "what is not ok" calls equal what
DescribeInstanceStatus says of every listed instance, asked by ID (loopback moto only).

The plugin asks DescribeInstanceStatus region-wide for the running instances with a scheduled event,
or an instance or system check that is not ok (three filtered calls), and takes a running instance
in none of the answers as ok with no event; instances in other states it asks about by ID. The
expectations here are computed from moto's own answers the old way, independently of the plugin:
DescribeInstanceStatus with IncludeAllInstances for every listed instance ID, 100 a call, through
the lab's proxy (which adds the scheduled events moto does not model). The fleet has an instance in
every state the variables can tell apart (see FLEET), and 250 healthy ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab.ec2sim import Ec2Proxy, MotoServer, client, launch_many, register_ami
from tests.unit.plugins.inventory.test_ec2_inventory import plugin_failures, run_inventory

REGION = "us-east-1"
HEALTHY = 250  # more than two chunks of 100 IDs for the expectations
# name -> (stopped after launch, tags): moto reads fleetops:instance-status / fleetops:system-status as
# the running instance's checks and fleetops:event as its events (fleetops_lab.motoserver, ec2sim)
FLEET: dict[str, tuple[bool, dict[str, str]]] = {
    "healthy": (False, {}),
    "event": (False, {"fleetops:event": "system-reboot"}),
    "two-events": (False, {"fleetops:event": "instance-stop,system-maintenance"}),
    "instance-impaired": (False, {"fleetops:instance-status": "impaired"}),
    "system-impaired": (False, {"fleetops:system-status": "impaired"}),
    "initializing": (
        False,
        {"fleetops:instance-status": "initializing", "fleetops:system-status": "initializing"},
    ),
    "insufficient-data": (False, {"fleetops:instance-status": "insufficient-data"}),
    "impaired-with-event": (
        False,
        {"fleetops:system-status": "impaired", "fleetops:event": "instance-retirement"},
    ),
    "stopped": (True, {}),
    "stopped-with-event": (True, {"fleetops:event": "instance-stop", "fleetops:instance-status": "impaired"}),
    "other-team-impaired": (False, {"team": "other", "fleetops:instance-status": "impaired"}),
}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(moto: MotoServer) -> dict[str, str]:
    """name -> instance id, for FLEET (and HEALTHY untagged running instances beside them)."""
    launch_many(moto.url, REGION, HEALTHY)
    ec2 = client(moto.url, REGION)
    image_id = register_ami(moto.url, REGION, name="fleetops-status")
    ids = {}
    for name, (_stopped, tags) in FLEET.items():
        answer = ec2.run_instances(
            ImageId=image_id,
            MinCount=1,
            MaxCount=1,
            InstanceType="g5.xlarge",
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in {**tags, "Name": name}.items()],
                }
            ],
        )
        ids[name] = answer["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[ids[n] for n, (stopped, _) in FLEET.items() if stopped])
    return ids


@pytest.fixture
def proxy(moto: MotoServer, fleet: dict[str, str]) -> Iterator[Ec2Proxy]:
    with Ec2Proxy(moto.url) as p:
        yield p


def by_id(url: str, instance_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The old way: DescribeInstanceStatus (IncludeAllInstances) for every ID, 100 a call; id -> item."""
    ec2 = client(url, REGION)
    items = {}
    for start in range(0, len(instance_ids), 100):
        answer = ec2.describe_instance_status(
            InstanceIds=instance_ids[start : start + 100], IncludeAllInstances=True
        )
        items.update((s["InstanceId"], s) for s in answer["InstanceStatuses"])
    return items


def status_hostvars(item: dict[str, Any]) -> dict[str, Any]:
    """The two variables the plugin has always made of a DescribeInstanceStatus item ({}: none)."""
    return {
        "ec2_scheduled_events": [
            {
                "code": e.get("Code"),
                "description": e.get("Description"),
                "not_before": e["NotBefore"].isoformat() if "NotBefore" in e else None,
                "not_after": e["NotAfter"].isoformat() if "NotAfter" in e else None,
                "not_before_deadline": e["NotBeforeDeadline"].isoformat()
                if "NotBeforeDeadline" in e
                else None,
                "instance_event_id": e.get("InstanceEventId"),
            }
            for e in item.get("Events") or []
        ],
        "ec2_status_checks": {
            "system": (item.get("SystemStatus") or {}).get("Status"),
            "instance": (item.get("InstanceStatus") or {}).get("Status"),
        },
    }


def test_moto_answers_the_status_filters_as_ec2(proxy: Ec2Proxy, fleet: dict[str, str]) -> None:
    """The filters the plugin relies on, as moto answers them here (else the comparison proves nothing)."""
    ec2 = client(proxy.url, REGION)

    def names(name: str, values: list[str], include_all: bool = False) -> set[str]:
        answer = ec2.describe_instance_status(
            Filters=[{"Name": name, "Values": values}], IncludeAllInstances=include_all
        )
        found = {s["InstanceId"] for s in answer["InstanceStatuses"]}
        return {n for n, i in fleet.items() if i in found} | ({"?"} if found - set(fleet.values()) else set())

    assert names("event.code", ["system-reboot", "instance-stop"]) == {"event", "two-events"}
    assert names("event.code", ["instance-stop"], include_all=True) == {"two-events", "stopped-with-event"}
    assert names("instance-status.status", ["impaired"]) == {"instance-impaired", "other-team-impaired"}
    assert names("system-status.status", ["initializing", "impaired"]) == {
        "system-impaired",
        "initializing",
        "impaired-with-event",
    }
    assert names("instance-status.status", ["not-applicable"]) == set()  # running instances only
    assert names("instance-status.status", ["not-applicable"], include_all=True) == {
        "stopped",
        "stopped-with-event",
    }
    healthy = by_id(proxy.url, [fleet["healthy"], fleet["event"]])
    assert healthy[fleet["healthy"]]["InstanceStatus"]["Status"] == "ok"
    assert [e["Code"] for e in healthy[fleet["event"]]["Events"]] == ["system-reboot"]


CONFIGS = {
    "running": {},
    "running-and-stopped": {"filters": {"instance-state-name": ["running", "stopped"]}},
    # exclude sets: the status calls by ID wait for the listings (the other path through the plugin)
    "excluding-a-team": {
        "filters": {"instance-state-name": ["running", "stopped"]},
        "exclude_filters": [{"tag:team": "other"}],
    },
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_host_variable_is_what_describe_instance_status_by_id_says(
    tmp_path: Path, proxy: Ec2Proxy, fleet: dict[str, str], name: str
) -> None:
    config = {"regions": [REGION], "endpoint_url": proxy.url, **CONFIGS[name]}
    listing = run_inventory(tmp_path, config)
    assert listing.rc == 0, listing.stderr
    calls, status_ids = dict(proxy.calls), list(proxy.status_ids)
    without = run_inventory(tmp_path, {**config, "include_events": False})
    assert without.rc == 0, without.stderr
    assert set(listing.hostvars) == set(without.hostvars)
    old_way = by_id(proxy.url, sorted(listing.hostvars))
    expected = {
        host: {**variables, **status_hostvars(old_way.get(host, {}))}
        for host, variables in without.hostvars.items()
    }
    assert listing.hostvars == expected  # every variable of every host, the status ones included
    meta = {**without.data["_meta"], "hostvars": expected}
    assert listing.data == {**without.data, "_meta": meta}  # and the same groups

    # the comparison covers every case: the fleet's hosts, and the values they take
    stopped = {fleet["stopped"], fleet["stopped-with-event"]}
    listed_fleet = {n for n, i in fleet.items() if i in listing.hostvars}
    assert listed_fleet == set(FLEET) - (
        {"other-team-impaired"} if "exclude_filters" in config else set()
    ) - ({"stopped", "stopped-with-event"} if name == "running" else set())
    assert len(listing.hostvars) == len(listed_fleet) + HEALTHY
    checks = {
        (v["ec2_status_checks"]["system"], v["ec2_status_checks"]["instance"]) for v in expected.values()
    }
    assert {("ok", "ok"), ("impaired", "ok"), ("ok", "impaired"), ("initializing", "initializing")} <= checks
    assert ("ok", "insufficient-data") in checks
    events = {e["code"] for v in expected.values() for e in v["ec2_scheduled_events"]}
    assert {"system-reboot", "instance-stop", "system-maintenance", "instance-retirement"} <= events
    if name != "running":
        assert ("not-applicable", "not-applicable") in checks
        assert expected[fleet["stopped-with-event"]]["ec2_scheduled_events"][0]["code"] == "instance-stop"

    # 3 region-wide calls for the running instances; by ID only the stopped ones, never a running one
    assert calls["DescribeInstanceStatus"] == 3 + (0 if name == "running" else 1)
    assert sorted(status_ids) == ([] if name == "running" else sorted(stopped))


def test_without_describe_instance_status_hosts_are_kept_or_the_source_fails(
    tmp_path: Path, proxy: Ec2Proxy
) -> None:
    """As before: strict_permissions (the default) fails naming the call; off, hosts without status variables."""
    proxy.deny({"DescribeInstanceStatus"})
    base = {"regions": [REGION], "endpoint_url": proxy.url}
    listing = run_inventory(tmp_path, {**base, "strict_permissions": False})
    assert listing.rc == 0, listing.stderr
    assert len(listing.hostvars) == HEALTHY + len(FLEET) - 2
    assert not any("ec2_status_checks" in v or "ec2_scheduled_events" in v for v in listing.hostvars.values())
    assert "no scheduled events or status checks in us-east-1" in listing.stderr

    strict = run_inventory(tmp_path, base)
    assert strict.rc != 0
    assert plugin_failures(strict.stderr) == {
        "test.fleet_ec2.yml": "Failed to call ec2:DescribeInstanceStatus in us-east-1: "
        "UnauthorizedOperation: You are not authorized to perform this operation."
    }
