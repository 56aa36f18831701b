"""``fleetops pause`` / ``unpause`` / ``store status`` on a controller without a shared store: the pause in
this controller's state directory (``fleetops.rollout.pause``), audited in the audit log. With a store,
``fleetops.api.store`` pauses there; ``unpause`` and ``status`` read this controller's pause as well (one
set before the store was configured still holds this controller)."""

from __future__ import annotations

from fleetops.api.requests import StoreResult
from fleetops.exitcodes import ExitCode
from fleetops.rollout.audit import audit_event
from fleetops.rollout.pause import local_pause, pause_here, pause_path, reason_line, unpause_here
from fleetops.rollout.state import operator

ONLY_HERE = (
    "on this controller only (the inventory names no shared store: other controllers and AWX jobs are "
    "not held; see 'The shared store')"
)


def pause_local(reason: str) -> StoreResult:
    who = operator()
    current = local_pause()
    if current is not None:
        return StoreResult([current.describe() + " (already)"], ExitCode.OK, _document(current))
    audit_event("pause", who, reason=reason_line(reason), scope=str(pause_path()))  # audited before it holds
    record, _ = pause_here(who, reason)
    line = (
        f"{record.describe()}: {ONLY_HERE}; its running rollouts stop after their current batch and its "
        "auto passes act on nothing until 'fleetops unpause'"
    )
    return StoreResult([line], ExitCode.OK, _document(record))


def unpause_local(reason: str) -> list[str]:
    """Lift this controller's pause (audited); what was done, in a line, or nothing when there was none."""
    current = local_pause()
    if current is None:
        return []
    who = operator()
    audit_event("unpause", who, reason=reason_line(reason), scope=str(pause_path()))
    lifted = unpause_here()
    return [f"pause on this controller lifted by {who} ({(lifted or current).describe()})"]


def status_local() -> StoreResult:
    current = local_pause()
    line = f"{current.describe()} ({ONLY_HERE})" if current else "automation is not paused on this controller"
    return StoreResult([line], ExitCode.PAUSED if current else ExitCode.OK, _document(current))


def _document(record: object) -> dict[str, object]:
    return {"store": None, "pause_file": str(pause_path()), "paused": vars(record) if record else None}
