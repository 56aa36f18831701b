"""Drift on a real lab fleet: one host the image gave an extra unit and a different environment.

Four lab hosts behind the lab's EC2 endpoint (two AZs, one AMI, one instance type), each running the
same worker service with the UCX fix in its unit (``UCX_MEM_MMAP_HOOK_MODE=none``). On ODD the image
also enabled ``ecs.service`` (Pinterest) and a drop-in sets the worker back to ``bistro`` (Mistral).
``fleetops drift`` must single out exactly ODD for exactly those two facts, and a scan with the
fleet's unit allow-list (a group_vars file, or ``--unit-allowlist``) must report ``unexpected_unit``
for ODD only.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab
from fleetops_lab.host_faults import (
    install_crashloop_unit,
    install_env_dropin,
    install_worker_service,
    remove_crashloop_unit,
    remove_env_dropin,
    remove_worker_service,
)
from tests.helpers import fleetops

pytestmark = pytest.mark.lab
HOSTS = ("lab-01", "lab-02", "lab-03", "lab-04")
ODD = "lab-02"
WORKER = "vllm-worker"
UNIT = f"{WORKER}.service"
ALLOWLIST = ["ssh.service", "systemd-*", "getty@*", "remote-fs.target", UNIT]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(len(HOSTS), ec2=True)
    try:
        for host in HOSTS:  # the fleet's key service, identical everywhere, with the UCX fix in its unit
            install_worker_service(
                lab, host, name=WORKER, ucx=False, environment={"UCX_MEM_MMAP_HOOK_MODE": "none"}, start=False
            )
        install_crashloop_unit(lab, ODD, name="ecs", start=False)  # the image enabled ecs.service
        install_env_dropin(lab, ODD, UNIT, {"UCX_MEM_MMAP_HOOK_MODE": "bistro"})
        yield lab
    finally:
        try:
            remove_env_dropin(lab, ODD, UNIT)
            remove_crashloop_unit(lab, ODD, name="ecs")
            for host in HOSTS:
                remove_worker_service(lab, host, name=WORKER)
        finally:
            lab.down()


def test_drift_singles_out_the_odd_host(lab: Lab, tmp_path: Path) -> None:
    started = time.monotonic()
    result = fleetops("drift", "-i", str(lab.ec2_inventory_path()), "--format", "json", "-q")
    elapsed = time.monotonic() - started
    assert result.rc == 1, result.stderr  # drift found
    drift: dict[str, Any] = result.json()
    assert drift["summary"]["compared"] == len(HOSTS) and drift["not_compared"] == {}
    by_fact = {item["fact"]: item for item in drift["fleet"]}
    env_fact = f"env:{UNIT}:UCX_MEM_MMAP_HOOK_MODE"
    assert set(by_fact) == {"unit:ecs.service", env_fact}, drift["fleet"]
    assert by_fact["unit:ecs.service"]["majority"] == "not enabled"
    assert by_fact["unit:ecs.service"]["odd"] == {ODD: "enabled"}
    assert by_fact[env_fact]["majority"] == "none" and by_fact[env_fact]["majority_hosts"] == 3
    assert by_fact[env_fact]["odd"] == {ODD: "bistro"}
    assert drift["summary"]["odd_hosts"] == [ODD]
    # the dimensions come from the EC2 inventory's hostvars and the scan's kernel
    assert drift["hosts"][ODD]["az"] == "us-east-1b" and drift["hosts"]["lab-01"]["az"] == "us-east-1a"
    assert {h["instance_type"] for h in drift["hosts"].values()} == {"g5.xlarge"}
    assert len({h["ami"] for h in drift["hosts"].values()}) == 1
    assert len({h["kernel"] for h in drift["hosts"].values()}) == 1
    # within its AZ (lab-02, lab-04: one against one) the fleet's majority names the odd one
    in_az = {i["fact"]: i for i in drift["groups"]["az"]["us-east-1b"]["drift"]}
    assert in_az["unit:ecs.service"]["odd"] == {ODD: "enabled"} and in_az["unit:ecs.service"]["tie"] is True
    assert drift["groups"]["az"]["us-east-1a"]["drift"] == []
    print(
        f"\ndrift of {len(HOSTS)} lab hosts (scan included): {elapsed:.1f} s; odd: {drift['summary']['odd_hosts']}"
    )

    # the same from a saved scan report, rendered as a table
    saved = tmp_path / "scan.json"
    checks = "zombie_memcg,ucx_mmap_hooks,unexpected_unit"  # what drift reads (fleetops.drift.DRIFT_CHECKS)
    scan = fleetops("scan", "-i", str(lab.ec2_inventory_path()), "-q", "--checks", checks, "-o", str(saved))
    assert scan.rc in (0, 1), scan.stdout + scan.stderr
    table = fleetops("drift", "--from", str(saved), "-i", str(lab.ec2_inventory_path()))
    assert table.rc == 1, table.stderr
    odd_lines = [ln for ln in table.stdout.splitlines() if ln.startswith(f"  {ODD}: ")]
    assert len(odd_lines) == 1 and "unit ecs.service enabled (others: not enabled)" in odd_lines[0], (
        table.stdout
    )
    assert not [
        ln for ln in table.stdout.splitlines() if ln.startswith(("  lab-01: ", "  lab-03: ", "  lab-04: "))
    ]
    hosts = json.loads(saved.read_text())["hosts"]
    facts = hosts[ODD]["facts"]
    assert facts["host"]["os"] == "Debian GNU/Linux 12 (bookworm)" and facts["host"]["boot_id"]
    cost = [h["facts"]["units"]["collect_ms"] for h in hosts.values()]
    print(f"unexpected_unit collect per host: {min(cost):.1f}-{max(cost):.1f} ms")


def _unexpected(report: dict[str, Any]) -> dict[str, list[str]]:
    return {
        host: [f["data"]["unit"] for f in entry["findings"] if f["check"] == "unexpected_unit"]
        for host, entry in report["hosts"].items()
    }


def test_allowlist_from_group_vars_catches_the_unit(lab: Lab, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    shutil.copy(lab.inventory_path(), inventory)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(yaml.safe_dump({"fleetops_unit_allowlist": ALLOWLIST}))
    result = fleetops("scan", "-i", str(inventory), "--checks", "unexpected_unit", "--format", "json", "-q")
    assert result.rc == 1, result.stderr
    report = result.json()
    assert _unexpected(report) == {host: (["ecs.service"] if host == ODD else []) for host in HOSTS}
    (finding,) = [f for f in report["hosts"][ODD]["findings"] if f["check"] == "unexpected_unit"]
    assert finding["severity"] == "warning"
    assert finding["summary"].startswith("ecs.service is enabled but not on the fleet's unit allow-list")
    assert "the image enabled it" in finding["summary"]
    assert finding["data"]["state"] == "enabled"


def test_allowlist_file_option_and_no_allowlist(lab: Lab, tmp_path: Path) -> None:
    allow = tmp_path / "allow.yml"
    allow.write_text(yaml.safe_dump(ALLOWLIST))
    inv = str(lab.inventory_path())
    result = fleetops("scan", "-i", inv, "--checks", "unexpected_unit", "--unit-allowlist", str(allow), "--format", "json", "-q")  # fmt: skip
    assert result.rc == 1, result.stderr
    assert _unexpected(result.json()) == {host: (["ecs.service"] if host == ODD else []) for host in HOSTS}
    # without an allow-list: facts only, no finding
    plain = fleetops("scan", "-i", inv, "--checks", "unexpected_unit", "--format", "json", "-q")
    assert plain.rc == 0, plain.stderr
    report = plain.json()
    assert all(not found for found in _unexpected(report).values())
    assert "ecs.service" in report["hosts"][ODD]["facts"]["units"]["enabled"]
    assert "ecs.service" not in report["hosts"]["lab-01"]["facts"]["units"]["enabled"]
