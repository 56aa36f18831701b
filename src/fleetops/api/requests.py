"""The library API's requests and results: what each verb takes and gives back, and their documents.

A request is built once, where the caller (the CLI) reads its options, and passed down. The caps every
rollout takes (``RolloutCaps``: how its batches are cut) and the limits it runs under
(``RolloutLimits``) are defined once here and shared by ``PlanRequest``, ``RemediationRequest`` and
``AutoRequest``; ``ScanRequest`` is a ``fleetops.scan.ScanOptions`` with where its outputs go.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fleetops.exitcodes import AUTO_FAIL_ON_DEFAULT, ExitCode, signal_exit_code
from fleetops.planner import MaxParallel, Plan
from fleetops.rollout import guards
from fleetops.rollout.budget import FailureBudget
from fleetops.rollout.lease import DEFAULT_SETTLE_S, DEFAULT_TTL_S
from fleetops.rollout.state import Rollout
from fleetops.util import PLAN_SCHEMA

if TYPE_CHECKING:  # fleetops.auto (the policy, pydantic) is imported only by the commands that run a pass
    from fleetops import auto as auto_mod

ROLLOUT_SCHEMA = "fleetops.rollout.engine/v1"


# ------------------------------------------------------------------------------------------ rollout caps


@dataclass(kw_only=True)
class RolloutCaps:
    """How a rollout's batches are cut: ``plan``, ``remediate`` and each action of ``auto`` take the same."""

    group_by: str | None = None  # hostvar; None: ec2_az, else fleetops_az
    max_parallel: MaxParallel | int | str = "10%"
    per_group_max: int | None = 1
    canary: int = 1


@dataclass(kw_only=True)
class RolloutLimits:
    """What a running rollout stops at or runs under: ``remediate``'s and each action of ``auto``'s."""

    max_failures: FailureBudget = field(default_factory=lambda: FailureBudget(count=0))
    # time limit of each remediation task on a host (seconds; None: the remediation's default)
    host_timeout: int | None = None
    # --max-unhealthy: None: the remediation's default (reboot: guards.DEFAULT_REBOOT_MAX_UNHEALTHY)
    max_unhealthy: guards.MaxUnhealthy | str | None = None
    not_after: datetime | None = None  # --not-after: no batch starts at or after it (aware)
    break_lock: bool | str = False  # True: any stale holder; a rollout id: only that one


def rollout_options(request: RolloutCaps | RolloutLimits) -> dict[str, Any]:
    """The request's caps and limits, as keywords of the next request they are handed to (each
    action of a ``remediate auto`` pass runs with its pass's)."""
    shared = [f.name for cls in (RolloutCaps, RolloutLimits) if isinstance(request, cls) for f in fields(cls)]
    return {name: getattr(request, name) for name in shared}


# ------------------------------------------------------------------------------------------ plan


@dataclass(kw_only=True)
class PlanRequest(RolloutCaps):
    """The hosts (inventory, limit) and the rollout's caps."""

    action: str = "remediation"
    inventory: Sequence[Path] = ()
    limit: str | None = None
    exclude: Sequence[str] = ()


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    group_by: str
    document: dict[str, Any]  # fleetops.plan/v1


def plan_document(action: str, result: Plan, group_by: str) -> dict[str, Any]:
    """The ``fleetops.plan/v1`` document."""
    return {
        "schema": PLAN_SCHEMA,
        "action": action,
        "batches": result.batches,
        "excluded": result.excluded,
        "caps": {
            "max_parallel": result.caps.max_parallel,
            "max_parallel_hosts": result.caps.max_parallel_hosts,
            "per_group_max": result.caps.per_group_max,
            "canary": result.caps.canary,
        },
        "lower_bound": result.lower_bound,
        "groups": result.groups,
        "group_by": group_by,
        "hosts": result.hosts,
        "notes": result.notes,
    }


# ------------------------------------------------------------------------------------------ rollouts


@dataclass(kw_only=True)
class RemediationRequest(PlanRequest, RolloutLimits):
    """A remediation (``action``: a key of ``REMEDIATIONS``) with its ``params`` and the rollout's options."""

    params: Mapping[str, Any] = field(default_factory=dict)
    apply: bool = False  # False: a dry run (check mode + diff)
    cooldown: float | None = None  # None: the remediation's default
    gate: bool = True
    preflight_max_unreachable: FailureBudget = field(default_factory=lambda: FailureBudget(count=0))
    preflight_timeout: float = 5.0
    state: Path | None = None  # None: under $FLEETOPS_STATE_DIR
    lease_ttl: float = DEFAULT_TTL_S
    lease_settle: float = DEFAULT_SETTLE_S
    ec2_lease: bool = True
    # exact host names to act on, among those ``limit`` selects (``remediate auto`` names its hosts
    # this way, never by a limit joined from them); None: every selected host
    hosts: Sequence[str] | None = None


@dataclass
class ResumeRequest:
    state: Path
    break_lock: bool | str = False
    # a new deadline / capacity floor for the rest (None: the saved ones); a rollout stopped by either
    # is continued knowingly with another
    not_after: datetime | None = None
    max_unhealthy: guards.MaxUnhealthy | str | None = None


@dataclass(frozen=True)
class RolloutResult:
    rollout: Rollout | None  # None: nothing to do (no host needed the remediation)
    document: dict[str, Any]  # fleetops.rollout.engine/v1
    exit_code: ExitCode

    def json(self) -> str:
        return json.dumps(self.document, indent=2, default=str)


def needs_reboot(rollout: Rollout) -> list[str]:
    """Hosts whose reclaim left zombies at or above its reboot threshold: the rolling reboot's input."""
    return sorted(
        host
        for host, outcome in rollout.results.items()
        if any(r.get("needs_reboot") for r in outcome.task_results())
    )


def report_document(rollout: Rollout) -> dict[str, Any]:
    """The ``fleetops.rollout.engine/v1`` report of a rollout (also `fleetops report STATE --format json`)."""
    results = {h: o.to_dict() for h, o in rollout.results.items()}
    return {
        "schema": ROLLOUT_SCHEMA,
        "id": rollout.id,
        "action": rollout.action,
        "apply": rollout.apply,
        "status": rollout.status,
        "operator": rollout.operator,
        "state": rollout.state_path if rollout.keep else None,  # a dry run saves none (Rollout.keep)
        "plan": rollout.plan,
        "max_failures": rollout.max_failures,
        "batches": [{**b, "results": {h: results.get(h) for h in b["hosts"]}} for b in rollout.batches],
        "hosts": rollout.hosts,
        "stopped": rollout.stopped,
        "needs_reboot": needs_reboot(rollout),
        "summary": rollout.summary(),
    }


def empty_document(action: str, apply: bool) -> dict[str, Any]:
    """The report of a rollout that had nothing to do."""
    return {"schema": ROLLOUT_SCHEMA, "action": action, "apply": apply, "plan": {"hosts": 0, "batches": []},
            "batches": [], "stopped": None, "summary": {"hosts": 0, "changed": 0, "done": 0, "failed": 0,
                                                        "pending": 0, "skipped": 0}}  # fmt: skip


def is_empty_document(document: Mapping[str, Any]) -> bool:
    """``document`` is ``empty_document``'s: the remediation found nothing to do."""
    return document == empty_document(str(document.get("action")), bool(document.get("apply")))


def rollout_exit_code(rollout: Rollout) -> ExitCode:
    """OK only when every host is done (verified): a failed, timed-out, preflight-skipped or
    unverified (still in doubt) host, or a stopped rollout, is FAILED; an interrupted one INTERRUPTED,
    or TERMINATED / HANGUP when a signal aborted it."""
    if rollout.status == "interrupted":
        return signal_exit_code((rollout.stopped or {}).get("signal"))
    s = rollout.summary()
    return (
        ExitCode.FAILED
        if (s["failed"] or s["skipped"] or s["pending"] or rollout.status != "done")
        else ExitCode.OK
    )


def rollout_result(rollout: Rollout) -> RolloutResult:
    return RolloutResult(rollout, report_document(rollout), rollout_exit_code(rollout))


@dataclass
class StopRolloutRequest:
    """``fleetops stop``: ask a running rollout (``rollout``; None: every rollout) to stop after its batch."""

    rollout: str | None
    reason: str = ""
    # an inventory with a fleetops.node.ec2 source: also tag the instances the rollout(s) lease, so a
    # rollout running on another controller stops too
    inventory: Sequence[Path] = ()
    clear: bool = False  # remove the stop request instead (this controller's file)


@dataclass(frozen=True)
class StopRolloutResult:
    lines: list[str]  # what was done, for the operator
    exit_code: ExitCode


@dataclass(frozen=True)
class StoreRequest:
    """``fleetops pause`` / ``unpause`` / ``store init`` / ``status`` / ``forget ENTRY``: on the shared store
    the inventory's fleetops.node.ec2 source names (``store_table``)."""

    inventory: Sequence[Path]
    verb: Literal["pause", "unpause", "init", "status", "forget"]
    reason: str = ""
    entry: str = ""  # forget: the journal record's id


@dataclass(frozen=True)
class StoreResult:
    lines: list[str]  # what was done or found, for the operator
    exit_code: ExitCode
    document: dict[str, Any]


@dataclass(frozen=True)
class LiftBrakeRequest:
    """``remediate auto --lift-brake RULE``: lift a storm brake, in the shared store when the inventory
    names one and in the state directory (None: <state home>/auto)."""

    rule: str
    inventory: Sequence[Path] = ()
    state_dir: Path | None = None
    reason: str = ""


# ------------------------------------------------------------------------------------------ auto


@dataclass(kw_only=True)
class AutoRequest(RolloutCaps, RolloutLimits):
    """One ``remediate auto`` pass: the policy (None: the default one), the hosts, and the caps and
    limits every action's rollout gets (as ``remediate <action>``'s options)."""

    policy: Path | None = None
    inventory: Sequence[Path] = ()
    limit: str | None = None
    apply: bool = False
    sample_seconds: float = 10.0  # the scan's two samples (growth rates, restart rates)
    state_dir: Path | None = None  # ladder.json and ledger.json (None: <state home>/auto)
    exclude: Sequence[str] = ()  # hosts the pass leaves alone (not decided, not acted on)
    ec2_tags: bool = True  # keep each EC2 host's ladder and budgets spent in its fleetops.io tags too
    # per action, parameters the operator sets for every pass (quarantine: kubectl, kubeconfig)
    action_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # why the pass runs (an alert, a ticket): in its document as "cause", and one audit line per pass
    cause: str | None = None
    # node_exporter's textfile: the pass's own state as gauges (fleetops.metrics.AUTO_GAUGES), for alerts
    prometheus: Path | None = None
    # a what-if: decide against this saved scan report (fleetops.scan/v1) and run nothing
    from_report: Path | None = None
    # what besides a failed pass makes the exit code non-zero (fleetops.exitcodes.AUTO_FAIL_ON): "human",
    # hosts that wait for a person (exit 1); "never" (default), nothing
    fail_on: str = AUTO_FAIL_ON_DEFAULT


@dataclass(frozen=True)
class AutoResult:
    result: auto_mod.PassResult
    document: dict[str, Any]  # fleetops.auto/v1
    exit_code: ExitCode

    def json(self) -> str:
        return json.dumps(self.document, indent=2, default=str)
