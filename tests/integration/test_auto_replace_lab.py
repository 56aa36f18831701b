"""`fleetops remediate auto` climbing to `replace` on an Auto Scaling group of lab hosts, within a budget.

lab-01 and lab-02 form the lab's Auto Scaling group (fleetops_lab.asg on the lab's moto endpoint);
lab-03 is a spare lab host, powered off, that the lab binds to the group's next new instance. Both
members have an uncorrectable-ECC fault on the lab's stand-in GPU (no GPU here: fleetops_lab.hardware's
per-host nvidia-smi). The policy replaces such a host at once, at most one replacement an hour: one pass
replaces lab-01 (the group back at 2 with lab-03, scanned clean by the gate) and holds lab-02 back,
saying why. Everything else is real: the scan, the rollout, the EC2 and Auto Scaling calls, the power.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops_lab import Lab
from fleetops_lab import asg as lab_asg
from fleetops_lab import ec2 as lab_ec2
from fleetops_lab.ec2sim import client
from fleetops_lab.hardware import inject_ecc, install_gpu
from tests.helpers import fleetops

pytestmark = pytest.mark.lab

POLICY = """
schema: fleetops.policy/v1
budgets:
  replace: {window: 1h, max: 1}
rules:
  - name: gpu-fatal
    match:
      - check: gpu_health
        severity: [critical]
        data: {gpus.*.ecc_uncorrected_volatile: {gte: 1}}
    ladder:
      - {action: replace, clear_after: 2h, params: {timeout: 300}}
      - {action: human}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    try:
        assert lab_asg.up(2, 1, members=2) == (["lab-01", "lab-02"], ["lab-03"])
        yield lab
    finally:
        lab.down()


def test_one_pass_replaces_one_host_and_the_budget_holds_the_second_back(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    for host in ("lab-01", "lab-02"):
        install_gpu(lab, host)
        inject_ecc(lab, host, uncorrected=3)
    policy = tmp_path / "policy.yml"
    policy.write_text(POLICY)
    result = fleetops(
        "remediate", "auto", "-i", str(lab.ec2_inventory_path()), "--policy", str(policy), "--apply",
        "--sample-seconds", "2", "--canary", "0", "--format", "json", env=env,
    )  # fmt: skip
    assert result.rc == 0, result.stderr
    doc = json.loads(result.stdout)
    decisions = {d["host"]: d for d in doc["decisions"]}
    assert decisions["lab-01"]["action"] == "replace"
    assert decisions["lab-02"]["status"] == "budget"
    assert "budget: replace 1/h across the fleet used" in decisions["lab-02"]["reason"]
    assert "lab-02:" in result.stderr and "budget: replace 1/h across the fleet used" in result.stderr
    assert [(a["action"], a["hosts"], a["done"]) for a in doc["actions"]] == [
        ("replace", ["lab-01"], ["lab-01"])
    ]

    # the group is back at its desired capacity with the spare, which answers ssh and scans clean
    url = lab_ec2.running(lab.state_dir)
    assert url is not None
    group = client(url, lab_asg.REGION, "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[lab_asg.GROUP]
    )["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 2
    assert sorted(i["LifecycleState"] for i in group["Instances"]) == ["InService", "InService"]
    power = {h.name: (h.running, h.ssh_ok) for h in lab.status()}
    assert power["lab-01"] == (False, False) and power["lab-03"] == (True, True)
    scan = fleetops("scan", "-i", str(lab.ec2_inventory_path()), "--format", "json", "-q", env=env)
    hosts = scan.json()["hosts"]
    assert sorted(hosts) == ["lab-02", "lab-03"]
    assert not [f for f in hosts["lab-03"]["findings"] if f["severity"] in ("warning", "critical")]
    # and the second host is still waiting for the budget on the next pass (same hour)
    again = fleetops(
        "remediate", "auto", "-i", str(lab.ec2_inventory_path()), "--policy", str(policy), "--apply",
        "--sample-seconds", "2", "--canary", "0", "--format", "json", env=env,
    )  # fmt: skip
    assert again.rc == 0, again.stderr
    second = {d["host"]: d for d in json.loads(again.stdout)["decisions"]}
    assert second["lab-02"]["status"] == "budget" and json.loads(again.stdout)["actions"] == []
