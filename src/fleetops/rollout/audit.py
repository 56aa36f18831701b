"""The audit log: one JSON line per host change (time, operator, host, action, before, after, result).

``before`` / ``after`` come from the modules' own results: a reboot's boot ids, set-env's variables
(``env_before`` / ``env_after``, values digested by the module unless ``--show-values``, and by
fleetops again as a net), disable-unit's and reclaim's ``before`` / ``after``; a remediation of
several steps (``fix``) lists each step's in ``steps``. A ``remediate auto`` pass
given a cause (``--cause``: the alert that started it) adds one line of its own (``audit_pass``). The
log is 0600 in a 0700 directory and
never followed through a symbolic link. When a line cannot be written the rollout must not go on
unaudited: :class:`AuditError` (exit 3) stops it, with its state saved as ``stopped``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetops.errors import FleetopsError
from fleetops.exitcodes import ExitCode
from fleetops.paths import state_home
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import Rollout, operator
from fleetops.util import open_append, private_dir, redact


class AuditError(FleetopsError):
    """The audit log could not be written: the rollout stops (state saved), exit 3."""

    exit_code = ExitCode.FAILED


def audit_path() -> Path:
    return Path(os.environ.get("FLEETOPS_AUDIT_LOG") or state_home() / "audit.jsonl")


def _step(result: dict[str, Any]) -> dict[str, Any] | None:
    """One module result's step: what it acted on, before and after; None when it did not run."""
    if result.get("skipped"):
        return None
    if "env_before" in result or "env_after" in result:
        step: dict[str, Any] = {
            "step": f"set-env {result.get('unit', '')}".strip(),
            "before": {"env": result.get("env_before")},
            "after": {"env": result.get("env_after")},
        }
        if result.get("restarted") is not None:
            step["after"]["restarted"] = result["restarted"]
    elif "before" in result or "after" in result:
        if "unit" in result:
            name = f"disable-unit {result['unit']}"
        elif "reclaimed" in result or "freed" in result or "needs_reboot" in result:
            name = "reclaim"
        else:
            name = "change"
        step = {"step": name, "before": result.get("before"), "after": result.get("after")}
    else:
        return None
    step["changed"] = bool(result.get("changed"))
    return step


def steps_of(outcome: HostOutcome) -> list[dict[str, Any]]:
    """Each change's before and after, from the module results (a loop task's items each)."""
    out: list[dict[str, Any]] = []
    for result in outcome.task_results():
        items = result.get("results") if isinstance(result.get("results"), list) else [result]
        for item in items or []:
            if isinstance(item, dict):
                step = _step(item)
                if step is not None:
                    out.append(step)
    return out


def entry_of(rollout: Rollout, host: str, outcome: HostOutcome) -> dict[str, Any]:
    """The audit line of one host change (secrets digested)."""
    steps = steps_of(outcome)
    before: Any = outcome.before
    after: Any = outcome.after
    if before is None and after is None and len(steps) == 1:
        before, after = steps[0]["before"], steps[0]["after"]
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ts": time.time(),
        "operator": rollout.operator,
        "rollout": rollout.id,
        "host": host,
        "action": rollout.action,
        "apply": rollout.apply,
        "before": before,
        "after": after,
    }
    if len(steps) > 1 or (steps and (outcome.before is not None or outcome.after is not None)):
        entry["steps"] = steps
    entry["result"] = {
        k: v
        for k, v in (
            ("status", outcome.status),
            ("changed", outcome.changed),
            ("msg", outcome.msg),
            ("gate", outcome.gate),
        )
        if v is not None
    }
    secrets = rollout.secret_values()
    for key in ("before", "after", "steps"):
        if key in entry:
            entry[key] = redact(entry[key], secrets)
    if "msg" in entry["result"]:
        entry["result"]["msg"] = redact(entry["result"]["msg"], secrets)
    return entry


def _stop_unaudited(rollout: Rollout, host: str, why: str) -> None:
    """Save the rollout as stopped (the rest pending) before AuditError ends it."""
    rollout.status = "stopped"
    rollout.stopped = {
        "after_batch": sum(1 for b in rollout.batches if b.get("finished")),
        "reason": f"the audit log could not be written ({why}): stopped rather than go on unaudited; "
        f"{host}'s change is in this state but not in the log",
        "pending": rollout.pending(),
    }
    with contextlib.suppress(OSError):  # the error says what matters; a resume finds the last state
        rollout.save()


def _append(path: Path, data: bytes) -> None:
    home = state_home()
    if path.parent == home or home in path.parent.parents:
        private_dir(home)
    private_dir(path.parent)
    fd = open_append(path)
    try:
        if data and os.write(fd, data) != len(data):
            raise OSError("short write")
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_writable() -> None:
    """Before a rollout that changes hosts: AuditError now when the audit log cannot be written, rather
    than after the first batch changed hosts unaudited."""
    path = audit_path()
    try:
        _append(path, b"")
    except OSError as exc:
        raise AuditError(
            f"Failed to open the audit log {path}: {exc.strerror or exc}; nothing was changed"
        ) from None


def audit(rollout: Rollout, host: str, outcome: HostOutcome) -> None:
    """Append one line per host change: time, operator, host, action, before, after, result.

    AuditError when the line cannot be written: the rollout is saved as stopped first."""
    line = json.dumps(entry_of(rollout, host, outcome), default=str) + "\n"
    path = audit_path()
    try:
        _append(path, line.encode("utf-8"))
    except OSError as exc:
        why = f"{path}: {exc.strerror or exc}"
        _stop_unaudited(rollout, host, why)
        raise AuditError(f"Failed to write the audit log {why}: rollout {rollout.id} stopped, state "
                         f"{rollout.state_path}") from None  # fmt: skip


def audit_event(event: str, who: str, **data: Any) -> None:
    """Append one line for a decision a person took that changes no host (a storm brake lifted): time,
    operator, event and its data. AuditError (exit 3) when it cannot be written: the caller changes
    nothing unaudited."""
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "operator": who,
        "event": event,
        **data,
    }
    path = audit_path()
    try:
        _append(path, (json.dumps(entry, default=str) + "\n").encode("utf-8"))
    except OSError as exc:
        raise AuditError(
            f"Failed to write the audit log {path}: {exc.strerror or exc}; nothing was changed"
        ) from None


def audit_pass(document: Mapping[str, Any], cause: str, limit: str | None) -> dict[str, Any]:
    """Append a ``remediate auto`` pass's own line (``"event": "auto_pass"``: its cause, limit, each
    host's decision and each action's rollout id, whose host lines say what changed) and return the
    pass's document with ``cause`` added. AuditError (exit 3) when the line cannot be written."""
    actions = [
        {
            "action": a.get("action"),
            "rollout": (a.get("rollout") or {}).get("id"),
            "hosts": a.get("hosts"),
            "done": a.get("done"),
            "exit_code": a.get("exit_code"),
        }
        for a in document.get("actions") or []
    ]
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ts": time.time(),
        "operator": operator(),
        "event": "auto_pass",
        "cause": cause,
        "limit": limit,
        "apply": document.get("apply"),
        "policy": document.get("policy"),
        "decisions": {d.get("host"): d.get("status") for d in document.get("decisions") or []},
        "actions": actions,
        "exit_code": document.get("exit_code"),
    }
    path = audit_path()
    try:
        _append(path, (json.dumps(entry, default=str) + "\n").encode("utf-8"))
    except OSError as exc:
        raise AuditError(
            f"Failed to write the audit log {path}: {exc.strerror or exc}: the pass (cause: {cause}) "
            "ran, but its own line is missing"
        ) from None
    return {**document, "cause": cause}
