"""zombie_memcg evaluate(): thresholds at their boundaries, summaries, data."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import memcg

LIVE = 41


def host_facts(
    zombies: int, live: int = LIVE, total: int | None = None, swap: bool = False
) -> dict[str, Any]:
    """v1 host-scope facts as collect() makes them on a >= 4.7 kernel, without or with pages in swap."""
    total = zombies + live if total is None else total
    used = total if swap else min(live, total)
    free, free_pct = memcg.id_headroom(used)
    return {
        "cgroup_version": 1,
        "scope": "host",
        "total": total,
        "live": live,
        "zombies": zombies,
        "id_used": used,
        "id_headroom": free,
        "id_headroom_pct": free_pct,
        "id_headroom_basis": memcg.ID_BASIS_SWAP_USED if swap else memcg.ID_BASIS_LIVE_NO_SWAP,
        "basis": memcg.BASIS_V1,
        "scope_reason": "initial cgroup namespace (cgroup:[4026531835]) and the hierarchy is mounted at its root",
        "hierarchy": "/sys/fs/cgroup/memory",
        "reason": None,
    }


def namespace_facts(total: int, live: int | None = 4) -> dict[str, Any]:
    """Namespace-scope facts as collect() makes them: zombies unknown, headroom against every memcg."""
    free, free_pct = memcg.id_headroom(total)
    return {
        **host_facts(zombies=0, total=total, live=live or 0),
        "scope": "namespace",
        "live": live,
        "zombies": None,
        "id_used": total,
        "id_headroom": free,
        "id_headroom_pct": free_pct,
        "id_headroom_basis": memcg.ID_BASIS_NAMESPACE,
        "basis": memcg.BASIS_V1_NAMESPACE,
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
    # few live cgroups and no swap: the zombies hold no ID, so only their count decides
    assert severity(host_facts(zombies, live=5)) == expected


def test_headroom_ignores_zombies_without_swap_and_counts_them_with_swap() -> None:
    # 60,000 zombies, 41 live: 65,494 IDs free without swap; 5,494 (8.38%) when swap pins them
    facts = host_facts(zombies=60000)
    (finding,) = memcg.evaluate(facts, {"zombie_critical": 100000})
    assert finding["severity"] == "warning"
    assert (
        finding["summary"]
        == "60,000 zombie memory cgroups (warning at 1,000); 65,494 of 65,535 memcg IDs free"
    )
    (swapping,) = memcg.evaluate(host_facts(zombies=60000, swap=True), {"zombie_critical": 100000})
    assert swapping["severity"] == "critical"
    assert swapping["summary"] == (
        "60,000 zombie memory cgroups (warning at 1,000); only 5,494 of 65,535 memcg IDs free (8.38%, critical "
        "under 20%); counted against every memcg, dying included: swap is in use, and swapped-out pages keep a "
        "dying memcg's ID"
    )
    assert (swapping["data"]["id_used"], swapping["data"]["id_headroom"]) == (60041, 5494)
    assert swapping["data"]["id_headroom_basis"] == memcg.ID_BASIS_SWAP_USED


def test_headroom_boundary_is_exact() -> None:
    # 52,428 used: 13,107 free = exactly 20.00% -> not critical; 52,429 used: 19.998% -> critical
    assert severity(host_facts(zombies=500, live=52428)) is None
    facts = host_facts(zombies=500, live=52429)
    assert facts["id_used"] == 52429
    (finding,) = memcg.evaluate(facts)
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "only 13,106 of 65,535 memcg IDs free (19.99%, critical under 20%); counted against live memcgs: no swap "
        "is active, so dying memcgs hold no ID (released at offline since Linux 4.7); 500 zombie memory cgroups, "
        "52,429 live"
    )
    # with swap in use the same boundary falls on live + dying
    assert severity(host_facts(zombies=500, live=51928, swap=True)) is None
    assert severity(host_facts(zombies=500, live=51929, swap=True)) == "critical"


def test_custom_thresholds() -> None:
    facts = host_facts(zombies=150)
    assert severity(facts, zombie_warning=100, zombie_critical=200) == "warning"
    assert severity(facts, zombie_warning=100, zombie_critical=150) == "critical"
    assert severity(facts, headroom_critical_pct=99.93) is None  # 65,494 free: 99.937%
    assert severity(facts, headroom_critical_pct=99.94) == "critical"
    assert severity(facts, headroom_critical_pct=0) is None


def test_warning_summary_and_data() -> None:
    (finding,) = memcg.evaluate(host_facts(zombies=1523, live=41))
    assert finding == {
        "check": "zombie_memcg",
        "severity": "warning",
        "summary": "1,523 zombie memory cgroups (warning at 1,000); 65,494 of 65,535 memcg IDs free",
        "data": {
            "zombies": 1523,
            "total": 1564,
            "live": 41,
            "id_used": 41,
            "id_headroom": 65494,
            "id_headroom_pct": 99.93,
            "id_headroom_basis": memcg.ID_BASIS_LIVE_NO_SWAP,
            "id_max": 65535,
            "cgroup_version": 1,
            "scope": "host",
            "thresholds": {"zombie_warning": 1000, "zombie_critical": 20000, "headroom_critical_pct": 20.0},
        },
    }


def test_critical_summary_names_both_causes() -> None:
    (finding,) = memcg.evaluate(host_facts(zombies=68439, live=241, swap=True))
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "68,439 zombie memory cgroups (critical at 20,000); only 0 of 65,535 memcg IDs free (0%, critical under "
        "20%); counted against every memcg, dying included: swap is in use, and swapped-out pages keep a dying "
        "memcg's ID"
    )
    assert finding["data"]["id_headroom"] == 0
    assert finding["data"]["id_used"] == 68680


def test_pinterest_count_without_swap_is_critical_by_zombies_not_ids() -> None:
    (finding,) = memcg.evaluate(host_facts(zombies=68439, live=241))
    assert finding["severity"] == "critical"
    assert (
        finding["summary"]
        == "68,439 zombie memory cgroups (critical at 20,000); 65,294 of 65,535 memcg IDs free"
    )
    assert (finding["data"]["total"], finding["data"]["id_used"], finding["data"]["id_headroom"]) == (
        68680,
        241,
        65294,
    )


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
    (finding,) = memcg.evaluate(namespace_facts(total=1536))
    assert finding["severity"] == "info"
    assert (
        finding["summary"]
        == "zombie count unknown in a cgroup namespace; host-wide memcg total 1,536, headroom 63,999"
    )
    assert finding["data"]["zombies"] is None
    assert finding["data"]["id_used"] == 1536
    assert finding["data"]["id_headroom_basis"] == memcg.ID_BASIS_NAMESPACE


def test_namespace_scope_still_reports_critical_headroom() -> None:
    facts = namespace_facts(total=60000)
    growth = memcg.add_growth({**facts, "total": 59000}, facts, 60.0)
    (finding,) = memcg.evaluate(growth)
    assert finding["severity"] == "critical"
    assert finding["summary"] == (
        "only 5,535 of 65,535 memcg IDs free (8.44%, critical under 20%); counted against every memcg, dying "
        "included: worst case, live memcgs host-wide are unknown in a cgroup namespace; host-wide memcg total "
        "60,000; zombie count unknown in a cgroup namespace; total +1,000/min over 60s"
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
