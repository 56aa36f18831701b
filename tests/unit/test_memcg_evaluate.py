"""zombie_memcg evaluate(): thresholds at their boundaries, summaries, data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.fleetops.node.plugins.module_utils import memcg  # noqa: E402

LIVE = 41


def host_facts(zombies: int, live: int = LIVE, total: int | None = None) -> dict[str, Any]:
    """v1 host-scope facts as collect() makes them."""
    total = zombies + live if total is None else total
    free, free_pct = memcg.id_headroom(total)
    return {
        "cgroup_version": 1,
        "scope": "host",
        "total": total,
        "live": live,
        "zombies": zombies,
        "id_headroom": free,
        "id_headroom_pct": free_pct,
        "basis": memcg.BASIS_V1,
        "scope_reason": "initial cgroup namespace (cgroup:[4026531835]) and the hierarchy is mounted at its root",
        "hierarchy": "/sys/fs/cgroup/memory",
        "reason": None,
    }


def severity(facts: dict[str, Any], **thresholds: Any) -> str | None:
    findings = memcg.evaluate(facts, thresholds)
    assert len(findings) <= 1
    return findings[0]["severity"] if findings else None


@pytest.mark.parametrize(
    ("zombies", "expected"),
    [(0, None), (999, None), (1000, "warning"), (19999, "warning"), (20000, "critical"), (68680, "critical")],
)
def test_zombie_thresholds_at_their_boundaries(zombies: int, expected: str | None) -> None:
    # few live cgroups, so headroom stays above 20% up to 52,428 total
    assert severity(host_facts(zombies, live=5)) == expected


def test_headroom_boundary_is_exact() -> None:
    # 52,428 used: 13,107 free = exactly 20.00% -> not critical; 52,429 used: 19.998% -> critical
    assert severity(host_facts(zombies=500, live=51928)) is None
    facts = host_facts(zombies=500, live=51929)
    assert facts["total"] == 52429
    (finding,) = memcg.evaluate(facts)
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "only 13,106 of 65,535 memcg IDs free (19.99%, critical under 20%); 500 zombie memory cgroups, 51,929 live"
    )


def test_custom_thresholds() -> None:
    facts = host_facts(zombies=150)
    assert severity(facts, zombie_warning=100, zombie_critical=200) == "warning"
    assert severity(facts, zombie_warning=100, zombie_critical=150) == "critical"
    assert severity(facts, headroom_critical_pct=99.9) == "critical"
    assert severity(facts, headroom_critical_pct=0) is None


def test_warning_summary_and_data() -> None:
    (finding,) = memcg.evaluate(host_facts(zombies=1523, live=41))
    assert finding == {
        "check": "zombie_memcg",
        "severity": "warning",
        "summary": "1,523 zombie memory cgroups (warning at 1,000); 63,971 of 65,535 memcg IDs free",
        "data": {
            "zombies": 1523,
            "total": 1564,
            "live": 41,
            "id_headroom": 63971,
            "id_headroom_pct": 97.61,
            "id_max": 65535,
            "cgroup_version": 1,
            "scope": "host",
            "thresholds": {"zombie_warning": 1000, "zombie_critical": 20000, "headroom_critical_pct": 20.0},
        },
    }


def test_critical_summary_names_both_causes() -> None:
    (finding,) = memcg.evaluate(host_facts(zombies=68439, live=241))
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "68,439 zombie memory cgroups (critical at 20,000); only 0 of 65,535 memcg IDs free (0%, critical under 20%)"
    )
    assert finding["data"]["id_headroom"] == 0


def test_growth_in_summary_and_data() -> None:
    facts = memcg.add_growth(host_facts(zombies=1400), host_facts(zombies=1523), 30.0)
    (finding,) = memcg.evaluate(facts)
    assert finding["summary"].endswith("; zombies +246/min over 30s")
    assert finding["data"]["growth"] == {
        "seconds": 30.0,
        "total_per_min": 246.0,
        "live_per_min": 0.0,
        "zombies_per_min": 246.0,
    }


def test_namespace_scope_is_info_not_a_false_count() -> None:
    facts = {**host_facts(zombies=0, total=1536, live=4), "scope": "namespace", "zombies": None}
    (finding,) = memcg.evaluate(facts)
    assert finding["severity"] == "info"
    assert (
        finding["summary"]
        == "zombie count unknown in a cgroup namespace; host-wide memcg total 1,536, headroom 63,999"
    )
    assert finding["data"]["zombies"] is None


def test_namespace_scope_still_reports_critical_headroom() -> None:
    facts = {**host_facts(zombies=0, total=60000, live=4), "scope": "namespace", "zombies": None}
    growth = memcg.add_growth({**facts, "total": 59000}, facts, 60.0)
    (finding,) = memcg.evaluate(growth)
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "only 5,535 of 65,535 memcg IDs free (8.44%, critical under 20%); host-wide memcg total 60,000; "
        "zombie count unknown in a cgroup namespace; total +1,000/min over 60s"
    )


def test_v2_before_6_12_says_all_controllers() -> None:
    facts = {
        **host_facts(zombies=1226, live=61, total=1287),
        "cgroup_version": 2,
        "basis": memcg.BASIS_V2_DESCENDANTS,
    }
    (finding,) = memcg.evaluate(facts)
    assert finding["summary"].startswith("1,226 dying cgroups (all controllers) (warning at 1,000)")


def test_no_memory_controller_no_finding() -> None:
    assert memcg.evaluate({"cgroup_version": None, "reason": "no memory cgroup controller here"}) == []
