"""The fleetops.scan/v1 contract and exit codes, built from runner task results."""

from __future__ import annotations

from typing import Any

from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.scan import SCHEMA, build_report, exit_code

MEMCG = {
    "cgroup_version": 1,
    "scope": "host",
    "total": 1552,
    "live": 3,
    "zombies": 1549,
    "id_headroom": 63983,
}


def _ok(host: str, findings: list[dict[str, Any]], errors: list[dict[str, str]] | None = None) -> TaskResult:
    return TaskResult(
        host=host,
        status="ok",
        task="Run all detectors in one module call",
        action="fleetops.node.node_health",
        result={"changed": False, "facts": {"memcg": MEMCG}, "findings": findings, "errors": errors or []},
    )


def _run(*results: TaskResult) -> PlaybookRun:
    run = PlaybookRun(status="successful", rc=0)
    for r in results:
        run.tasks.setdefault(r.host, []).append(r)
    return run


WARN = {"check": "zombie_memcg", "severity": "warning", "summary": "1,549 zombies", "data": {"zombies": 1549}}
INFO = {"check": "zombie_memcg", "severity": "info", "summary": "namespace", "data": {}}


def test_contract_keys_and_summary() -> None:
    unreachable = TaskResult(
        "lab-09", "unreachable", "t", "fleetops.node.node_health", {"msg": "No route to host"}
    )
    failed = TaskResult("lab-08", "failed", "t", "fleetops.node.node_health", {"msg": "boom"})
    report = build_report(
        _run(_ok("a", [WARN]), _ok("b", [INFO]), unreachable, failed), started=0, finished=1
    )
    assert report["schema"] == SCHEMA
    assert set(report["hosts"]) == {"a", "b", "lab-08", "lab-09"}
    a = report["hosts"]["a"]
    assert a["status"] == "ok"
    assert a["facts"]["memcg"] == MEMCG
    assert a["findings"] == [WARN]
    assert report["hosts"]["lab-09"] == {
        "status": "unreachable",
        "msg": "No route to host",
        "findings": [],
        "facts": {},
    }
    assert report["hosts"]["lab-08"]["status"] == "failed"
    assert report["summary"] == {
        "hosts": 4,
        "ok": 2,
        "partial": 0,
        "unreachable": 1,
        "failed": 1,
        "findings": {"critical": 0, "warning": 1, "info": 1},
        "errors": 0,
    }
    assert exit_code(report) == 3


def test_exit_codes() -> None:
    assert exit_code(build_report(_run(_ok("a", [])), started=0, finished=0)) == 0
    assert exit_code(build_report(_run(_ok("a", [INFO])), started=0, finished=0)) == 0
    assert exit_code(build_report(_run(_ok("a", [WARN])), started=0, finished=0)) == 1
    crit = {**WARN, "severity": "critical"}
    assert exit_code(build_report(_run(_ok("a", [crit])), started=0, finished=0)) == 1
    detector_error = [{"check": "zombie_memcg", "msg": "Failed to parse /proc/cgroups: truncated"}]
    assert exit_code(build_report(_run(_ok("a", [], detector_error)), started=0, finished=0)) == 3


def test_host_without_scan_result_is_failed_not_ok() -> None:
    gather = TaskResult(
        "a", "failed", "Gathering Facts", "ansible.builtin.gather_facts", {"msg": "no python"}
    )
    report = build_report(_run(gather), started=0, finished=0)
    assert report["hosts"]["a"]["status"] == "failed"
    assert report["hosts"]["a"]["msg"] == "no python"


def test_only_the_options_the_user_set_reach_the_playbook() -> None:
    """node_health's defaults live once, in the collection: unset options are not passed at all."""
    from fleetops.cli.app import build_parser
    from fleetops.cli.remediate import remediation_request
    from fleetops.remediations import REMEDIATIONS
    from fleetops.scan import ScanOptions

    assert ScanOptions().playbook_vars() == {"fleetops_host_timeout": 120}
    args = build_parser().parse_args(["scan"])
    assert (args.sample_seconds, args.zombie_warning, args.zombie_critical, args.headroom_critical) == (
        None,
    ) * 4
    set_ = ScanOptions(sample_seconds=0.5, zombie_warning=7, zombie_critical=9, headroom_critical_pct=5.0)
    assert set_.playbook_vars() == {
        "fleetops_host_timeout": 120,
        "fleetops_sample_seconds": 0.5,
        "fleetops_zombie_warning": 7,
        "fleetops_zombie_critical": 9,
        "fleetops_headroom_critical_pct": 5.0,
    }
    for argv, unset in (
        (["remediate", "reclaim"], ("fleetops_min_zombies", "fleetops_reboot_threshold")),
        (["remediate", "fix"], ("fleetops_reboot_threshold",)),
    ):
        remediation = REMEDIATIONS[argv[1]]
        params = remediation.resolve(remediation_request(build_parser().parse_args(argv)).params)
        extravars = remediation.extravars(params)
        assert not set(unset) & set(extravars), extravars
    reclaim = REMEDIATIONS["reclaim"]
    argv = ["remediate", "reclaim", "--min-zombies", "0", "--reboot-threshold", "5"]
    params = reclaim.resolve(remediation_request(build_parser().parse_args(argv)).params)
    assert reclaim.extravars(params) == {"fleetops_min_zombies": 0, "fleetops_reboot_threshold": 5}
