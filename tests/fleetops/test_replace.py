"""`fleetops remediate replace`: the registry entry, its CLI options and the engine's gate for a remediation
that replaces its hosts (``Remediation.replaces_host``).

The batch runner here is a stand-in that answers with the task results the replace playbook produces
(fleetops.node.ec2_asg_replace, then node_health of the new instance, both delegated from the old
host): the real playbook against real lab hosts is tests/integration/test_replace_lab.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.errors import UsageError
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.engine import Engine
from fleetops.rollout.gate import replacement_entry
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import new_rollout

REPLACE = REMEDIATIONS["replace"]


def _finding(check: str, severity: str) -> dict[str, Any]:
    return {"check": check, "severity": severity, "summary": f"{check} on the new host", "data": {}}


class ReplaceRunner:
    """Answers each host with the replace module's result and the new instance's scan (``findings``)."""

    def __init__(self, findings: dict[str, list[dict[str, Any]]], scan: bool = True) -> None:
        self.findings = findings
        self.scan = scan

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            replaced = {
                "changed": True,
                "instance_id": f"i-old-{host}",
                "group": "workers",
                "new_instances": [{"instance_id": f"i-new-{host}", "name": f"{host}-new"}],
            }
            results = [TaskResult(host, "ok", "Replace", "fleetops.node.ec2_asg_replace", replaced)]
            if self.scan:
                scan = {"changed": False, "findings": self.findings.get(host, []), "facts": {}}
                results.append(TaskResult(host, "ok", "Scan", "fleetops.node.node_health", scan))
            run.tasks[host] = results
        return run


def _engine(tmp_path: Path, runner: ReplaceRunner, scanned: list[list[str]]) -> Engine:
    rollout = new_rollout(
        action="replace",
        apply=True,
        inventory=[tmp_path / "inv.yml"],
        extravars=REPLACE.extravars(REPLACE.resolve({})),
        plan={"batches": [["a", "b"]], "hosts": 2},
        max_failures=5,
        cooldown=0,
        gate=True,
        state_path=tmp_path / "state.json",
    )

    def scanner(hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        scanned.append(list(hosts))
        # the old hosts, before the rollout: one has a critical finding (why it is replaced)
        return {
            h: {"status": "ok", "findings": [_finding("gpu_xid", "critical")] if h == "a" else []}
            for h in hosts
        }

    return Engine(
        rollout=rollout,
        actions=REPLACE.actions,
        runner=runner,
        scanner=scanner,
        gate_check=REPLACE.gate,
        replaces_host=REPLACE.replaces_host,
    )


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))


def test_the_gate_judges_the_new_hosts_scan_and_never_scans_the_old_host(tmp_path: Path) -> None:
    scanned: list[list[str]] = []
    engine = _engine(tmp_path, ReplaceRunner({}), scanned)
    rollout = engine.run()
    assert rollout.hosts == {"a": "done", "b": "done"}
    assert scanned == [["a", "b"]]  # the baseline only: after the batch the old hosts are gone
    result = rollout.results["a"].result or {}
    tasks = result["tasks"]
    assert tasks[0]["new_instances"][0]["instance_id"] == "i-new-a" and "findings" in tasks[1]


def test_a_new_host_with_a_warning_or_critical_finding_fails_its_gate(tmp_path: Path) -> None:
    """The old host's baseline excuses nothing: a's critical gpu_xid on the new host still fails it."""
    scanned: list[list[str]] = []
    runner = ReplaceRunner(
        {"a": [_finding("gpu_xid", "critical")], "b": [_finding("zombie_memcg", "warning")]}
    )
    rollout = _engine(tmp_path, runner, scanned).run()
    assert rollout.hosts == {"a": "failed", "b": "failed"}
    assert rollout.results["a"].gate == "gate: new critical finding: gpu_xid on the new host"
    assert rollout.results["b"].gate == "gate: the new instance's scan finds: zombie_memcg on the new host"
    assert scanned == [["a", "b"]]


def test_a_replacement_the_playbook_did_not_scan_fails_its_gate(tmp_path: Path) -> None:
    rollout = _engine(tmp_path, ReplaceRunner({}, scan=False), []).run()
    assert rollout.hosts == {"a": "failed", "b": "failed"}
    assert (
        rollout.results["a"].gate
        == "gate: host missing after the batch: the playbook did not scan the new host"
    )


def test_replacement_entry_reads_the_node_health_result() -> None:
    outcome = HostOutcome(
        status="ok",
        result={"tasks": [{"new_instances": [{}]}, {"findings": [_finding("x", "info")], "facts": {}}]},
    )
    assert replacement_entry(outcome) == {"status": "ok", "findings": [_finding("x", "info")]}
    assert replacement_entry(HostOutcome(status="ok", result={"new_instances": []}))["status"] == "missing"


def test_registry_and_cli_options() -> None:
    from fleetops.cli.app import build_parser

    assert REPLACE.playbook == "fleetops.node.replace" and REPLACE.replaces_host
    assert not any(r.replaces_host for name, r in REMEDIATIONS.items() if name != "replace")
    args = build_parser().parse_args(["remediate", "replace", "--timeout", "90", "--method", "unhealthy"])
    params = {name: getattr(args, name) for name in REPLACE.params}
    assert REPLACE.extravars(REPLACE.resolve(params)) == {
        "fleetops_replace_timeout": 90,
        "fleetops_replace_connect_timeout": 90,
        "fleetops_replace_method": "unhealthy",
    }
    xv = REPLACE.extravars(REPLACE.resolve({"timeout": 600}))
    assert REPLACE.check_host_timeout(1201, xv) == 1201
    with pytest.raises(UsageError, match="--host-timeout 1200 must be more than --timeout 600 \\+ --timeout"):
        REPLACE.check_host_timeout(1200, xv)


def test_hosts_of_one_auto_scaling_group_are_never_replaced_in_one_batch(tmp_path: Path) -> None:
    """Two instances of one group replaced at once could not tell their new instances apart (each read
    the first new one): the plan puts them in batches of their own, one after the other, while hosts of
    other groups (and hosts in none) keep their batches; `fleetops plan` shows the same split."""
    from fleetops import api

    def host(group: str | None, az: str) -> str:
        tags = f"ec2_tags: {{'aws:autoscaling:groupName': {group}}}, " if group else ""
        return f"{{ansible_connection: local, {tags}fleetops_az: {az}}}"

    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n"
        f"    a1: {host('gpu-a', 'us-east-1a')}\n"
        f"    a2: {host('gpu-a', 'us-east-1b')}\n"
        f"    a3: {host('gpu-a', 'us-east-1c')}\n"
        f"    b1: {host('gpu-b', 'us-east-1a')}\n"
        f"    c1: {host(None, 'us-east-1b')}\n"
    )
    request = dict(inventory=[inv], max_parallel="100%", per_group_max=None, canary=0)
    plan = api.plan(api.PlanRequest(action="replace", **request))  # type: ignore[arg-type]
    assert plan.document["batches"] == [["a1", "b1", "c1"], ["a2"], ["a3"]]
    assert plan.document["notes"][-1].startswith("2 host(s) moved to later batches: one replacement per Auto")
    reboot = api.plan(api.PlanRequest(action="reboot", **request))  # type: ignore[arg-type]
    assert [sorted(b) for b in reboot.document["batches"]] == [["a1", "a2", "a3", "b1", "c1"]]  # as planned
