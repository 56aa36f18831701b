"""fleetops.node.ec2_asg_replace against a real moto_server on 127.0.0.1 (no boto3 mocks; loopback only).

The module runs as Ansible runs it (``ansible localhost -m``, tests.helpers.run_module) for a check-mode
run and a replacement; elsewhere its main() runs in this process (tests.helpers.call_module: the same
module code, arguments and result, without 1.3 CPU-seconds of controller and module start). moto 5.2
implements Auto Scaling on its EC2: TerminateInstanceInAutoScalingGroup launches the replacement at
once; SetInstanceHealth Unhealthy is only recorded (AWS would replace the instance on its next health
check), so the ``unhealthy`` test runs the lab's reconciler (fleetops_lab.asg), which does what AWS
does, beside the module, and another shows that without it nothing replaces the instance (timeout).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.modules import ec2_asg_replace

from fleetops_lab import asg as lab_asg
from fleetops_lab.ec2sim import MotoServer, client, register_ami
from tests.helpers import ansible_doc, call_module, run_module

REGION = "us-east-1"
MODULE = "fleetops.node.ec2_asg_replace"


@pytest.fixture(scope="module")
def moto() -> Iterator[dict[str, Any]]:
    server = MotoServer()
    url = server.start()
    try:
        ec2 = client(url, REGION)
        image = register_ami(url, REGION)
        vpc = ec2.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.99.1.0/24", AvailabilityZone=REGION + "a")[
            "Subnet"
        ]["SubnetId"]
        ids = [
            i["InstanceId"]
            for i in ec2.run_instances(
                ImageId=image, MinCount=5, MaxCount=5, InstanceType="g5.xlarge", SubnetId=subnet
            )["Instances"]
        ]
        yield {"url": url, "ids": ids}
    finally:
        server.stop()


def _group(url: str, name: str, members: list[str]) -> None:
    lab_asg.create_group(url, members, max_size=len(members) + 2, name=name, template=f"tpl-{name}")


def _describe(url: str, name: str) -> dict[str, Any]:
    answer = client(url, REGION, "autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    group: dict[str, Any] = answer["AutoScalingGroups"][0]
    return group


def _state(url: str, iid: str) -> str:
    answer = client(url, REGION).describe_instances(InstanceIds=[iid])
    state: str = answer["Reservations"][0]["Instances"][0]["State"]["Name"]
    return state


def _run(
    tmp_path: Path, url: str, *extra: str, via_ansible: bool = False, **args: Any
) -> tuple[int, dict[str, Any]]:
    """The module: its main() in this process (tests.helpers.call_module), or with via_ansible as Ansible
    runs it (``ansible localhost -m``)."""
    params: dict[str, Any] = {
        "region": REGION,
        "endpoint_url": url,
        "aws_access_key": "testing",
        "aws_secret_key": "testing",
        "poll_interval": 0.2,
        **args,
    }
    if via_ansible:
        return run_module(tmp_path, MODULE, json.dumps(params), *extra)
    assert set(extra) <= {"--check"}, extra
    return call_module(tmp_path, ec2_asg_replace.main, params, check="--check" in extra)


def test_terminate_in_group_keeps_desired_capacity_and_returns_the_new_instance(
    moto: dict[str, Any], tmp_path: Path
) -> None:
    url, ids = moto["url"], moto["ids"]
    _group(url, "g-term", ids[:2])
    rc, would = _run(tmp_path, url, "--check", instance_id=ids[0], via_ansible=True)
    assert rc == 0 and would["changed"] is True, would
    assert would["msg"].startswith("would terminate it in group g-term (desired capacity 2 kept)"), would
    assert sorted(i["InstanceId"] for i in _describe(url, "g-term")["Instances"]) == sorted(ids[:2])
    assert _state(url, ids[0]) == "running"  # check mode changed nothing

    rc, done = _run(tmp_path, url, instance_id=ids[0], timeout=30, via_ansible=True)
    assert rc == 0 and done["changed"] is True, done
    assert done["group"] == "g-term" and done["method"] == "terminate"
    assert done["before"] == {"desired_capacity": 2, "instances": sorted(ids[:2]), "in_service_healthy": 2}
    (new,) = done["new_instances"]
    assert new["instance_id"] not in ids and new["state"] == "running" and new["private_ip_address"]
    assert new["private_ip_address"].startswith("10.99.1.")
    group = _describe(url, "g-term")
    assert group["DesiredCapacity"] == 2
    assert sorted(i["InstanceId"] for i in group["Instances"]) == sorted([ids[1], new["instance_id"]])
    assert done["after"]["instances"] == sorted([ids[1], new["instance_id"]])
    assert _state(url, ids[0]) == "terminated"


def test_an_instance_in_no_group_is_refused_and_nothing_changes(moto: dict[str, Any], tmp_path: Path) -> None:
    url, ids = moto["url"], moto["ids"]
    rc, out = _run(tmp_path, url, instance_id=ids[4])
    assert rc != 0 and out["changed"] is False
    assert out["msg"].startswith(f"Failed to replace instance {ids[4]}: it is in no Auto Scaling group"), out
    assert _state(url, ids[4]) == "running"


def test_a_degraded_group_is_refused(moto: dict[str, Any], tmp_path: Path) -> None:
    """One member already Unhealthy (desired 2): replacing the other would leave none serving."""
    url, ids = moto["url"], moto["ids"]
    _group(url, "g-degraded", ids[2:4])
    client(url, REGION, "autoscaling").set_instance_health(InstanceId=ids[3], HealthStatus="Unhealthy")
    for method in ("terminate", "unhealthy"):
        rc, out = _run(tmp_path, url, instance_id=ids[2], method=method)
        assert rc != 0 and out["changed"] is False, out
        assert (
            "group g-degraded is already degraded: 0 of its other instances are InService and Healthy"
            in out["msg"]
        )
    rc, out = _run(tmp_path, url, "--check", instance_id=ids[2])  # check mode refuses the same
    assert rc != 0 and "already degraded" in out["msg"]
    assert _state(url, ids[2]) == "running"
    assert {i["InstanceId"]: i["HealthStatus"] for i in _describe(url, "g-degraded")["Instances"]} == {
        ids[2]: "Healthy",
        ids[3]: "Unhealthy",
    }


def test_unhealthy_without_a_replacement_times_out(moto: dict[str, Any], tmp_path: Path) -> None:
    """moto only records Unhealthy (nothing replaces it here): the wait ends at its timeout, changed."""
    url = moto["url"]
    ec2 = client(url, REGION)
    image = ec2.describe_instances(InstanceIds=[moto["ids"][0]])["Reservations"][0]["Instances"][0]["ImageId"]
    subnet = ec2.describe_instances(InstanceIds=[moto["ids"][0]])["Reservations"][0]["Instances"][0][
        "SubnetId"
    ]
    ids = [
        i["InstanceId"]
        for i in ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"]
    ]
    _group(url, "g-slow", ids)
    rc, out = _run(tmp_path, url, instance_id=ids[0], method="unhealthy", timeout=2)
    assert rc != 0 and out["changed"] is True, out
    assert (
        "group g-slow is not back at its desired capacity 1 within 2 s after the instance was marked Unhealthy"
        in (out["msg"])
    )
    assert f"{ids[0]} still in the group (InService, Unhealthy)" in out["msg"]


def test_unhealthy_is_replaced_by_the_group(moto: dict[str, Any], tmp_path: Path) -> None:
    """SetInstanceHealth Unhealthy; the lab's reconciler replaces it as AWS would, and tags the new one
    (no lab host to power here: the calls are recorded); the module waits for that tag."""
    url = moto["url"]
    ec2 = client(url, REGION)
    first = ec2.describe_instances(InstanceIds=[moto["ids"][0]])["Reservations"][0]["Instances"][0]
    ids = [
        i["InstanceId"]
        for i in ec2.run_instances(
            ImageId=first["ImageId"], MinCount=2, MaxCount=2, SubnetId=first["SubnetId"]
        )["Instances"]
    ]
    for iid, name in zip(ids, ("lab-01", "lab-02"), strict=True):  # lab hosts, bound already
        ec2.create_tags(
            Resources=[iid], Tags=[{"Key": "Name", "Value": name}, {"Key": "fleetops", "Value": "lab"}]
        )
    _group(url, "g-sick", ids)
    state_dir = tmp_path / "lab"
    state_dir.mkdir()
    (state_dir / lab_asg.CONFIG_FILE).write_text(
        json.dumps({"group": "g-sick", "members": ids, "spares": {"lab-09": "10.213.0.10"}})
    )
    powered: list[tuple[str, bool]] = []
    lines: list[str] = []
    reconciler = lab_asg.Reconciler(state_dir, url, lambda h, on: powered.append((h, on)), lines.append)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            reconciler.step()
            stop.wait(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        rc, out = _run(
            tmp_path,
            url,
            instance_id=ids[0],
            method="unhealthy",
            timeout=30,
            wait_for_tags=[lab_asg.ADDRESS_TAG],
        )
    finally:
        stop.set()
        thread.join(10)
    assert rc == 0 and out["changed"] is True, "\n".join([out.get("msg", ""), *lines])
    (new,) = out["new_instances"]
    assert new["name"] == "lab-09" and new["tags"][lab_asg.ADDRESS_TAG] == "10.213.0.10"
    assert new["tags"]["fleetops"] == "lab"
    assert sorted(powered) == [("lab-01", False), ("lab-09", True)], (powered, lines)
    assert any("is Unhealthy: the group replaces it" in line for line in lines), lines
    assert _state(url, ids[0]) == "terminated"
    assert _describe(url, "g-sick")["DesiredCapacity"] == 2


def test_a_new_instance_without_a_spare_stays_unbound(moto: dict[str, Any], tmp_path: Path) -> None:
    url = moto["url"]
    ec2 = client(url, REGION)
    first = ec2.describe_instances(InstanceIds=[moto["ids"][0]])["Reservations"][0]["Instances"][0]
    (iid,) = [
        i["InstanceId"]
        for i in ec2.run_instances(
            ImageId=first["ImageId"], MinCount=1, MaxCount=1, SubnetId=first["SubnetId"]
        )["Instances"]
    ]
    _group(url, "g-nospare", [iid])
    state_dir = tmp_path / "lab"
    state_dir.mkdir()
    (state_dir / lab_asg.CONFIG_FILE).write_text(
        json.dumps({"group": "g-nospare", "members": [iid], "spares": {}})
    )
    powered: list[tuple[str, bool]] = []
    lines: list[str] = []
    reconciler = lab_asg.Reconciler(state_dir, url, lambda h, on: powered.append((h, on)), lines.append)
    client(url, REGION, "autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=iid, ShouldDecrementDesiredCapacity=False
    )
    reconciler.step()
    reconciler.step()
    (new,) = [i["InstanceId"] for i in _describe(url, "g-nospare")["Instances"]]
    assert [line for line in lines if "no spare" in line] == [
        f"lab asg: no spare lab host left: {new} stays unbound (no lab host, not in the inventory)"
    ]
    assert [h for h, on in powered if on] == []  # no host powered on (other tests' terminated hosts go off)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"instance_id": "gpu-1"}, "'gpu-1' is not an EC2 instance id"),
        ({"instance_id": "i-0123456789abcdef0", "timeout": 0}, "timeout must be 1 to 86400 s, got 0"),
        ({"instance_id": "i-0123456789abcdef0", "method": "reboot"}, "value of method must be one of"),
    ],
)
def test_options_that_cannot_work_are_refused(tmp_path: Path, args: dict[str, Any], why: str) -> None:
    rc, out = _run(tmp_path, "http://127.0.0.1:9", **args)
    assert rc != 0 and why in out["msg"], out


def test_docs_name_every_option_with_the_argument_specs_type_default_and_choices() -> None:
    import yaml

    # as ansible-doc renders them: the connection options come from the doc fragment fleetops.node.aws
    options = ansible_doc("fleetops.node.ec2_asg_replace")["options"]
    spec = ec2_asg_replace.argument_spec()
    assert set(options) == set(spec)
    for name, entry in spec.items():
        doc = options[name]
        assert doc["type"] == entry["type"], name
        assert doc.get("default") == entry.get("default"), name
        assert doc.get("choices") == entry.get("choices"), name
        assert sorted(doc.get("aliases") or []) == sorted(entry.get("aliases") or []), name
        assert bool(doc.get("required")) == bool(entry.get("required")), name
    for name in ("EXAMPLES", "RETURN"):
        assert yaml.safe_load(getattr(ec2_asg_replace, name)), name
