"""`fleetops scan` across a fleet of real lab hosts (systemd-nspawn, systemd as PID 1, sshd)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops_lab import Lab
from tests.helpers import fleetops

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(3)
    try:
        yield lab
    finally:
        lab.down()


def test_scan_lab_fleet_reports_namespace_scope(lab: Lab) -> None:
    result = fleetops("scan", "-i", str(lab.inventory_path()), "--format", "json", "--quiet")
    report = result.json()
    assert set(report["hosts"]) == {"lab-01", "lab-02", "lab-03"}
    for name, host in report["hosts"].items():
        assert host["status"] == "ok", (name, host)
        memcg = host["facts"]["memcg"]
        assert memcg["scope"] == "namespace", memcg
        # The host-wide count minus the guest's own directories is not a zombie count: never report it.
        assert memcg["zombies"] is None
        assert memcg["total"] > 0
        # live memcgs host-wide are unknown in a namespace: the headroom counts every memcg (worst case)
        assert memcg["id_used"] == memcg["total"]
        assert memcg["id_headroom"] == 65535 - memcg["total"]
        assert memcg["id_headroom_basis"] == (
            "every memcg, dying included: worst case, live memcgs host-wide are unknown in a cgroup namespace"
        )
    assert report["summary"]["ok"] == 3
    assert result.rc in (0, 1), result.stderr


def test_unreachable_host_is_reported_and_others_still_scanned(lab: Lab, tmp_path: Path) -> None:
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    # An address in the lab's own subnet where no host answers: ssh fails fast with no route to host.
    hosts["lab-ghost"] = {"ansible_host": lab.unused_ip}
    inv = tmp_path / "with-ghost.yml"
    inv.write_text(yaml.safe_dump(inventory))
    result = fleetops("scan", "-i", str(inv), "--format", "json", "--quiet", "--forks", "10")
    report = result.json()
    assert result.rc == 3, result.stderr
    assert report["hosts"]["lab-ghost"]["status"] == "unreachable"
    assert report["hosts"]["lab-ghost"]["msg"]
    assert all(report["hosts"][h]["status"] == "ok" for h in ("lab-01", "lab-02", "lab-03"))
    assert report["summary"]["unreachable"] == 1
    assert report["summary"]["ok"] == 3


def test_limit_narrows_the_scan(lab: Lab) -> None:
    result = fleetops("scan", "-i", str(lab.inventory_path()), "--limit", "lab-02", "--format", "json", "-q")
    assert set(result.json()["hosts"]) == {"lab-02"}
