"""The storm brake on a lab fleet: an uncorrectable-ECC fault on every one of six lab hosts (a driver bug
that makes every GPU report errors at once). Over passes spanning the quarantine rung's clear time, the
hosts cordoned are exactly the quarantine budget, nothing is rebooted, stop-started or replaced, and the
brake is reported once.

There is no GPU here: each host's ``nvidia-smi`` is the lab's stand-in (fleetops_lab.hardware); kubectl is
the stand-in tests/kubectl_standin/kubectl (no Kubernetes API server runs here). The scans, the policy,
the rollouts and the quarantine's kubectl calls are real.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab
from fleetops_lab.hardware import clear_hardware, inject_ecc
from tests.helpers import boots, fleetops
from tests.paths import KUBECTL_STANDIN

pytestmark = pytest.mark.lab
HOSTS = [f"lab-0{i}" for i in range(1, 7)]
QUARANTINE_PER_HOUR = 2

POLICY = f"""
schema: fleetops.policy/v1
budgets:
  quarantine: {{window: 1h, max: {QUARANTINE_PER_HOUR}}}
  stop-start: {{window: 1h, max: 10}}
  reboot: {{window: 1h, max: 10}}
  replace: {{window: 1h, max: 10}}
rules:
  - name: gpu-fatal
    match: [{{check: gpu_health, severity: [critical]}}]
    ladder:
      - {{action: quarantine, clear_after: 1s}}
      - {{action: reboot, clear_after: 10m}}
      - {{action: stop-start, clear_after: 30m}}
      - {{action: replace, clear_after: 1h}}
      - {{action: human}}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(len(HOSTS))
    try:
        yield lab
    finally:
        lab.down()


def _pass(lab: Lab, env: dict[str, str], policy: Path) -> tuple[int, dict[str, Any], str]:
    result = fleetops(
        "remediate", "auto", "-i", str(lab.inventory_path()), "--policy", str(policy), "--apply",
        "--sample-seconds", "1", "--kubectl", str(KUBECTL_STANDIN), "--canary", "0", "--format", "json", env=env,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.rc, json.loads(result.stdout), result.stderr


def test_an_ecc_storm_cordons_the_budget_and_holds_everything_else(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    kube = tmp_path / "kube.json"
    kube.write_text(json.dumps({"nodes": {h: {} for h in HOSTS}, "pods": [], "pdbs": []}))
    env = {**env, "FLEETOPS_KUBECTL_STATE": str(kube)}
    policy = tmp_path / "storm.yml"
    policy.write_text(POLICY)
    for host in HOSTS:
        inject_ecc(lab, host, uncorrected=2)
    try:
        before = boots(lab, HOSTS)
        told, statuses = [], []
        for i in range(3):  # quarantine's clear time (1 s) passes between them: its ladder would climb
            rc, doc, err = _pass(lab, env, policy)
            # a storm brake waits for a person: said in the document, not a failed pass (exit 1 only with
            # --fail-on human)
            assert rc == 0, err
            assert doc["waiting_for_person"]["brakes"] == ["gpu-fatal"], doc.get("waiting_for_person")
            assert doc["brakes"]["gpu-fatal"]["new"] is (i == 0), doc["brakes"]
            told.append(err.count("storm brake tripped on rule gpu-fatal"))
            statuses.append({d["host"]: d["status"] for d in doc["decisions"]})
            assert {a["action"] for a in doc["actions"]} <= {"quarantine"}, doc["actions"]
            time.sleep(1.5)
        assert told == [1, 0, 0]  # reported once
        cordoned = sorted(
            h for h, n in json.loads(kube.read_text())["nodes"].items() if n.get("unschedulable")
        )
        assert len(cordoned) == QUARANTINE_PER_HOUR, cordoned  # exactly the budget
        assert {statuses[-1][h] for h in cordoned} == {"brake"}  # their next rung (reboot) held
        assert {statuses[-1][h] for h in HOSTS if h not in cordoned} == {"budget"}
        assert boots(lab, HOSTS) == before  # no reboot, no power cycle
    finally:
        for host in HOSTS:
            clear_hardware(lab, host)
