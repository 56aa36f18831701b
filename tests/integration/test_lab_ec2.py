"""The lab's EC2 side: a real local EC2 endpoint (moto) whose instances are the lab hosts.

`ansible-inventory` through the fleetops.node.ec2 plugin groups them by AZ, `fleetops scan` reaches
them over ssh through that inventory, and the scheduled event moto cannot model (added by the
lab's proxy, as DescribeInstanceStatus reports it on AWS) surfaces as an ec2_scheduled_event finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops_lab import Lab
from tests.helpers import LAB_ANSWERED, REPO, fleetops, lab_blind

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(4, ec2=True)
    try:
        yield lab
    finally:
        lab.down()


def test_ec2_inventory_groups_lab_hosts_by_az(lab: Lab) -> None:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab.ec2_inventory_path()), "--list"],
        capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # ansible-inventory writes plugin-provided strings as {"__ansible_unsafe": ...}
    data = json.loads(proc.stdout, object_hook=lambda o: o.get("__ansible_unsafe", o) if len(o) == 1 else o)
    assert sorted(data["az_us_east_1a"]["hosts"]) == ["lab-01", "lab-03"]
    assert sorted(data["az_us_east_1b"]["hosts"]) == ["lab-02", "lab-04"]
    hostvars = data["_meta"]["hostvars"]
    for host in ("lab-01", "lab-02", "lab-03", "lab-04"):
        assert hostvars[host]["ansible_host"] == hostvars[host]["ec2_private_ip"]
    events = hostvars["lab-02"]["ec2_scheduled_events"]
    assert [e["code"] for e in events] == ["system-reboot"]
    assert hostvars["lab-01"]["ec2_scheduled_events"] == []


def test_scan_through_the_ec2_inventory(lab: Lab) -> None:
    result = fleetops("scan", "-i", str(lab.ec2_inventory_path()), "--format", "json", "-q")
    report = result.json()
    assert sorted(report["hosts"]) == ["lab-01", "lab-02", "lab-03", "lab-04"]
    assert all(
        h["status"] == LAB_ANSWERED and lab_blind(h) == {"zombie_memcg"} for h in report["hosts"].values()
    ), report["hosts"]
    events = [f for f in report["hosts"]["lab-02"]["findings"] if f["check"] == "ec2_scheduled_event"]
    assert [(f["severity"], f["data"]["code"], f["data"]["source"]) for f in events] == [
        ("warning", "system-reboot", "inventory")
    ]
    for host in ("lab-01", "lab-03", "lab-04"):
        assert not [f for f in report["hosts"][host]["findings"] if f["check"] == "ec2_scheduled_event"]
    assert result.rc == 1  # a warning finding


def test_plan_groups_by_ec2_az_with_no_extra_config(lab: Lab) -> None:
    result = fleetops(
        "plan", "reboot", "-i", str(lab.ec2_inventory_path()), "--format", "json", "--canary", "0"
    )
    assert result.rc == 0, result.stderr
    plan = result.json()
    assert set(plan["groups"]) == {"us-east-1a", "us-east-1b"}
    for batch in plan["batches"]:
        assert len(batch) <= 2
