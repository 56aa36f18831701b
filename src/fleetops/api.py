"""The library API: what the CLI, the demo, AWX-side code and tests call.

Typed requests in, typed results out; nothing here parses a command line or renders anything.
Progress goes to callbacks (``on_host`` for scans) or a ``RolloutObserver`` (rollouts); errors are
``FleetopsError`` subclasses whose ``exit_code`` is an ``ExitCode``.

- ``scan(ScanRequest) -> ScanResult``: one node_health call per host, the ``fleetops.scan/v1`` report.
- ``plan(PlanRequest) -> PlanResult``: the batches a rollout would run (``fleetops.plan/v1``).
- ``remediate(RemediationRequest) -> RolloutResult``: a remediation, batch by batch.
- ``resume(ResumeRequest) -> RolloutResult``: continue a saved rollout.
- ``report(path) -> RolloutResult``: a saved rollout's report (``fleetops.rollout.engine/v1``).
- ``auto(AutoRequest) -> AutoResult``: one ``remediate auto`` pass of a policy (``fleetops.auto/v1``).
- ``drift(DriftRequest) -> DriftResult``: the facts that differ between hosts (``fleetops.drift/v1``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fleetops import auto as auto_mod
from fleetops import paths
from fleetops.ansible import facts
from fleetops.ansible.inventory import (
    DEFAULT_GROUP_VARS,
    InventoryHost,
    load_hosts,
    load_targets,
)
from fleetops.errors import Signalled, UsageError
from fleetops.exitcodes import ExitCode, signal_exit_code
from fleetops.planner import MaxParallel, Plan
from fleetops.planner import plan as plan_batches
from fleetops.policy import SPENT_TAG_KEY, TAG_KEY, Policy, default_policy_path, load_policy
from fleetops.remediations import REMEDIATIONS, Remediation
from fleetops.remediations import get as get_remediation
from fleetops.rollout import guards
from fleetops.rollout.audit import ensure_writable as ensure_audit_writable
from fleetops.rollout.batch import NOT_IN_INVENTORY, InventoryScanner, PlaybookBatchRunner
from fleetops.rollout.budget import FailureBudget
from fleetops.rollout.engine import GUARDS_KEY, HOST_TIMEOUT_VAR, Engine, NullObserver, RolloutObserver
from fleetops.rollout.lease import DEFAULT_SETTLE_S, DEFAULT_TTL_S, connection_for, lease_targets
from fleetops.rollout.locks import locked
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.preflight import preflight
from fleetops.rollout.state import (
    HOST_DONE,
    HOST_FAILED,
    HOST_PENDING,
    HOST_RUNNING,
    HOST_SKIPPED,
    Rollout,
    RolloutError,
    new_rollout,
    state_home,
)
from fleetops.scan import PartialReport, ScanOptions, run_scan, write_report
from fleetops.util import PLAN_SCHEMA, check_writable

__all__ = [
    "REMEDIATIONS",
    "AutoRequest",
    "AutoResult",
    "DriftRequest",
    "DriftResult",
    "ExitCode",
    "FailureBudget",
    "MaxParallel",
    "PlanRequest",
    "PlanResult",
    "RemediationRequest",
    "ResumeRequest",
    "RolloutObserver",
    "RolloutResult",
    "ScanRequest",
    "ScanResult",
    "StopRolloutRequest",
    "StopRolloutResult",
    "auto",
    "drift",
    "plan",
    "remediate",
    "report",
    "resume",
    "scan",
    "stop",
]

ROLLOUT_SCHEMA = "fleetops.rollout.engine/v1"
STOP_MESSAGE = "stopping after the current batch; Ctrl-C again to abort now"
OnHost = Callable[[str, dict[str, Any]], None]


# ------------------------------------------------------------------------------------------ scan


@dataclass
class ScanRequest:
    """What to scan and how. Thresholds left None are the detector's defaults (memcg.DEFAULT_THRESHOLDS)."""

    inventory: Sequence[Path] = ()  # empty: this checkout's localhost inventory
    limit: str | None = None
    checks: Sequence[str] | None = None
    sample_seconds: float | None = None  # None: node_health's default (one sample)
    zombie_warning: int | None = None
    zombie_critical: int | None = None
    headroom_critical_pct: float | None = None
    forks: int | None = None
    host_timeout: int = 120
    extravars: dict[str, Any] = field(default_factory=dict)
    unit_allowlist: Path | None = None  # a file of unit-name patterns (fleetops_unit_allowlist)
    output: Path | None = None  # also write the JSON report here (FILE.partial meanwhile)
    prometheus: Path | None = None  # also write node_exporter textfile metrics here


@dataclass(frozen=True)
class ScanResult:
    report: dict[str, Any]  # fleetops.scan/v1
    exit_code: ExitCode

    @property
    def interrupted(self) -> bool:
        return bool(self.report.get("interrupted"))

    def json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=False)


def scan(
    request: ScanRequest, on_host: OnHost | None = None, cancel: threading.Event | None = None
) -> ScanResult:
    """Scan the hosts; ``on_host`` sees each host's entry as it answers; ``cancel`` stops the scan,
    keeping what has arrived (exit code INTERRUPTED)."""
    from fleetops.scan import exit_code

    warning = facts.zombie_warning_default() if request.zombie_warning is None else request.zombie_warning
    critical = facts.zombie_critical_default() if request.zombie_critical is None else request.zombie_critical
    if warning > critical:
        raise UsageError(f"--zombie-warning ({warning}) must not exceed --zombie-critical ({critical})")
    inventories = paths.resolve_inventories(request.inventory)
    for inv in inventories:
        if not inv.exists():
            raise UsageError(f"inventory not found: {inv}")
    for out_path in (request.output, request.prometheus):
        why = check_writable(out_path) if out_path is not None else None
        if why:
            raise UsageError(f"cannot write {out_path}: {why}")
    _check_targets(inventories, request.limit)
    opts = ScanOptions(
        inventory=inventories,
        limit=request.limit,
        checks=list(request.checks) if request.checks else None,
        # None: the module's default (only what the caller set reaches the playbook)
        sample_seconds=request.sample_seconds,
        zombie_warning=request.zombie_warning,
        zombie_critical=request.zombie_critical,
        headroom_critical_pct=request.headroom_critical_pct,
        forks=request.forks,
        host_timeout=request.host_timeout,
        extravars=dict(request.extravars),
    )
    if request.unit_allowlist is not None:
        from fleetops.drift import load_unit_allowlist

        opts.extravars["fleetops_unit_allowlist"] = load_unit_allowlist(request.unit_allowlist)
    output = request.output
    partial = PartialReport(output.with_name(output.name + ".partial")) if output is not None else None

    def seen(host: str, entry: dict[str, Any]) -> None:
        if partial is not None:
            partial.add(host, entry)
        if on_host is not None:
            on_host(host, entry)

    try:
        report_ = run_scan(opts, on_host=seen, cancel=cancel)
    finally:
        if partial is not None:
            partial.close(done=False)  # kept until the final report is written
    if report_["summary"]["hosts"] == 0 and not report_.get("interrupted"):
        if partial is not None:
            partial.close(done=True)
        raise UsageError("no hosts matched the inventory and limit")
    result = ScanResult(report_, ExitCode.INTERRUPTED if report_.get("interrupted") else exit_code(report_))
    if output is not None:
        write_report(output, result.json() + "\n")
        if partial is not None:
            partial.close(done=True)
    if request.prometheus is not None:
        from fleetops.metrics import write_textfile

        write_textfile(report_, request.prometheus)
    return result


# ------------------------------------------------------------------------------------------ plan


@dataclass
class PlanRequest:
    """The hosts (inventory, limit) and the rollout's caps."""

    action: str = "remediation"
    inventory: Sequence[Path] = ()
    limit: str | None = None
    group_by: str | None = None  # hostvar; None: ec2_az, else fleetops_az
    max_parallel: MaxParallel | int | str = "10%"
    per_group_max: int | None = 1
    canary: int = 1
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


def _selection(inventories: Sequence[Path], limit: str | None) -> str:
    """What selected the hosts, for ``guards.require_targets``' message."""
    if limit:
        return f"--limit {limit!r}"
    return "the inventory " + " ".join(str(p) for p in inventories)


def _targets(inventories: Sequence[Path], limit: str | None, group_by: str | None) -> list[InventoryHost]:
    """The hosts ``limit`` selects, refused (UsageError) when there are none or a name is not
    targeted exactly by a ``--limit`` (``guards.check_target_names``)."""
    found = load_targets(inventories, limit, group_by)
    guards.require_targets([h.name for h in found.hosts], _selection(inventories, limit))
    guards.check_target_names([h.name for h in found.hosts], found.groups)
    return found.hosts


def _check_targets(inventories: Sequence[Path], limit: str | None) -> None:
    _targets(inventories, limit, None)


def _plan_hosts(request: PlanRequest, hosts: Sequence[InventoryHost]) -> PlanResult:
    guards.require_targets([h.name for h in hosts], "the selection")
    max_parallel = request.max_parallel
    if not isinstance(max_parallel, MaxParallel):
        max_parallel = MaxParallel.parse(str(max_parallel))
    result = plan_batches(
        hosts,
        max_parallel=max_parallel,
        per_group_max=request.per_group_max,
        canary=request.canary,
        exclude=list(request.exclude),
    )
    group_by = request.group_by or "|".join(DEFAULT_GROUP_VARS)
    return PlanResult(result, group_by, plan_document(request.action, result, group_by))


def plan(request: PlanRequest) -> PlanResult:
    """Load the targeted hosts and plan them with the request's caps (changes nothing)."""
    inventories = paths.resolve_inventories(request.inventory)
    return _plan_hosts(request, _targets(inventories, request.limit, request.group_by))


# ------------------------------------------------------------------------------------------ rollouts


@dataclass
class RemediationRequest(PlanRequest):
    """A remediation (``action``: a key of ``REMEDIATIONS``) with its ``params`` and the rollout's options."""

    params: Mapping[str, Any] = field(default_factory=dict)
    apply: bool = False  # False: a dry run (check mode + diff)
    max_failures: FailureBudget = field(default_factory=lambda: FailureBudget(count=0))
    cooldown: float | None = None  # None: the remediation's default
    gate: bool = True
    preflight_max_unreachable: FailureBudget = field(default_factory=lambda: FailureBudget(count=0))
    preflight_timeout: float = 5.0
    state: Path | None = None  # None: under $FLEETOPS_STATE_DIR
    break_lock: bool | str = False  # True: any stale holder; a rollout id: only that one
    lease_ttl: float = DEFAULT_TTL_S
    lease_settle: float = DEFAULT_SETTLE_S
    ec2_lease: bool = True
    # time limit of each remediation task on a host (seconds; None: the remediation's default)
    host_timeout: int | None = None
    # --max-unhealthy: None: the remediation's default (reboot: guards.DEFAULT_REBOOT_MAX_UNHEALTHY)
    max_unhealthy: guards.MaxUnhealthy | str | None = None
    not_after: datetime | None = None  # --not-after: no batch starts at or after it (aware)
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
        "state": rollout.state_path,
        "plan": rollout.plan,
        "max_failures": rollout.max_failures,
        "batches": [{**b, "results": {h: results.get(h) for h in b["hosts"]}} for b in rollout.batches],
        "hosts": rollout.hosts,
        "stopped": rollout.stopped,
        "needs_reboot": needs_reboot(rollout),
        "summary": rollout.summary(),
    }


def _empty_document(action: str, apply: bool) -> dict[str, Any]:
    return {"schema": ROLLOUT_SCHEMA, "action": action, "apply": apply, "plan": {"hosts": 0, "batches": []},
            "batches": [], "stopped": None, "summary": {"hosts": 0, "changed": 0, "done": 0, "failed": 0,
                                                        "pending": 0, "skipped": 0}}  # fmt: skip


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


def _result(rollout: Rollout) -> RolloutResult:
    return RolloutResult(rollout, report_document(rollout), rollout_exit_code(rollout))


def _start(
    request: RemediationRequest, remediation: Remediation, observer: RolloutObserver
) -> Rollout | None:
    inventories = paths.resolve_inventories(request.inventory)
    params = remediation.resolve(request.params)
    extravars = remediation.extravars(params)
    limit = request.limit
    # every selected name is checked before anything runs (``fix`` scans first); a step before
    # planning narrows the selection by exact names, never by a limit joined from them
    hosts = _targets(inventories, limit, request.group_by)
    if request.hosts is not None:
        named = set(request.hosts)
        unknown = sorted(named - {h.name for h in hosts})
        if unknown:
            raise UsageError(
                f"remediate {remediation.name}: host(s) outside the selection: {' '.join(unknown)}"
            )
        guards.require_targets(sorted(named), "the hosts named")
        hosts = [h for h in hosts if h.name in named]
    if remediation.prepare is not None:
        extravars, targets = remediation.prepare(params, inventories, limit, observer.message)
        if targets is not None:
            if not targets:
                return None
            wanted = set(targets)
            if request.hosts is not None:  # the step saw the whole selection: keep the hosts named
                wanted &= set(request.hosts)
                if not wanted:
                    return None
            unknown = sorted(wanted - {h.name for h in hosts})
            if unknown:
                raise UsageError(
                    f"remediate {remediation.name}: its plan names host(s) outside the selection: {' '.join(unknown)}"
                )
            hosts = [h for h in hosts if h.name in wanted]
    if extravars.get("fleetops_kube_drain") or remediation.name in ("quarantine", "unquarantine"):
        for target in hosts:
            node = target.hostvars.get("k8s_node_name") or target.name
            guards.check_k8s_node_name(str(node), target.name)
    reasons: dict[str, str | None] = {}
    exclude = list(request.exclude)
    if request.apply:
        reasons = preflight(hosts, timeout=request.preflight_timeout, inventory=inventories)
        down = {h: why for h, why in reasons.items() if why}
        for host, why in down.items():
            observer.message(f"preflight: {host}: {why}", "warning")
        allowed = request.preflight_max_unreachable.tolerated(len(hosts))
        if len(down) > allowed:
            raise RolloutError(
                f"Failed to start the rollout: preflight found {len(down)} of {len(hosts)} host(s) unreachable, "
                f"more than the {allowed} allowed (--preflight-max-unreachable); nothing was changed"
            )
        if down:
            exclude += list(down)
            observer.message(
                f"preflight: leaving out {len(down)} unreachable host(s); {len(hosts) - len(down)} ok"
            )
    planned = _plan_hosts(
        PlanRequest(
            action=remediation.name,
            group_by=request.group_by,
            max_parallel=request.max_parallel,
            per_group_max=request.per_group_max,
            canary=request.canary,
            exclude=exclude,
        ),
        hosts,
    )
    rollout = new_rollout(
        action=remediation.name,
        apply=request.apply,
        inventory=inventories,
        extravars=extravars,
        plan=planned.document,
        max_failures=request.max_failures.tolerated(planned.plan.hosts),
        cooldown=remediation.cooldown if request.cooldown is None else request.cooldown,
        gate=request.gate,
        state_path=request.state,
    )
    rollout.preflight = reasons
    _set_guards(rollout, request, remediation, hosts)
    if "fleetops_kube_drain" in rollout.extravars or remediation.name == "quarantine":
        rollout.extravars["fleetops_rollout"] = rollout.id  # the node annotation names who cordoned it
    if request.apply and request.ec2_lease:
        instances = lease_targets(h for h in hosts if h.name in rollout.hosts)
        if instances and connection_for(inventories) is not None:
            rollout.lease = {"ttl": request.lease_ttl, "settle": request.lease_settle, "instances": instances}
    for host, reason in reasons.items():
        if reason:
            rollout.hosts[host] = HOST_SKIPPED
            rollout.results[host] = HostOutcome(status="skipped", msg=f"preflight: {reason}")
    return rollout


def _set_guards(
    rollout: Rollout, request: RemediationRequest, remediation: Remediation, hosts: Sequence[InventoryHost]
) -> None:
    """The guards' settings, kept in the rollout (``engine.GUARDS_KEY``) so a resume keeps them."""
    limit = request.max_unhealthy if request.max_unhealthy is not None else remediation.max_unhealthy
    if isinstance(limit, str):
        limit = guards.MaxUnhealthy.parse(limit)
    rollout.plan[GUARDS_KEY] = {
        "max_unhealthy": None if limit is None else str(limit),
        "not_after": None if request.not_after is None else request.not_after.isoformat(),
        "group_of": {h.name: h.group for h in hosts},
    }
    timeout = remediation.host_timeout if request.host_timeout is None else request.host_timeout
    rollout.extravars[HOST_TIMEOUT_VAR] = remediation.check_host_timeout(timeout, rollout.extravars)


@contextlib.contextmanager
def _ctrl_c(engine: Engine, observer: RolloutObserver) -> Iterator[None]:
    """First Ctrl-C: finish the running batch, then stop (state saved). Second: abort the batch now.

    SIGTERM and SIGHUP abort at once, as a second Ctrl-C does (exit 143 / 129): the batch's ansible
    run is cancelled, its hosts stay ``running`` for a resume to probe, the state is saved and the
    lock and lease released."""
    aborting = False

    def terminate(signum: int, frame: object) -> None:
        nonlocal aborting
        if aborting:
            return
        aborting = True
        name = signal.Signals(signum).name
        engine.abort(f"aborted mid-batch ({name})", signum)
        observer.message(f"{name}: aborting now; the state is saved for --resume", "warning")
        raise KeyboardInterrupt

    def handler(signum: int, frame: object) -> None:
        nonlocal aborting
        if aborting:
            return  # already aborting: let the state be saved
        if engine.stop_requested.is_set():
            aborting = True
            engine.abort()
            raise KeyboardInterrupt
        engine.request_stop()
        observer.message(STOP_MESSAGE, "warning")

    with _signal_handlers({signal.SIGINT: handler, signal.SIGTERM: terminate, signal.SIGHUP: terminate}):
        yield


@contextlib.contextmanager
def _signal_handlers(handlers: Mapping[int, Callable[[int, Any], None]]) -> Iterator[None]:
    """Install ``handlers`` (signal -> handler) for the block and give the previous ones back after; in
    a thread other than the main one (where Python refuses handlers) install nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in handlers}
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _leave_out_gone(rollout: Rollout, present: frozenset[str], observer: RolloutObserver) -> None:
    """Hosts a resume would still act on (pending, caught mid-batch, failed) that the inventory no
    longer lists are left out (skipped, never exit 0): no limit can reach them, and a host missing from
    a limit is not an error ansible reports. Done hosts stay done (a replaced instance is gone)."""
    gone = [
        h for h, s in rollout.hosts.items()
        if s in (HOST_PENDING, HOST_RUNNING, HOST_FAILED) and h not in present
    ]  # fmt: skip
    for host in gone:
        rollout.hosts[host] = HOST_SKIPPED
        previous = rollout.results.get(host)
        rollout.results[host] = HostOutcome(
            status="skipped",
            before=previous.before if previous is not None else None,
            msg=f"resume: {NOT_IN_INVENTORY}: left out, not touched",
        )
        observer.message(f"resume: {host} is {NOT_IN_INVENTORY}: left out, not touched", "warning")
    if gone:
        rollout.save()


def _execute(
    rollout: Rollout,
    remediation: Remediation,
    observer: RolloutObserver,
    break_lock: bool | str,
    handle_signals: bool,
) -> Rollout:
    inventory = [Path(p) for p in rollout.inventory]
    # A resume's hosts are checked again: groups may have come since, hosts may have gone.
    listing = load_targets(inventory)
    groups, present = listing.groups, frozenset(h.name for h in listing.hosts)
    _leave_out_gone(rollout, present, observer)
    targets = [h for h, s in rollout.hosts.items() if s != HOST_SKIPPED]
    guards.check_target_names(targets, groups)
    if rollout.apply:
        ensure_audit_writable()  # never change a host unaudited (AuditError, exit 3, nothing changed)
    with locked(rollout, targets, break_lock, say=lambda line: observer.message(line, "dim")) as held:
        engine = Engine(
            rollout=rollout,
            actions=remediation.actions,
            runner=PlaybookBatchRunner(remediation.playbook, inventory),
            scanner=InventoryScanner(inventory, groups, present),
            observer=observer,
            gate_check=remediation.gate,
            probe_vars=remediation.probe_vars,
            replaces_host=remediation.replaces_host,
            post_vars=remediation.post_vars(rollout.extravars) if remediation.post_vars else None,
            guard=held.guard,
            ec2_stop=held.ec2_stop,
        )
        if rollout.apply:
            observer.message(f"rollout {rollout.id}: state {rollout.state_path}", "dim")
        with _ctrl_c(engine, observer) if handle_signals else contextlib.nullcontext():
            return engine.run()


def remediate(
    request: RemediationRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> RolloutResult:
    """Plan and run a remediation batch by batch (a dry run unless ``request.apply``).

    ``handle_signals``: in the main thread, Ctrl-C stops after the current batch and a second one
    aborts it (the state is saved either way; exit code INTERRUPTED).
    """
    obs = observer if observer is not None else NullObserver()
    remediation = get_remediation(request.action)
    rollout = _start(request, remediation, obs)
    if rollout is None:
        obs.message("nothing to do: no host has a finding this remediation acts on")
        return RolloutResult(None, _empty_document(remediation.name, request.apply), ExitCode.OK)
    return _result(_execute(rollout, remediation, obs, request.break_lock, handle_signals))


# ------------------------------------------------------------------------------------------ auto


@dataclass
class AutoRequest:
    """One ``remediate auto`` pass: the policy (None: the default one), the hosts, and the caps every
    action's rollout gets (as ``remediate <action>``'s options)."""

    policy: Path | None = None
    inventory: Sequence[Path] = ()
    limit: str | None = None
    apply: bool = False
    sample_seconds: float = 10.0  # the scan's two samples (growth rates, restart rates)
    state_dir: Path | None = None  # ladder.json and ledger.json (None: <state home>/auto)
    group_by: str | None = None
    max_parallel: MaxParallel | int | str = "10%"
    per_group_max: int | None = 1
    canary: int = 1
    exclude: Sequence[str] = ()  # hosts the pass leaves alone (not decided, not acted on)
    max_failures: FailureBudget = field(default_factory=lambda: FailureBudget(count=0))
    host_timeout: int | None = None
    max_unhealthy: guards.MaxUnhealthy | str | None = None
    not_after: datetime | None = None
    ec2_tags: bool = True  # keep each EC2 host's ladder and budgets spent in its fleetops.io tags too
    # per action, parameters the operator sets for every pass (quarantine: kubectl, kubeconfig)
    action_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    break_lock: bool | str = False


@dataclass(frozen=True)
class AutoResult:
    result: auto_mod.PassResult
    document: dict[str, Any]  # fleetops.auto/v1
    exit_code: ExitCode

    def json(self) -> str:
        return json.dumps(self.document, indent=2, default=str)


class _PassSignals:
    """SIGTERM and SIGHUP during a ``remediate auto`` pass (``handler``): they raise ``Signalled``
    (exit 143 / 129) instead of killing the process, so a pass stopped outside a rollout (its scan,
    between two actions) still saves what it attempted. Only the first is raised; later ones are
    ignored while the state is saved. Inside ``held()`` (the commit) a signal waits until the block is
    done, then is raised: the ladder, the ledger and the tags are written together or not at all.
    Inside a rollout, ``_ctrl_c``'s handlers take over (and give these back after)."""

    def __init__(self) -> None:
        self.fired = False
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        if self.fired:
            return
        if self.holding:
            self.pending = self.pending or signum
            return
        self.fired = True
        raise Signalled(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None and not self.fired:
            self.fired = True
            raise Signalled(self.pending)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_PassSignals]:
        with _signal_handlers({signal.SIGTERM: self.handler, signal.SIGHUP: self.handler}):
            yield self


def auto(
    request: AutoRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> AutoResult:
    """One pass: scan, decide per host by the policy, run each action's rollout, remember (with
    ``apply``). ``fleetops.auto`` says what a pass does and what its exit code means."""
    obs = observer if observer is not None else NullObserver()
    policy_path = request.policy if request.policy is not None else default_policy_path()
    policy = load_policy(policy_path)
    auto_mod.check_policy_actions(policy, str(policy_path))
    signals = _PassSignals()
    with signals.installed() if handle_signals else contextlib.nullcontext():
        return _auto(request, obs, policy, policy_path, handle_signals, signals)


def _auto(
    request: AutoRequest,
    obs: RolloutObserver,
    policy: Policy,
    policy_path: Path,
    handle_signals: bool,
    signals: _PassSignals,
) -> AutoResult:
    inventories = paths.resolve_inventories(request.inventory)
    hosts = _targets(inventories, request.limit, request.group_by)
    report = run_scan(
        ScanOptions(inventory=inventories, limit=request.limit, sample_seconds=request.sample_seconds)
    )
    if request.exclude:
        left_out = set(request.exclude)
        report = {
            **report,
            "hosts": {h: e for h, e in (report.get("hosts") or {}).items() if h not in left_out},
        }
        hosts = [h for h in hosts if h.name not in left_out]
        obs.message(f"left out (--exclude): {' '.join(sorted(left_out))}", "dim")
    connection = connection_for(inventories) if request.ec2_tags else None
    tags: dict[str, auto_mod.TagTarget] = {}
    if connection is not None:
        hostvars = {h.name: h.hostvars for h in hosts}
        for host, target in lease_targets(hosts).items():
            shown = hostvars[host].get("ec2_tags") or {}
            value, spent = shown.get(TAG_KEY), shown.get(SPENT_TAG_KEY)
            tags[host] = auto_mod.TagTarget(
                target["instance"],
                target["region"],
                str(value) if value else None,
                str(spent) if spent else None,
            )

    def run_action(action: str, names: Sequence[str], params: Mapping[str, Any]) -> auto_mod.ActionRun:
        result = remediate(
            RemediationRequest(
                action=action,
                inventory=inventories,
                limit=request.limit,
                hosts=list(names),
                params=params,
                apply=request.apply,
                group_by=request.group_by,
                max_parallel=request.max_parallel,
                per_group_max=request.per_group_max,
                canary=request.canary,
                max_failures=request.max_failures,
                host_timeout=request.host_timeout,
                max_unhealthy=request.max_unhealthy,
                not_after=request.not_after,
                break_lock=request.break_lock,
            ),
            obs,
            handle_signals=handle_signals,
        )
        rollout = result.rollout
        states = rollout.hosts if rollout is not None else {}
        return auto_mod.ActionRun(
            action,
            tuple(names),
            params,
            attempted=frozenset(
                h for h, st in states.items() if st in (HOST_DONE, HOST_FAILED, HOST_RUNNING)
            ),
            done=frozenset(h for h, st in states.items() if st == HOST_DONE),
            exit_code=result.exit_code,
            document=result.document,
        )

    state_dir = request.state_dir if request.state_dir is not None else state_home() / "auto"
    result = auto_mod.run_pass(
        auto_mod.PassInputs(
            policy=policy,
            policy_source=str(policy_path),
            scan_report=report,
            group_of={h.name: h.group for h in hosts},
            state_dir=state_dir,
            apply=request.apply,
            tags=tags,
            connection=connection,
            extra_params=request.action_params,
        ),
        run_action,
        obs.message,
        shield=signals.held,
    )
    return AutoResult(result, result.document(), result.exit_code)


def resume(
    request: ResumeRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> RolloutResult:
    """Continue a saved rollout: hosts caught mid-batch are probed first, failed ones re-checked."""
    obs = observer if observer is not None else NullObserver()
    rollout = Rollout.load(request.state, actions=REMEDIATIONS)
    if rollout.status == "done":
        obs.message(f"rollout {rollout.id} is already done")
        return _result(rollout)
    rollout.check_resumable()
    obs.message(f"resuming rollout {rollout.id} ({rollout.action}, status {rollout.status})")
    settings = rollout.plan.setdefault(GUARDS_KEY, {})
    if request.not_after is not None:
        settings["not_after"] = request.not_after.isoformat()
        obs.message(f"new deadline: --not-after {settings['not_after']}")
    if request.max_unhealthy is not None:
        limit = request.max_unhealthy
        settings["max_unhealthy"] = str(guards.MaxUnhealthy.parse(limit) if isinstance(limit, str) else limit)
        obs.message(f"new capacity floor: --max-unhealthy {settings['max_unhealthy']}")
    remediation = get_remediation(rollout.action)
    return _result(_execute(rollout, remediation, obs, request.break_lock, handle_signals))


def report(path: Path) -> RolloutResult:
    """A saved rollout's report; exit code OK only when it is done with every host verified
    (no failed, timed-out, preflight-skipped or in-doubt host)."""
    rollout = Rollout.load(path, actions=REMEDIATIONS)
    s = rollout.summary()
    done = rollout.status == "done" and not (s["failed"] or s["skipped"] or s["pending"])
    return RolloutResult(rollout, report_document(rollout), ExitCode.OK if done else ExitCode.FAILED)


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


# ------------------------------------------------------------------------------------------ drift


@dataclass
class DriftRequest:
    inventory: Sequence[Path] = ()  # with from_report: only for the AZ / AMI / instance type hostvars
    limit: str | None = None
    group_by: Sequence[str] | None = None  # dimensions; None: all (fleetops.drift.DIMENSIONS)
    from_report: Path | None = None  # a saved fleetops.scan/v1 report instead of scanning
    output: Path | None = None  # also write the JSON drift report here
    host_timeout: int = 120


@dataclass(frozen=True)
class DriftResult:
    document: dict[str, Any]  # fleetops.drift/v1
    exit_code: ExitCode

    def json(self) -> str:
        return json.dumps(self.document, indent=2)


def _read_report(path: Path) -> dict[str, Any]:
    """A saved ``fleetops.scan/v1`` report, validated: a bad one is a DocumentError (one line, exit 2)."""
    from fleetops.schemas import load_scan_report

    return load_scan_report(path)


def drift(request: DriftRequest, on_host: OnHost | None = None) -> DriftResult:
    """One scan (or a saved report): the facts that differ between hosts that should be identical."""
    from fleetops.drift import DIMENSIONS, DRIFT_CHECKS, build_drift, exit_code

    inventories = list(request.inventory)
    if not inventories and request.from_report is None:
        inventories = paths.resolve_inventories(inventories)
    why = check_writable(request.output) if request.output is not None else None
    if why:
        raise UsageError(f"cannot write {request.output}: {why}")
    hostvars = {h.name: h.hostvars for h in load_hosts(inventories, request.limit)} if inventories else {}
    if request.from_report is not None:
        report_ = _read_report(request.from_report)
        if request.limit and hostvars:
            report_ = {
                **report_,
                "hosts": {h: e for h, e in (report_.get("hosts") or {}).items() if h in hostvars},
            }
    else:
        opts = ScanOptions(
            inventory=inventories,
            limit=request.limit,
            checks=list(DRIFT_CHECKS),
            host_timeout=request.host_timeout,
        )
        report_ = run_scan(opts, on_host=on_host)
    if not report_.get("hosts"):
        raise UsageError("no hosts matched the inventory and limit")
    document = build_drift(report_, hostvars, list(request.group_by or DIMENSIONS))
    result = DriftResult(document, exit_code(document))
    if request.output is not None:
        write_report(request.output, result.json() + "\n")
    return result


def default_inventories() -> list[Path]:
    """This checkout's localhost inventory as a list ([] when the package runs without its checkout)."""
    inv = paths.default_inventory()
    return [inv] if inv is not None else []
