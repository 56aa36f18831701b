"""`fleetops remediate replace` on an Auto Scaling group of lab hosts (fleetops_lab.asg, moto's Auto Scaling).

Three lab hosts are EC2 instances of the lab's moto endpoint: lab-01 and lab-02 form the group
fleetops-lab (desired capacity 2), lab-03 is in no group; lab-04 and lab-05 are spare lab hosts, powered
off and no instances. Replacing lab-01 terminates its instance in the group; moto launches a replacement, which the
lab's reconciler binds to lab-04 (powered on fresh) while lab-01 powers off. The rollout's gate is the
playbook's own scan of the new instance over ssh. Through the lab's EC2 inventory, the real CLI, real
ansible-playbook, real ssh.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab
from fleetops_lab import asg as lab_asg
from fleetops_lab import ec2 as lab_ec2
from fleetops_lab.ec2sim import client
from tests.helpers import LAB_ANSWERED, fleetops

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    try:
        assert lab_asg.up(3, 2, members=2) == (["lab-01", "lab-02"], ["lab-04", "lab-05"])
        yield lab
    finally:
        lab.down()


def _ec2(lab: Lab) -> tuple[Any, Any]:
    url = lab_ec2.running(lab.state_dir)
    assert url is not None
    return client(url, lab_asg.REGION), client(url, lab_asg.REGION, "autoscaling")


def _group(lab: Lab) -> dict[str, Any]:
    group: dict[str, Any] = _ec2(lab)[1].describe_auto_scaling_groups(AutoScalingGroupNames=[lab_asg.GROUP])[
        "AutoScalingGroups"
    ][0]
    return group


def _instances(lab: Lab) -> dict[str, dict[str, Any]]:
    """Every instance by id: its state and tags."""
    out: dict[str, dict[str, Any]] = {}
    for reservation in _ec2(lab)[0].describe_instances()["Reservations"]:
        for inst in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
            out[inst["InstanceId"]] = {"state": inst["State"]["Name"], "tags": tags}
    return out


def _by_name(lab: Lab) -> dict[str, str]:
    return {
        v["tags"]["Name"]: k
        for k, v in _instances(lab).items()
        if v["state"] == "running" and "Name" in v["tags"]
    }


def _power(lab: Lab) -> dict[str, tuple[bool, bool]]:
    return {h.name: (h.running, h.ssh_ok) for h in lab.status()}


def test_replace_dry_run_refusal_and_apply(lab: Lab, env: dict[str, str], tmp_path: Path) -> None:
    inventory = str(lab.ec2_inventory_path())
    names = _by_name(lab)
    assert sorted(names) == ["lab-01", "lab-02", "lab-03"]
    members = sorted(i["InstanceId"] for i in _group(lab)["Instances"])
    assert members == sorted([names["lab-01"], names["lab-02"]])
    assert _power(lab)["lab-04"] == (False, False)

    # A dry run reads the group and says what it would do; nothing changes.
    dry = fleetops("remediate", "replace", "-l", "lab-01", "-i", inventory, env=env, timeout=300)
    assert dry.rc == 0, dry.stdout + dry.stderr
    assert f"would terminate it in group {lab_asg.GROUP} (desired capacity 2 kept)" in dry.stdout + dry.stderr
    assert sorted(i["InstanceId"] for i in _group(lab)["Instances"]) == members
    assert _by_name(lab) == names and _power(lab)["lab-04"] == (False, False)

    # An instance in no group is refused, with the module's message; nothing changes.
    refused = fleetops(
        "remediate",
        "replace",
        "--apply",
        "-l",
        "lab-03",
        "-i",
        inventory,
        "--state",
        str(tmp_path / "refused.json"),
        env=env,
        timeout=300,
    )
    assert refused.rc == 3, refused.stdout + refused.stderr
    result = json.loads((tmp_path / "refused.json").read_text())["results"]["lab-03"]
    assert result["status"] == "failed"
    assert result["msg"].startswith(
        f"Failed to replace instance {names['lab-03']}: it is in no Auto Scaling group"
    )
    assert _by_name(lab) == names
    assert sorted(i["InstanceId"] for i in _group(lab)["Instances"]) == members

    # Replace lab-01: the group is back at 2 with the spare lab-04 as its new instance, scanned clean.
    done = fleetops(
        "remediate",
        "replace",
        "--apply",
        "-l",
        "lab-01",
        "-i",
        inventory,
        "--timeout",
        "120",
        "--host-timeout",
        "600",
        "--state",
        str(tmp_path / "done.json"),
        env=env,
        timeout=600,
    )
    assert done.rc == 0, done.stdout + done.stderr
    assert (
        "lab-01 (" + names["lab-01"] + ") replaced in group fleetops-lab by lab-04"
        in done.stdout + done.stderr
    )
    outcome = json.loads((tmp_path / "done.json").read_text())["results"]["lab-01"]
    assert outcome["status"] == "ok" and not outcome.get("gate"), json.dumps(outcome, indent=1)
    replaced, scan = outcome["result"]["tasks"]
    assert replaced["instance_id"] == names["lab-01"] and replaced["group"] == lab_asg.GROUP
    (new,) = replaced["new_instances"]
    assert new["name"] == "lab-04" and new["tags"][lab_asg.ADDRESS_TAG] == lab.host_ip("lab-04")
    assert scan["findings"] == [] or all(f["severity"] == "info" for f in scan["findings"]), scan["findings"]
    group = _group(lab)
    assert group["DesiredCapacity"] == 2
    assert sorted(
        (i["InstanceId"], i["LifecycleState"], i["HealthStatus"]) for i in group["Instances"]
    ) == sorted([(names["lab-02"], "InService", "Healthy"), (new["instance_id"], "InService", "Healthy")])
    assert _instances(lab)[names["lab-01"]]["state"] == "terminated"
    power = _power(lab)
    assert power["lab-01"] == (False, False) and power["lab-04"] == (True, True)

    # The fleet's next scan through the same inventory: lab-04 is a host (at its tagged address), lab-01 gone.
    scan_after = fleetops("scan", "-i", inventory, "--format", "json", "-q", env=env, timeout=300)
    hosts = scan_after.json()["hosts"]
    assert sorted(hosts) == ["lab-02", "lab-03", "lab-04"] and hosts["lab-04"]["status"] == LAB_ANSWERED, (
        hosts
    )


def _replace(
    lab: Lab, env: dict[str, str], host: str, state: Path, *args: str
) -> tuple[int, dict[str, Any], str]:
    inventory = str(lab.ec2_inventory_path())
    result = fleetops(
        "remediate", "replace", "--apply", "-l", host, "-i", inventory, "--state", str(state), *args,
        env=env, timeout=600,
    )  # fmt: skip
    return result.rc, json.loads(state.read_text())["results"][host], result.stdout + result.stderr


def test_unhealthy_is_replaced_and_without_a_spare_the_host_fails(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """After the first test: the group is lab-02 and lab-04; lab-05 is the last spare."""
    names = _by_name(lab)
    assert sorted(names) == ["lab-02", "lab-03", "lab-04"] and _power(lab)["lab-05"] == (False, False)
    rc, outcome, out = _replace(
        lab, env, "lab-02", tmp_path / "sick.json", "--method", "unhealthy", "--timeout", "120"
    )
    assert rc == 0 and outcome["status"] == "ok" and not outcome.get("gate"), out
    (new,) = outcome["result"]["tasks"][0]["new_instances"]
    assert new["name"] == "lab-05" and outcome["result"]["tasks"][0]["method"] == "unhealthy"
    assert _instances(lab)[names["lab-02"]]["state"] == "terminated"
    assert sorted(i["InstanceId"] for i in _group(lab)["Instances"]) == sorted(
        [names["lab-04"], new["instance_id"]]
    )
    power = _power(lab)
    assert power["lab-02"] == (False, False) and power["lab-05"] == (True, True)

    # No spare left: the group launches an instance no lab host backs; the host fails at the timeout.
    rc, outcome, out = _replace(lab, env, "lab-04", tmp_path / "none.json", "--timeout", "10")
    assert rc == 3 and outcome["status"] == "failed", out
    assert "is not back at its desired capacity 2 within 10 s" in outcome["msg"], outcome["msg"]
    assert f"lacks the tag(s) {lab_asg.ADDRESS_TAG}" in outcome["msg"]
    (unbound,) = [
        i["InstanceId"] for i in _group(lab)["Instances"] if i["InstanceId"] not in _by_name(lab).values()
    ]
    log = (lab.state_dir / "ec2.log").read_text()
    assert f"lab asg: no spare lab host left: {unbound} stays unbound" in log
    assert _power(lab)["lab-04"] == (False, False)
