"""Every door is the main door, on a lab fleet: passes limited to one host (``remediate auto -l HOST``, the
alert path) keep the storm brake and the capacity floors of the whole fleet, from what the passes before
them recorded (fleetops.auto.seen, in the state directory: no store here).

One lab of six hosts for both tests. There is no GPU here: each host's ``nvidia-smi`` is the lab's
stand-in (fleetops_lab.hardware); kubectl is the stand-in tests/kubectl_standin/kubectl. The scans, the
policy, the reboots and the power cycles are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab
from fleetops_lab.hardware import clear_hardware, inject_ecc
from tests.helpers import LAB_ANSWERED, boots, fleetops
from tests.paths import KUBECTL_STANDIN

pytestmark = pytest.mark.lab
HOSTS = [f"lab-0{i}" for i in range(1, 7)]

STORM_POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {window: 1h, max: 10}
storm: {fleet_pct: 1, group_pct: 1, min_hosts: 2}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""
FLOOR_POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {window: 1h, max: 10}
floor: {min_available_pct: 50, min_available: 1}
unreachable: {max_pct: 50}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(len(HOSTS))
    try:
        yield lab
    finally:
        lab.down()


def _inventory(lab: Lab, path: Path, groups: dict[str, str]) -> Path:
    """The lab's inventory with each host's group (``fleetops_az``) as given."""
    doc = yaml.safe_load(lab.inventory_path().read_text())
    for child in doc["all"]["children"].values():
        for host, hostvars in (child.get("hosts") or {}).items():
            if hostvars and host in groups:
                hostvars["fleetops_az"] = groups[host]
    path.write_text(yaml.safe_dump(doc))
    return path


def _pass(
    inventory: Path, env: dict[str, str], policy: Path, state: Path, *limit: str
) -> tuple[int, dict[str, Any], str]:
    result = fleetops(
        "remediate", "auto", "-i", str(inventory), "--policy", str(policy), "--apply", "--state-dir", str(state),
        "--sample-seconds", "1", "--kubectl", str(KUBECTL_STANDIN), "--canary", "0", "--format", "json",
        *(["-l", ",".join(limit)] if limit else []), env=env,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.rc, json.loads(result.stdout), result.stderr


def _kube(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    kube = tmp_path / "kube.json"
    kube.write_text(json.dumps({"nodes": {h: {} for h in HOSTS}, "pods": [], "pdbs": []}))
    return {**env, "FLEETOPS_KUBECTL_STATE": str(kube)}


def test_single_host_passes_one_after_another_reboot_no_more_than_the_storm_limit(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """Five hosts with uncorrectable ECC errors, a storm limit of two hosts; five passes each limited to one
    of them, one after another as the rulebook sends them: two reboots, and the third pass names the brake."""
    env = _kube(tmp_path, env)
    policy = tmp_path / "storm.yml"
    policy.write_text(STORM_POLICY)
    inventory = _inventory(lab, tmp_path / "inventory.yml", dict.fromkeys(HOSTS, "rack-a"))
    faulty = HOSTS[:5]
    for host in faulty:
        inject_ecc(lab, host, uncorrected=2)
    try:
        before = boots(lab, HOSTS)
        told = []
        for host in faulty:
            _rc, doc, err = _pass(inventory, env, policy, tmp_path / "auto-state", host)
            told.append("storm brake tripped on rule gpu-fatal" in err)
            assert [d["host"] for d in doc["decisions"]] == [host]
        after = boots(lab, HOSTS)
        rebooted = [h for h in HOSTS if after[h][0] != before[h][0]]
        assert rebooted == faulty[:2], rebooted
        assert told == [False, False, True, False, False], told  # the third names it, once
    finally:
        for host in faulty:
            clear_hardware(lab, host)


@pytest.mark.parametrize("recorder", ["pass", "scan"])
def test_a_pass_limited_to_a_host_keeps_the_floor_of_a_group_with_hosts_powered_off(
    lab: Lab, env: dict[str, str], tmp_path: Path, recorder: str
) -> None:
    """A group of four with two hosts powered off (still in the inventory): after a full pass, or a
    scheduled `fleetops scan` of the fleet (no pass), a pass limited to a faulty host of that group does not
    reboot it, and names the floor."""
    env = _kube(tmp_path, env)
    policy = tmp_path / "floor.yml"
    policy.write_text(FLOOR_POLICY)
    groups = {h: ("rack-b" if h in HOSTS[2:] else "rack-a") for h in HOSTS}
    inventory = _inventory(lab, tmp_path / "inventory.yml", groups)
    off = HOSTS[4:]
    for host in off:
        lab.power(host, on=False)
    try:
        state = tmp_path / "auto-state"
        if recorder == "pass":
            _rc, full, _err = _pass(inventory, env, policy, state)
            assert sorted(full["unreachable"]["hosts"]) == off
        else:
            scan = fleetops(
                "scan", "-i", str(inventory), "--policy", str(policy), "--state-dir", str(state),
                "--format", "json", env=env,
            )  # fmt: skip
            assert scan.rc == 3, scan.stderr  # the hosts powered off
            assert f"fleet record: written to {state / 'seen.json'}" in scan.stderr, scan.stderr
            assert (
                sorted(h for h, e in json.loads(scan.stdout)["hosts"].items() if e["status"] != LAB_ANSWERED)
                == off
            )
        inject_ecc(lab, HOSTS[2], uncorrected=2)  # the alert comes after the schedule's pass
        before = boots(lab, [HOSTS[2]])
        _rc, doc, err = _pass(inventory, env, policy, state, HOSTS[2])
        (d,) = doc["decisions"]
        assert d["status"] == "floor", d
        assert doc["actions"] == []
        assert "group rack-b: 4 hosts, 2 unavailable (lab-05 unreachable in the fleet record" in err, err
        assert boots(lab, [HOSTS[2]]) == before
    finally:
        clear_hardware(lab, HOSTS[2])
        for host in off:
            lab.power(host, on=True)
