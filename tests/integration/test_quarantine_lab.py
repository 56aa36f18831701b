"""Quarantine and unquarantine real lab hosts: the scan before the unquarantine is real (a crash-looping
unit installed on one host), kubectl is the stand-in tests/kubectl_standin/kubectl (no Kubernetes API
server can run on these machines; it keeps the nodes in a JSON file and enforces cordon and taints).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab
from fleetops_lab.host_faults import install_crashloop_unit, remove_crashloop_unit
from tests.helpers import fleetops
from tests.paths import KUBECTL_STANDIN

pytestmark = pytest.mark.lab
SICK, HEALTHY = "lab-01", "lab-02"
STANDIN = KUBECTL_STANDIN
KEY = "fleetops.io/quarantine"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(2)
    try:
        yield lab
    finally:
        remove_crashloop_unit(lab, SICK)
        lab.down()


def test_a_host_whose_scan_still_finds_the_loop_stays_quarantined(lab: Lab, tmp_path: Path) -> None:
    kube = tmp_path / "kube.json"
    kube.write_text(json.dumps({"nodes": {h: {} for h in (SICK, HEALTHY)}, "pods": [], "pdbs": []}))
    env = {
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "FLEETOPS_KUBECTL_STATE": str(kube),
    }
    inv = str(lab.inventory_path())
    common = ("-i", inv, "--apply", "--kubectl", str(STANDIN), "--format", "json", "--cooldown", "0")
    install_crashloop_unit(lab, SICK, restart_sec=0.5)
    time.sleep(8)  # let it crash a few times

    quarantined = fleetops("remediate", "quarantine", *common, "--finding", "crashloop_unit", env=env)
    assert quarantined.rc == 0, quarantined.stderr
    nodes: dict[str, Any] = json.loads(kube.read_text())["nodes"]
    for host in (SICK, HEALTHY):
        assert nodes[host]["unschedulable"] is True
        assert [t["key"] for t in nodes[host]["taints"]] == [KEY]

    # --max-failures 1: the refused host does not stop the breaker before the healthy one
    freed = fleetops(
        "remediate", "unquarantine", *common, "--sample-seconds", "5", "--max-failures", "1", env=env
    )
    assert freed.rc == 3, freed.stderr  # a refused host fails: the exit code says so
    doc = json.loads(freed.stdout)
    assert f"refused: its scan still finds crashloop_unit: node {SICK} left quarantined" in json.dumps(doc)
    nodes = json.loads(kube.read_text())["nodes"]
    assert nodes[SICK]["unschedulable"] is True and KEY in nodes[SICK]["annotations"]
    assert nodes[HEALTHY] == {"unschedulable": False, "taints": [], "annotations": {}}
