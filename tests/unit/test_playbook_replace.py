"""playbooks/replace.yml with real ansible-playbook against a real moto Auto Scaling group (loopback only).

No lab host here: the inventory's host is this machine over the local connection, and the new instance
joins the run with the old host's connection variables, so reaching and scanning it runs locally too
(the scan limited to a check that is clean here). What is proven: the play replaces the instance
through the module, names the new instance, delegates the ssh wait and the scan to it (from the old
host, so every result is the old host's), and a dry run changes nothing. The lab test
(tests/integration/test_replace_lab.py) does the same over ssh to a freshly booted lab host.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook
from fleetops_lab import asg as lab_asg
from fleetops_lab.ec2sim import MotoServer, client, register_ami
from tests.paths import REPO

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, list[str]]]:
    server = MotoServer()
    url = server.start()
    try:
        ec2 = client(url, REGION)
        image = register_ami(url, REGION)
        vpc = ec2.create_vpc(CidrBlock="10.98.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.98.1.0/24", AvailabilityZone=REGION + "a")[
            "Subnet"
        ]["SubnetId"]
        ids = [
            i["InstanceId"]
            for i in ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, SubnetId=subnet)["Instances"]
        ]
        lab_asg.create_group(url, ids, max_size=4, name="workers", template="tpl-workers")
        yield url, ids
    finally:
        server.stop()


def _play(
    tmp_path: Path, url: str, instance: str, monkeypatch: pytest.MonkeyPatch, check: bool = False
) -> PlaybookRun:
    """The playbook as `fleetops remediate` runs it (ansible-runner, fleetops.ansible.runner)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu-old:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
        f"      ec2_instance_id: {instance}\n      ec2_region: {REGION}\n"
    )
    for name, value in (
        ("AWS_ENDPOINT_URL", url),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ):
        monkeypatch.setenv(name, value)
    xv = {
        "fleetops_lease": False,
        "fleetops_replace_timeout": 30,
        "fleetops_replace_connect_timeout": 30,
        "fleetops_checks": ["ec2_scheduled_event"],
        "fleetops_imds": "never",
    }
    return run_playbook(
        RunnerOptions(
            playbook=str(REPO / "playbooks" / "replace.yml"), inventory=[inventory], extravars=xv, check=check
        )
    )


def _task(run: PlaybookRun, name: str) -> TaskResult:
    found = [tr for tr in run.results_for("gpu-old") if tr.task == name]
    assert found, [(tr.task, tr.status) for tr in run.results_for("gpu-old")]
    return found[-1]


def _members(url: str) -> list[str]:
    group = client(url, REGION, "autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=["workers"])
    return sorted(i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"])


def test_a_dry_run_says_what_it_would_do_and_changes_nothing(
    moto: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ids = moto
    before = _members(url)
    run = _play(tmp_path, url, before[0], monkeypatch, check=True)
    assert run.status == "successful", [(tr.task, tr.status, tr.msg) for tr in run.results_for("gpu-old")]
    note = _task(run, "Say what a dry run would do").result["msg"]
    assert note.startswith(
        f"fleetops: dry run: gpu-old ({before[0]}): would terminate it in group workers"
    ), note
    assert _task(run, "Scan the new instance").status == "skipped"
    assert _members(url) == before


def test_the_group_replaces_the_instance_and_the_new_one_is_reached_and_scanned(
    moto: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ids = moto
    before = _members(url)
    run = _play(tmp_path, url, before[0], monkeypatch)
    assert run.status == "successful", [(tr.task, tr.status, tr.msg) for tr in run.results_for("gpu-old")]
    replaced = _task(run, "Have the Auto Scaling group replace the instance").result
    (new,) = replaced["new_instances"]
    assert replaced["changed"] is True and new["instance_id"] not in before
    after = _members(url)
    assert after == sorted([before[1], new["instance_id"]])
    # reached and scanned as the new instance (no Name tag: its instance id names it), from the old host
    scan = _task(run, "Scan the new instance").result
    assert scan["_ansible_delegated_vars"]["ansible_delegated_host"] == new["instance_id"], scan
    assert scan["_ansible_delegated_vars"]["ansible_connection"] == "local"  # the old host's, via add_host
    assert scan["checks"] == ["ec2_scheduled_event"] and scan["findings"] == []
    said = _task(run, "Say what replaced the host").result["msg"]
    assert said.startswith(
        f"fleetops: gpu-old ({before[0]}) replaced in group workers by {new['instance_id']}"
    )
    assert run.hosts() == ["gpu-old"]  # every result is the old host's: the batch stays exact
