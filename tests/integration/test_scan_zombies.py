"""`fleetops scan` finds real zombie memory cgroups on this kernel, through ansible-runner and our module.

Zombies here are real: mkdir a memory cgroup, charge page cache to it, rmdir it (fleetops_lab.faults).
/proc/cgroups is host-wide, so every count is taken against a baseline measured in the same test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetops_lab.faults import create_zombie_memcgs
from tests.helpers import fleetops

pytestmark = [pytest.mark.kernel, pytest.mark.exclusive]  # host-wide counts: alone
CREATED = 1500


def _swap_in_use_kib() -> int:
    """KiB swapped out, from /proc/swaps (the header, then one line per area, Used 4th)."""
    return sum(
        int(line.split()[3]) for line in Path("/proc/swaps").read_text().splitlines()[1:] if line.strip()
    )


def _local_scan(*extra: str) -> tuple[int, dict[str, Any]]:
    result = fleetops("scan", "--format", "json", "--quiet", *extra, timeout=180)
    assert "Traceback" not in result.stderr
    return result.rc, result.json()


def _memcg(report: dict[str, Any]) -> dict[str, Any]:
    host = report["hosts"]["localhost"]
    # answered (partial where systemd is not PID 1: crashloop_unit cannot look), and zombie_memcg saw the host
    assert host["status"] in ("ok", "partial"), host
    assert host["coverage"]["zombie_memcg"] == {"level": "full", "reason": None}, host["coverage"]
    memcg: dict[str, Any] = host["facts"]["memcg"]
    return memcg


def test_scan_counts_real_zombies_and_they_drop_after_release() -> None:
    rc, before = _local_scan("--zombie-warning", "100000", "--zombie-critical", "100000")
    base = _memcg(before)
    assert base["cgroup_version"] == 1
    assert base["scope"] == "host"
    assert rc == 0, before
    with create_zombie_memcgs(CREATED) as batch:
        assert batch.count == CREATED
        rc, during = _local_scan()
        memcg = _memcg(during)
        expected = base["zombies"] + CREATED
        assert abs(memcg["zombies"] - expected) <= 0.05 * expected, (memcg, base)
        assert memcg["total"] - memcg["live"] == memcg["zombies"]
        # a dying memcg holds its ID only while swap holds its pages (Linux >= 4.7)
        if _swap_in_use_kib() == 0:
            assert memcg["id_used"] == min(memcg["live"], memcg["total"]) < memcg["total"] - CREATED // 2
            assert memcg["id_headroom_basis"].startswith("live memcgs: ")
        else:
            assert memcg["id_used"] == memcg["total"]
            assert memcg["id_headroom_basis"].startswith("every memcg, dying included: swap is in use")
        assert memcg["id_headroom"] == 65535 - memcg["id_used"]
        if memcg["zombies"] < 20000:
            assert rc == 1
            findings = during["hosts"]["localhost"]["findings"]
            zombie = [f for f in findings if f["check"] == "zombie_memcg"]
            assert [f["severity"] for f in zombie] == ["warning"], findings
            assert zombie[0]["data"]["zombies"] == memcg["zombies"]
            assert during["summary"]["findings"]["warning"] >= 1
    # Deleting the pinning files lets the kernel free the dying cgroups (asynchronously).
    deadline = time.monotonic() + 30
    while True:
        rc, after = _local_scan("--zombie-warning", "100000", "--zombie-critical", "100000")
        zombies_after = _memcg(after)["zombies"]
        if zombies_after <= base["zombies"] + 0.05 * CREATED or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert zombies_after <= base["zombies"] + 0.05 * CREATED, (base, _memcg(after))
    assert rc == 0


def test_thresholds_are_settable_and_critical_wins() -> None:
    rc, report = _local_scan("--zombie-warning", "0", "--zombie-critical", "0")
    findings = report["hosts"]["localhost"]["findings"]
    assert [f["severity"] for f in findings if f["check"] == "zombie_memcg"] == ["critical"]
    assert rc == 1


def test_prometheus_textfile_matches_the_json_report(tmp_path: Path) -> None:
    prom = tmp_path / "fleetops.prom"
    out = tmp_path / "report.json"
    result = fleetops(
        "scan", "--quiet", "--format", "json", "-o", str(out), "--prometheus", str(prom), timeout=180
    )
    report = json.loads(out.read_text())
    assert result.json()["hosts"] == report["hosts"]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(prom.read_text())
        for s in family.samples
    }
    memcg = report["hosts"]["localhost"]["facts"]["memcg"]
    host = (("host", "localhost"),)
    assert samples[("fleetops_memcg_total", host)] == memcg["total"]
    assert samples[("fleetops_memcg_live", host)] == memcg["live"]
    assert samples[("fleetops_memcg_zombies", host)] == memcg["zombies"]
    assert samples[("fleetops_memcg_id_headroom", host)] == memcg["id_headroom"]
    assert samples[("fleetops_scan_host_up", host)] == 1
    for sev in ("critical", "warning", "info"):
        expected = sum(1 for f in report["hosts"]["localhost"]["findings"] if f["severity"] == sev)
        assert samples[("fleetops_findings", (("host", "localhost"), ("severity", sev)))] == expected
    assert samples[("fleetops_scan_hosts", (("status", "ok"),))] == report["summary"]["ok"]
    assert samples[("fleetops_scan_hosts", (("status", "partial"),))] == report["summary"]["partial"]
    assert samples[("fleetops_check_coverage", (("check", "zombie_memcg"), ("host", "localhost")))] == 1
    findings = report["hosts"]["localhost"]["findings"]
    for metric, check in (
        ("fleetops_crashloop_units", "crashloop_unit"),
        ("fleetops_ucx_risky_processes", "ucx_mmap_hooks"),
        ("fleetops_anon_rss_growing_processes", "anon_rss_growth"),
    ):
        assert samples[(metric, host)] == sum(
            1
            for f in findings
            if (f["check"] == check and f["severity"] != "info") or (f["check"] == check == "ucx_mmap_hooks")
        )
