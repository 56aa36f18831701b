"""`fleetops remediate fix` for UCX findings: the set_env entries of the per-host plan."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops.fix import fix_plan_from_report


def _ucx(
    severity: str, unit: str | None = "vllm.service", manager: str | None = "system", **data: Any
) -> dict[str, Any]:
    fixable = bool(unit and manager == "system" and unit.endswith(".service"))
    return {
        "check": "ucx_mmap_hooks",
        "severity": severity,
        "summary": "...",
        "data": {"pid": 4242, "comm": "python3", "unit": unit, "unit_manager": manager,
                 "fixable_unit": fixable, "cgroup": f"/system.slice/{unit}", **data},
    }  # fmt: skip


def _host(*findings: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "findings": list(findings), "facts": {}}


LOOP = {"check": "crashloop_unit", "severity": "critical", "summary": "", "data": {"unit": "ecs.service"}}


def test_ucx_findings_get_the_environment_fix_once_per_unit() -> None:
    report = {
        "hosts": {
            "decode": _host(_ucx("critical"), _ucx("warning", pid=4243)),  # two workers, one unit
            "fixed-upstream": _host(_ucx("info")),
            "container": _host(_ucx("warning", unit="docker-4f1c.scope")),
            "user": _host(_ucx("warning", unit="vllm.service", manager="user")),
            "both": _host(LOOP, _ucx("warning", unit="ecs.service"), _ucx("warning", unit="other.service")),
        }
    }
    plan, notes = fix_plan_from_report(report)
    assert plan == {
        "decode": {
            "disable_units": [],
            "reclaim": False,
            "set_env": [{"unit": "vllm.service", "env": {"UCX_RCACHE_MAX_UNRELEASED": "1024"}}],
        },
        # a unit being turned off gets no environment fix
        "both": {
            "disable_units": ["ecs.service"],
            "reclaim": True,
            "set_env": [{"unit": "other.service", "env": {"UCX_RCACHE_MAX_UNRELEASED": "1024"}}],
        },
    }
    assert notes == [
        "container: pid 4242 (python3) runs UCX with the leaking hook setup but no system service owns it "
        "(docker-4f1c.scope (system manager)): left for a human",
        "user: pid 4242 (python3) runs UCX with the leaking hook setup but no system service owns it "
        "(vllm.service (user manager)): left for a human",
    ]


def test_hooks_off_instead() -> None:
    plan, _notes = fix_plan_from_report({"hosts": {"decode": _host(_ucx("warning"))}}, ucx_fix="hooks-off")
    assert plan["decode"]["set_env"] == [{"unit": "vllm.service", "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}}]


def test_unknown_fix_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown UCX fix 'off'"):
        fix_plan_from_report({"hosts": {}}, ucx_fix="off")
