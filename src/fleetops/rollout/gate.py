"""The batch gate: after a batch its hosts are scanned again and judged against their scan before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetops.ansible import facts
from fleetops.rollout.outcome import HostOutcome

# (host, its outcome, its scan entry before the rollout or None, its scan entry after, the rollout's
# extra vars) -> why it fails its gate, or None
GateCheck = Callable[[str, HostOutcome, dict[str, Any] | None, dict[str, Any], dict[str, Any]], str | None]


def _finding_key(f: dict[str, Any]) -> tuple[str, str]:
    data = f.get("data") or {}
    return (str(f.get("check")), str(data.get("unit") or data.get("pid") or ""))


def generic_gate(before: dict[str, Any] | None, after: dict[str, Any]) -> str | None:
    """The host answers the scan, and no critical finding appeared that was not there before."""
    if not facts.answered(after):  # ok, or partial (it answered; a check could not look fully)
        return f"gate: host {after.get('status', 'missing')} after the batch: {after.get('msg', '')}".rstrip(
            ": "
        )
    old = {_finding_key(f) for f in (before or {}).get("findings", []) if f.get("severity") == "critical"}
    new = [
        f for f in after.get("findings", []) if f.get("severity") == "critical" and _finding_key(f) not in old
    ]
    if new:
        return "gate: new critical finding: " + "; ".join(f.get("summary", "") for f in new)
    return None


def replacement_entry(outcome: HostOutcome) -> dict[str, Any]:
    """The scan entry of the host that replaced ``outcome``'s host, from the playbook's own scan of it
    (a ``node_health`` result among the outcome's task results): the old host is gone, so the gate
    cannot scan it; "missing" when the playbook did not scan the new host."""
    scans = [r for r in outcome.task_results() if "findings" in r and "facts" in r]
    if not scans:
        return {"status": "missing", "msg": "the playbook did not scan the new host"}
    return {"status": "ok", "findings": list(scans[-1].get("findings") or [])}


def judge(
    host: str,
    outcome: HostOutcome,
    before: dict[str, Any] | None,
    after: dict[str, Any],
    extravars: dict[str, Any],
    check: GateCheck | None,
) -> HostOutcome:
    """The outcome with its gate verdict: the generic gate, then the remediation's own check."""
    reason = generic_gate(before, after)
    if reason is None and check is not None:
        reason = check(host, outcome, before, after, extravars)
    return outcome.with_changes(gate=reason) if reason else outcome
