"""`fleetops remediate stop-start` against lab hosts that are instances of the lab's EC2 (moto + proxy).

Stopping an instance through the EC2 API really powers its lab host off (its journal shows the boot
end), starting it boots the host again (a new boot id, one more boot in the journal), and the stop
gives the host "other hardware": the uncorrectable-ECC fault injected into its (stand-in) GPU is gone,
as is a scheduled instance-retirement event (EC2 completes it). A dry run changes nothing; a host that
is not an EC2 instance is refused. The GPU is a stand-in (fleetops_lab.hardware): no GPU here.

Three nspawn hosts, in this worker's lab (FLEETOPS_LAB: tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab, hardware
from fleetops_lab.ec2sim import EVENT_TAG, STOP_SECONDS_TAG, client
from tests.helpers import FLEETOPS, LAB_ANSWERED, boots, fleetops, kill_tree
from tests.paths import REPO

pytestmark = pytest.mark.lab

HOSTS = ["lab-01", "lab-02", "lab-03"]
REGION = "us-east-1"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(len(HOSTS), ec2=True)
    try:
        yield lab
    finally:
        lab.down()


def _ec2(lab: Lab) -> Any:
    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    return client(config["endpoint_url"], config["regions"][0])


def _instance(lab: Lab, name: str) -> dict[str, Any]:
    answer = _ec2(lab).describe_instances(Filters=[{"Name": "tag:Name", "Values": [name]}])
    (instance,) = [i for r in answer["Reservations"] for i in r["Instances"]]
    return dict(instance)


def _inventory_with_secret(lab: Lab, tmp_path: Path) -> tuple[Path, str]:
    """The lab's EC2 inventory with a secret key of its own (moto takes any): it must appear nowhere."""
    secret = f"lab-secret-{uuid.uuid4().hex}"
    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    config["aws_secret_key"] = secret
    path = tmp_path / "secret.fleet_ec2.yml"
    path.write_text(yaml.safe_dump(config))
    return path, secret


def _scan(inventory: Path, host: str) -> list[dict[str, Any]]:
    result = fleetops("scan", "-i", str(inventory), "-l", host, "--format", "json", "-q")
    entry = result.json()["hosts"][host]
    assert entry["status"] == LAB_ANSWERED, entry
    findings: list[dict[str, Any]] = entry["findings"]
    return findings


def _stop_start(inventory: Path, host: str, env: dict[str, str], *extra: str) -> Any:
    return fleetops(
        "remediate", "stop-start", "-i", str(inventory), "-l", host, "--cooldown", "0", "--lease-settle", "0.5",
        "--stop-timeout", "60", "--start-timeout", "120", "--format", "json", *extra, env=env, timeout=400,
    )  # fmt: skip


def _bad(findings: list[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["check"] == check and f["severity"] in ("warning", "critical")]


def _leaked(secret: str, *places: Path) -> list[Path]:
    files = [p for place in places for p in ([place] if place.is_file() else place.rglob("*")) if p.is_file()]
    return [p for p in files if secret.encode() in p.read_bytes()]


def test_an_ecc_fault_is_gone_after_a_stop_start_through_ec2(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    inventory, secret = _inventory_with_secret(lab, tmp_path)
    hardware.inject_ecc(lab, "lab-01", uncorrected=2)
    critical = [f for f in _bad(_scan(inventory, "lab-01"), "gpu_health") if f["severity"] == "critical"]
    assert critical and "2 uncorrectable ECC errors" in critical[0]["summary"], critical
    lab.run("lab-01", "journalctl --flush", check=True)  # the boot's journal is on disk before the power off
    before = boots(lab, HOSTS)

    result = _stop_start(inventory, "lab-01", env, "--apply", "--finding", "gpu_health")
    assert result.rc == 0, result.stdout + result.stderr
    report = result.json()
    assert report["status"] == "done" and report["hosts"] == {"lab-01": "done"}

    after = boots(lab, HOSTS)
    assert after["lab-01"][0] != before["lab-01"][0]  # a new boot ...
    assert after["lab-01"][1] == before["lab-01"][1] + 1  # ... exactly one, in its persistent journal
    for host in ("lab-02", "lab-03"):
        assert after[host] == before[host], host  # the other hosts untouched
    assert _instance(lab, "lab-01")["State"]["Name"] == "running"
    assert _bad(_scan(inventory, "lab-01"), "gpu_health") == []  # other hardware: the fault is gone
    (gpu,) = hardware.read_gpus(lab, "lab-01")
    assert gpu["ecc.errors.uncorrected.volatile.total"] == 0

    entries = [json.loads(line) for line in Path(env["FLEETOPS_AUDIT_LOG"]).read_text().splitlines()]
    (entry,) = [e for e in entries if e.get("host") == "lab-01"]
    assert entry["action"] == "stop-start" and entry["result"]["status"] == "ok"
    assert not entry["result"].get("gate"), entry  # the gate passed
    assert (
        entry["before"]["boot_id"] == before["lab-01"][0] and entry["after"]["boot_id"] == after["lab-01"][0]
    )
    # the inventory's secret key reached the module (it talked to EC2) but nothing fleetops wrote
    assert _leaked(secret, Path(env["FLEETOPS_AUDIT_LOG"]), Path(env["FLEETOPS_STATE_DIR"])) == []
    assert secret not in result.stdout + result.stderr


def test_a_reboot_keeps_the_hardware_fault(lab: Lab) -> None:
    hardware.inject_ecc(lab, "lab-03", uncorrected=1)
    try:
        before = boots(lab, ["lab-03"])["lab-03"]
        lab.run("lab-03", "systemctl reboot", check=False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            proc = lab.run("lab-03", "cat /proc/sys/kernel/random/boot_id", check=False, timeout=15)
            if proc.returncode == 0 and proc.stdout.strip() != before[0]:
                break
            time.sleep(1)
        assert boots(lab, ["lab-03"])["lab-03"][0] != before[0]
        (gpu,) = hardware.read_gpus(lab, "lab-03")
        assert gpu["ecc.errors.uncorrected.volatile.total"] == 1  # the same faulty GPU
    finally:
        hardware.clear_hardware(lab, "lab-03")


def test_a_retirement_event_is_completed_by_a_stop_start(lab: Lab, env: dict[str, str]) -> None:
    inventory = lab.ec2_inventory_path()
    iid = _instance(lab, "lab-03")["InstanceId"]
    _ec2(lab).create_tags(Resources=[iid], Tags=[{"Key": EVENT_TAG, "Value": "instance-retirement"}])
    events = [f["data"]["code"] for f in _scan(inventory, "lab-03") if f["check"] == "ec2_scheduled_event"]
    assert events == ["instance-retirement"]
    before = boots(lab, HOSTS)

    result = _stop_start(inventory, "lab-03", env, "--apply")
    assert result.rc == 0, result.stdout + result.stderr
    assert result.json()["hosts"] == {"lab-03": "done"}
    after = boots(lab, HOSTS)
    assert after["lab-03"][0] != before["lab-03"][0] and after["lab-03"][1] == before["lab-03"][1] + 1
    assert after["lab-01"] == before["lab-01"] and after["lab-02"] == before["lab-02"]
    assert [f for f in _scan(inventory, "lab-03") if f["check"] == "ec2_scheduled_event"] == []


def test_a_dry_run_changes_nothing(lab: Lab, env: dict[str, str]) -> None:
    before = boots(lab, HOSTS)
    result = _stop_start(lab.ec2_inventory_path(), "lab-02", env)
    assert result.rc == 0, result.stdout + result.stderr
    assert "dry run" in result.stderr and "would stop, wait stopped, start, wait running" in result.stderr
    assert boots(lab, HOSTS) == before
    assert _instance(lab, "lab-02")["State"]["Name"] == "running"


def test_a_host_without_an_instance_id_is_refused(lab: Lab, env: dict[str, str]) -> None:
    before = boots(lab, HOSTS)
    result = _stop_start(lab.inventory_path(), "lab-02", env, "--apply")  # the plain (non-EC2) inventory
    assert result.rc == 3, result.stdout + result.stderr
    assert (
        "lab-02 has no ec2_instance_id hostvar: stop-start needs an EC2 instance"
        in result.stdout + result.stderr
    )
    assert result.json()["hosts"] == {"lab-02": "failed"}
    assert boots(lab, HOSTS) == before


def test_a_controller_killed_between_the_stop_and_the_start_is_finished_by_resume(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL (a dying controller) once the instance is stopped: it stays stopped, powered off; the
    resume's probe starts it (never stops it again), sees the new boot id, and judges it by the gate:
    done, exactly one power cycle."""
    host, state = "lab-01", tmp_path / "killed.json"
    iid = _instance(lab, host)["InstanceId"]
    # EC2 takes a while to stop an instance (moto: no time): 20 s "stopping", the window the controller dies in
    _ec2(lab).create_tags(Resources=[iid], Tags=[{"Key": STOP_SECONDS_TAG, "Value": "20"}])
    lab.run(host, "journalctl --flush", check=True)
    before = boots(lab, HOSTS)
    inventory = lab.ec2_inventory_path()
    argv = [str(FLEETOPS), "remediate", "stop-start", "-i", str(inventory), "-l", host, "--apply",
            "--cooldown", "0", "--lease-settle", "0.5", "--stop-timeout", "60", "--start-timeout", "120",
            "--state", str(state)]  # fmt: skip
    first = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        seen = ""
        while time.monotonic() < deadline and first.poll() is None:
            seen = _instance(lab, host)["State"]["Name"]
            if seen == "stopping":
                break
            time.sleep(0.2)
        # The controller dies mid-stop: the CLI and ansible-playbook with it (ansible-runner runs it in a
        # session of its own: a process-group kill would spare it, and it would finish the stop-start).
        kill_tree(first.pid)
    finally:
        first.wait(timeout=30)
    assert seen == "stopping", (seen, first.stderr.read() if first.stderr else "")
    (status,) = [h for h in lab.status(probe_ssh=False) if h.name == host]
    assert not status.running  # really powered off
    deadline = time.monotonic() + 60
    while _instance(lab, host)["State"]["Name"] == "stopping" and time.monotonic() < deadline:
        time.sleep(1)
    assert _instance(lab, host)["State"]["Name"] == "stopped"  # and nobody starts it: the controller is dead
    assert json.loads(state.read_text())["hosts"] == {host: "running"}

    resumed = fleetops("remediate", "--resume", str(state), "--format", "json", env=env, timeout=600)
    assert resumed.rc == 0, resumed.stdout + resumed.stderr
    assert resumed.json()["status"] == "done" and resumed.json()["hosts"] == {host: "done"}
    assert "already rebooted (boot id changed): not rebooting again" in resumed.stderr, resumed.stderr
    assert _instance(lab, host)["State"]["Name"] == "running"
    after = boots(lab, HOSTS)
    assert after[host][0] != before[host][0] and after[host][1] == before[host][1] + 1  # one power cycle
    for other in HOSTS:
        if other != host:
            assert after[other] == before[other], other


def test_terminating_an_instance_powers_its_host_off(lab: Lab) -> None:
    """Last: lab-02 stays off (the module's lab goes down after it)."""
    iid = _instance(lab, "lab-02")["InstanceId"]
    _ec2(lab).terminate_instances(InstanceIds=[iid])  # answered once the host is off
    (host,) = [h for h in lab.status(probe_ssh=False) if h.name == "lab-02"]
    assert not host.running
    others = {h.name: h.running for h in lab.status(probe_ssh=False) if h.name != "lab-02"}
    assert others == {"lab-01": True, "lab-03": True}
