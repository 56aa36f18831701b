"""The audit log: one JSON line per host change (time, operator, host, action, before, after, result)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.state import Rollout, state_home


def audit_path() -> Path:
    return Path(os.environ.get("FLEETOPS_AUDIT_LOG") or state_home() / "audit.jsonl")


def audit(rollout: Rollout, host: str, outcome: HostOutcome) -> None:
    """Append one line per host change: time, operator, host, action, before, after, result."""
    result = outcome.result or {}
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ts": time.time(),
        "operator": rollout.operator,
        "rollout": rollout.id,
        "host": host,
        "action": rollout.action,
        "apply": rollout.apply,
        "before": outcome.before if outcome.before is not None else result.get("before"),
        "after": outcome.after if outcome.after is not None else result.get("after"),
        "result": {
            k: v
            for k, v in (
                ("status", outcome.status),
                ("changed", outcome.changed),
                ("msg", outcome.msg),
                ("gate", outcome.gate),
            )
            if v is not None
        },
    }
    path = audit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(entry, default=str) + "\n")
