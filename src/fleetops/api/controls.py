"""The library's verbs that steer automation rather than run it: ``stop`` (the kill switch), ``store``
(the shared store's pause, status, init and journal, or this controller's pause without one) and
``lift_brake`` (a storm brake). ``fleetops.api`` exports them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleetops import paths
from fleetops.api.requests import (
    LiftBrakeRequest,
    StopRolloutRequest,
    StopRolloutResult,
    StoreRequest,
    StoreResult,
)
from fleetops.api.scan_types import auto_state_dir
from fleetops.api.selection import shared_store as open_store
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.rollout.lease import connection_for
from fleetops.rollout.state import operator

# ------------------------------------------------------------------------------------------ stop


def stop(request: StopRolloutRequest) -> StopRolloutResult:
    """Write the kill switch (``fleetops.rollout.killswitch``): a stop file on this controller and,
    with an EC2 inventory, the ``fleetops:stop`` tag on the leased instances. Each running rollout
    asks before every batch, stops after its current one (exit 3) and says who stopped it and why."""
    from fleetops.rollout import killswitch
    from fleetops.rollout.state import operator

    scope = request.rollout if request.rollout is not None else "every running rollout"
    if request.clear:
        removed = killswitch.clear_stop(request.rollout)
        line = (
            f"stop request for {scope} removed"
            if removed
            else f"no stop request for {scope} on this controller"
        )
        return StopRolloutResult([line], ExitCode.OK)
    who = operator()
    reason = request.reason.strip() or "no reason given"
    path = killswitch.request_stop(request.rollout, reason, who)
    lines = [f"stop requested for {scope} by {who}: {reason} ({path}); it stops after its current batch"]
    if request.inventory:
        lines += _stop_ec2(request.rollout, reason, who, paths.resolve_inventories(request.inventory))
    return StopRolloutResult(lines, ExitCode.OK)


def _stop_ec2(rollout: str | None, reason: str, who: str, inventories: Sequence[Path]) -> list[str]:
    from fleetops.ansible.collection import module_utils
    from fleetops.rollout import killswitch

    connection = connection_for(inventories)
    if connection is None:
        return ["no fleetops.node.ec2 inventory source: no EC2 stop tag written"]
    aws = module_utils("aws")
    settings = connection.settings()
    lines: list[str] = []
    session = aws.session(settings)
    for region in connection.regions or ("us-east-1",):
        client = aws.client(settings, "ec2", region, aws_session=session, user_agent="fleetops.stop")

        def call(op: str, func: Callable[[], Any], region: str = region) -> Any:
            return aws.call(settings, op, region, func)

        try:
            written = killswitch.request_stop_ec2(client, rollout, reason, who, call=call)
        except aws.AwsError as exc:
            raise killswitch.KillSwitchError(f"Failed to tag the stop on EC2 ({region}): {exc}") from None
        if written.instances:
            lines.append(
                f"EC2 {region}: {killswitch.STOP_TAG} tagged on {len(written.instances)} leased instance(s)"
            )
        else:
            lines.append(f"EC2 {region}: no instance leased by {rollout or 'any rollout'}")
    return lines


# ------------------------------------------------------------------------------------------ store


def store(request: StoreRequest) -> StoreResult:
    """The shared store (``fleetops.store``): ``pause`` (every rollout stops after its batch, no auto
    pass acts), ``unpause``, ``init`` (create the table), ``status`` (with the journal's open records;
    it sweeps stale lease items) or ``forget`` (close a journal record: ``fleetops.journal``). Without a
    store, ``pause``, ``unpause`` and ``status`` are this controller's pause (``fleetops.api.pause``).
    UsageError (exit 2) when the inventory names no store for ``init`` or ``forget``, or ``forget`` lacks
    its entry or reason."""
    from fleetops import journal
    from fleetops.api import pause as here

    if request.verb == "forget" and not (request.entry.strip() and request.reason.strip()):
        raise UsageError("fleetops store forget ENTRY --reason TEXT: both the entry and why are required")
    if request.entry and request.verb != "forget":
        raise UsageError(f"fleetops store {request.verb} takes no ENTRY (only 'forget' does)")
    inventories = paths.resolve_inventories(request.inventory)
    found = open_store(inventories)
    if found is None and request.verb in ("pause", "unpause", "status"):  # this controller's pause alone
        if request.verb == "pause":
            return here.pause_local(request.reason)
        if request.verb == "unpause":
            lines = here.unpause_local(request.reason) or ["automation was not paused"]
            return StoreResult(lines, ExitCode.OK, here.status_local().document)
        return here.status_local()
    if found is None:
        raise UsageError(
            "no shared store: the inventory's fleetops.node.ec2 source sets no store_table "
            "(or FLEETOPS_STORE_TABLE); see docs/guides/ladder.md, 'The shared store'"
        )
    who = operator()
    if request.verb == "init":
        found.ready()
        return StoreResult([f"shared store ready: {found.where()}"], ExitCode.OK, {"store": found.where()})
    if request.verb == "pause":
        record, new = found.pause(who, request.reason)
        line = record.describe() + (
            ": running rollouts stop after their current batch; no auto pass acts until 'fleetops unpause'"
            if new
            else " (already)"
        )
        return StoreResult([line], ExitCode.OK, {"store": found.where(), "paused": vars(record)})
    if request.verb == "unpause":
        lifted = found.unpause(who, request.reason)
        line = f"pause lifted by {who} ({lifted.describe()})" if lifted else "automation was not paused"
        return StoreResult(
            [line, *here.unpause_local(request.reason)], ExitCode.OK, {"store": found.where(), "paused": None}
        )
    if request.verb == "forget":
        line = journal.forget(found, request.entry, who, request.reason)
        return StoreResult([line], ExitCode.OK, {"store": found.where(), "forgotten": request.entry})
    found.check_clock()
    pause = found.paused()
    local = here.status_local()
    lines = [f"shared store: {found.where()}", pause.describe() if pause else "automation is not paused"]
    held_here = local.exit_code == ExitCode.PAUSED
    if held_here:
        lines += local.lines
    now = time.time()
    lines += journal.sweep(found, now) + journal.open_records(found)
    leases = found.rollout_leases(now)
    for record, instances in leases:
        lines.append(f"lease: {record.describe(now)}: {len(instances)} instance(s) {' '.join(instances[:5])}"
                     + (" ..." if len(instances) > 5 else ""))  # fmt: skip
    return StoreResult(
        lines,
        ExitCode.PAUSED if pause or held_here else ExitCode.OK,
        {
            "store": found.where(),
            "paused": vars(pause) if pause else local.document["paused"],
            "skew_s": found.backend.skew,
            "leases": [{**record.as_dict(now), "instances": instances} for record, instances in leases],
        },
    )


def lift_brake(request: LiftBrakeRequest) -> StoreResult:
    """Lift the storm brake on a rule: in the shared store (when the inventory names one) and in the
    state directory; audited (the audit log, and the store's). UsageError for a rule the brake never
    names (no such brake anywhere)."""
    from fleetops import auto as auto_mod
    from fleetops.rollout.audit import audit_event

    who = operator()
    state_dir = auto_state_dir(request.state_dir)
    shared = open_store(paths.resolve_inventories(request.inventory)) if request.inventory else None
    audit_event("lift-brake", who, rule=request.rule, reason=request.reason or "no reason given")
    where = []
    if shared is not None and shared.lift_brake(request.rule, who, request.reason):
        where.append(shared.where())
    if auto_mod.lift_brake(state_dir, request.rule):
        where.append(str(state_dir))
    if not where:
        raise UsageError(f"no storm brake on rule {request.rule!r} (nothing lifted)")
    return StoreResult(
        [f"storm brake on rule {request.rule} lifted by {who} ({', '.join(where)})"],
        ExitCode.OK,
        {"rule": request.rule, "lifted": where},
    )
