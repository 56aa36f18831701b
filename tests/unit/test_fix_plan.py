"""What `fleetops remediate fix` does per host, from a scan report."""

from __future__ import annotations

from typing import Any

from fleetops.fix import fix_plan_from_report


def _host(*findings: dict[str, Any], status: str = "ok") -> dict[str, Any]:
    return {"status": status, "findings": list(findings), "facts": {}}


LOOP = {
    "check": "crashloop_unit",
    "severity": "critical",
    "summary": "ecs.service is crash looping",
    "data": {"unit": "ecs.service", "restarts_per_min": 30.0},
}
SLOW = {**LOOP, "severity": "info", "data": {"unit": "flaky.service"}}
ZOMBIES = {
    "check": "zombie_memcg",
    "severity": "warning",
    "summary": "piling up",
    "data": {"culprits": [{"unit": "ecs.service"}, {"unit": "other.service"}]},
}


def test_fix_plan_turns_off_loops_and_culprits_then_reclaims() -> None:
    report = {
        "hosts": {
            "sick": _host(LOOP, ZOMBIES),
            "zombies-only": _host(
                {**ZOMBIES, "data": {"zombies": 1500, "thresholds": {"zombie_warning": 1000}}}
            ),
            "ids-running-out": _host({**ZOMBIES, "data": {"id_headroom_pct": 10.0, "zombies": None}}),
            "growth-only": _host(
                {**ZOMBIES, "data": {"zombies": None, "growth_per_min": 60.0, "culprits": []}}
            ),
            "healthy": _host(),
            "info-only": _host(SLOW),
            "gone": {"status": "unreachable", "msg": "No route to host", "findings": [], "facts": {}},
        }
    }
    plan, notes = fix_plan_from_report(report)
    assert plan == {
        "sick": {"disable_units": ["ecs.service", "other.service"], "reclaim": True},
        "zombies-only": {"disable_units": [], "reclaim": True},
        "ids-running-out": {"disable_units": [], "reclaim": True},
    }
    assert notes == [
        "gone: unreachable in the scan, left alone (No route to host)",
        "growth-only: memory cgroups growing with no culprit named: left for a human to look at",
    ]


def test_nothing_to_fix() -> None:
    plan, notes = fix_plan_from_report({"hosts": {"a": _host()}})
    assert plan == {}
    assert notes == ["no host has a crash-looping unit or zombie memory cgroups to fix"]
