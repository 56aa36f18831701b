"""`fleetops scan`: run playbooks/scan.yml (one module call per host) and build the scan report.

The report is the JSON contract ``fleetops.scan/v1`` that every other command reads:
``{"schema", "hosts": {name: {"status", "findings", "facts", ...}}, "summary": {...}}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook

SCHEMA = "fleetops.scan/v1"
SCAN_PLAYBOOK = "fleetops.node.scan"
SCAN_ACTIONS = {"fleetops.node.node_health", "node_health"}
SEVERITIES = ("critical", "warning", "info")

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_HOSTS = 3


@dataclass
class ScanOptions:
    inventory: Sequence[Path] = ()
    limit: str | None = None
    checks: Sequence[str] | None = None
    sample_seconds: float = 0.0
    zombie_warning: int = 1000
    zombie_critical: int = 20000
    headroom_critical_pct: float = 20.0
    forks: int | None = None
    host_timeout: int = 120
    extravars: dict[str, Any] = field(default_factory=dict)

    def playbook_vars(self) -> dict[str, Any]:
        """Extra vars for playbooks/scan.yml (its documented knobs)."""
        xv: dict[str, Any] = {
            "fleetops_sample_seconds": self.sample_seconds,
            "fleetops_zombie_warning": self.zombie_warning,
            "fleetops_zombie_critical": self.zombie_critical,
            "fleetops_headroom_critical_pct": self.headroom_critical_pct,
            "fleetops_host_timeout": self.host_timeout,
        }
        if self.checks:
            xv["fleetops_checks"] = list(self.checks)
        xv.update(self.extravars)
        return xv


def host_entry(results: Sequence[TaskResult]) -> dict[str, Any]:
    """One host's part of the report, from its task results (the node_health call, or the failure)."""
    for tr in results:
        if tr.status == "unreachable":
            return {"status": "unreachable", "msg": tr.msg, "findings": [], "facts": {}}
    scan = next((tr for tr in results if tr.action in SCAN_ACTIONS), None)
    if scan is None:
        failed = next((tr for tr in results if tr.status == "failed"), None)
        msg = failed.msg if failed else "no scan result"
        return {"status": "failed", "msg": msg, "findings": [], "facts": {}}
    if scan.status == "failed":
        return {"status": "failed", "msg": scan.msg, "findings": [], "facts": {}}
    res = scan.result
    entry: dict[str, Any] = {
        "status": "ok",
        "findings": list(res.get("findings") or []),
        "facts": dict(res.get("facts") or {}),
        "errors": list(res.get("errors") or []),
        "checks": list(res.get("checks") or []),
    }
    if res.get("duration_ms") is not None:
        entry["duration_ms"] = res["duration_ms"]
    return entry


def build_report(run: PlaybookRun, *, started: float, finished: float) -> dict[str, Any]:
    hosts = {h: host_entry(run.results_for(h)) for h in sorted(run.hosts())}
    return {
        "schema": SCHEMA,
        "started_at": _iso(started),
        "duration_s": round(finished - started, 3),
        "hosts": hosts,
        "summary": summarize(hosts),
        **({"interrupted": True} if run.interrupted else {}),
    }


def summarize(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    findings = dict.fromkeys(SEVERITIES, 0)
    status = {"ok": 0, "unreachable": 0, "failed": 0}
    errors = 0
    for entry in hosts.values():
        status[entry["status"]] = status.get(entry["status"], 0) + 1
        errors += len(entry.get("errors") or [])
        for f in entry["findings"]:
            sev = f.get("severity", "info")
            findings[sev] = findings.get(sev, 0) + 1
    return {"hosts": len(hosts), **status, "findings": findings, "errors": errors}


def exit_code(report: dict[str, Any]) -> int:
    """3 if any host was unreachable/failed (or a detector could not run), else 1 on warning/critical, else 0."""
    s = report["summary"]
    if s["unreachable"] or s["failed"] or s.get("errors"):
        return EXIT_HOSTS
    if s["findings"].get("critical") or s["findings"].get("warning"):
        return EXIT_FINDINGS
    return EXIT_OK


def run_scan(
    opts: ScanOptions,
    on_host: Callable[[str, dict[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Scan every targeted host in one playbook run and return the report."""
    started = time.time()

    def on_result(tr: TaskResult) -> None:
        if on_host is not None and (tr.action in SCAN_ACTIONS or tr.status in ("unreachable", "failed")):
            on_host(tr.host, host_entry([tr]))

    run = run_playbook(
        RunnerOptions(
            playbook=SCAN_PLAYBOOK,
            inventory=opts.inventory,
            limit=opts.limit,
            extravars=opts.playbook_vars(),
            forks=opts.forks,
        ),
        on_result=on_result,
        cancel=cancel,
    )
    return build_report(run, started=started, finished=time.time())


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
