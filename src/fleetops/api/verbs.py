"""The rollout verbs: ``plan``, ``remediate``, ``resume``, ``report`` and ``auto`` (the launch of a rollout is
``fleetops.api.launch``'s, the signal handling ``fleetops.api.signals``'s). Imported by ``fleetops.api`` when one
of them is first asked for: a scan does not wait for them."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops import paths
from fleetops.api.launch import execute as _execute
from fleetops.api.launch import leave_out_gone, plan_hosts, start_listed
from fleetops.api.launch import start as _start  # noqa: F401  (tests plan a rollout without running it)
from fleetops.api.requests import (
    AutoRequest,
    AutoResult,
    PlanRequest,
    PlanResult,
    RemediationRequest,
    ResumeRequest,
    RolloutResult,
    empty_document,
    is_empty_document,
    report_document,
    rollout_options,
    rollout_result,
)
from fleetops.api.scan_types import (
    auto_state_dir,
)
from fleetops.api.scanning import _read_report
from fleetops.api.selection import selected as _selected
from fleetops.api.selection import shared_store as open_store
from fleetops.api.selection import targets as _targets
from fleetops.api.signals import PassSignals, ctrl_c
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.remediations import REMEDIATIONS
from fleetops.remediations import get as get_remediation
from fleetops.rollout import guards
from fleetops.rollout.audit import audit_pass
from fleetops.rollout.audit import ensure_writable as ensure_audit_writable
from fleetops.rollout.engine import GUARDS_KEY, STOP_KILL_SWITCH, NullObserver, RolloutObserver, refused
from fleetops.rollout.lease import connection_for, lease_targets
from fleetops.rollout.state import HOST_DONE, HOST_FAILED, HOST_RUNNING, Rollout, operator
from fleetops.scan import (
    ScanOptions,
    run_scan,
)
from fleetops.util import check_writable

if TYPE_CHECKING:
    from fleetops import auto as auto_mod
    from fleetops.policy import Policy


# the launch's and the signal handling's own names, as the tests reach them through the API
_PassSignals = PassSignals
_ctrl_c = ctrl_c
_leave_out_gone = leave_out_gone


def _plan_hosts(request: PlanRequest, hosts: Sequence[Any]) -> PlanResult:
    """``request``'s plan of ``hosts`` (already selected)."""
    return plan_hosts(request.action, request, request.exclude, hosts)


# ------------------------------------------------------------------------------------------ plan


def plan(request: PlanRequest) -> PlanResult:
    """Load the targeted hosts and plan them with the request's caps (changes nothing)."""
    get_remediation(request.action)  # an unknown action: UsageError, before any inventory is read
    inventories = paths.resolve_inventories(request.inventory)
    return _plan_hosts(request, _targets(inventories, request.limit, request.group_by))


# ------------------------------------------------------------------------------------------ rollouts


def remediate(
    request: RemediationRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> RolloutResult:
    """Plan and run a remediation batch by batch (a dry run unless ``request.apply``).

    ``handle_signals``: in the main thread, Ctrl-C stops after the current batch and a second one
    aborts it (the state is saved either way; exit code INTERRUPTED).
    """
    obs = observer if observer is not None else NullObserver()
    remediation = get_remediation(request.action)
    rollout, listing = start_listed(request, remediation, obs)
    if rollout is None:
        obs.message("nothing to do: no host has a finding this remediation acts on")
        return RolloutResult(None, empty_document(remediation.name, request.apply), ExitCode.OK)
    return rollout_result(_execute(rollout, remediation, obs, request.break_lock, handle_signals, listing))


def resume(
    request: ResumeRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> RolloutResult:
    """Continue a saved rollout: hosts caught mid-batch are probed first, failed ones re-checked."""
    obs = observer if observer is not None else NullObserver()
    rollout = Rollout.load(request.state, actions=REMEDIATIONS)
    if rollout.status == "done":
        obs.message(f"rollout {rollout.id} is already done")
        return rollout_result(rollout)
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
    return rollout_result(_execute(rollout, remediation, obs, request.break_lock, handle_signals))


def report(path: Path) -> RolloutResult:
    """A saved rollout's report; exit code OK only when it is done with every host verified
    (no failed, timed-out, preflight-skipped or in-doubt host)."""
    rollout = Rollout.load(path, actions=REMEDIATIONS)
    s = rollout.summary()
    done = rollout.status == "done" and not (s["failed"] or s["skipped"] or s["pending"])
    return RolloutResult(rollout, report_document(rollout), ExitCode.OK if done else ExitCode.FAILED)


# ------------------------------------------------------------------------------------------ auto


def auto(
    request: AutoRequest, observer: RolloutObserver | None = None, *, handle_signals: bool = True
) -> AutoResult:
    """One pass: scan, decide per host by the policy, run each action's rollout, remember (with
    ``apply``). ``fleetops.auto`` says what a pass does and what its exit code means."""
    from fleetops import auto as auto_mod
    from fleetops.exitcodes import AUTO_FAIL_ON
    from fleetops.policy import default_policy_path, load_policy

    if request.fail_on not in AUTO_FAIL_ON:
        raise UsageError(f"--fail-on {request.fail_on!r}: choose from {', '.join(AUTO_FAIL_ON)}")
    obs = observer if observer is not None else NullObserver()
    policy_path = request.policy if request.policy is not None else default_policy_path()
    policy = load_policy(policy_path)
    auto_mod.check_policy_actions(policy, str(policy_path))
    if request.from_report is not None:
        return _what_if(request, obs, policy, policy_path)
    signals = PassSignals()
    if request.cause is not None:
        ensure_audit_writable()  # a pass with a cause is audited: AuditError (exit 3) before it acts
    why = check_writable(request.prometheus) if request.prometheus is not None else None
    if why:  # before the pass, not after it acted
        raise UsageError(f"cannot write {request.prometheus}: {why}")
    with signals.installed() if handle_signals else contextlib.nullcontext():
        result = _auto(request, obs, policy, policy_path, handle_signals, signals)
    if request.apply:
        _audit_waiting(result.result)
    if request.cause is not None:
        # the pass's own audit line (its cause, decisions and rollouts); its document says the cause too
        result = dataclasses.replace(
            result, document=audit_pass(result.document, request.cause, request.limit)
        )
    if request.prometheus is not None:
        from fleetops.metrics import write_auto_textfile

        write_auto_textfile(result.document, request.prometheus, time.time())
    return result


def _audit_waiting(result: auto_mod.PassResult) -> None:
    """One audit line per host this pass put on its ladder's ``human`` rung (recorded once, as the rung is):
    it waits for a person from now on, which the exit code says only with --fail-on human."""
    from fleetops.policy import HUMAN
    from fleetops.rollout.audit import audit_event

    who = operator()
    for d in result.decisions:
        if d.action == HUMAN:
            audit_event("human_needed", who, host=d.host, rule=d.rule, check=d.check, reason=d.reason)


def _what_if(request: AutoRequest, obs: RolloutObserver, policy: Policy, policy_path: Path) -> AutoResult:
    """``auto`` against a saved scan report: the pass's decisions, nothing run (``fleetops.auto.whatif``)."""
    from fleetops import auto as auto_mod

    assert request.from_report is not None
    given = [
        option
        for option, on in (
            ("--apply", request.apply),
            ("--reason", request.cause is not None),
            ("--prometheus", request.prometheus is not None),
            ("-i/--inventory", bool(request.inventory)),
            ("-l/--limit", bool(request.limit)),
            ("--exclude", bool(request.exclude)),
        )
        if on
    ]
    if given:
        raise UsageError(
            f"--from {request.from_report}: a what-if against a saved scan runs nothing and reads no "
            f"inventory: {', '.join(given)} cannot go with it"
        )
    report_ = _read_report(request.from_report)
    state_dir = auto_state_dir(request.state_dir)
    result = auto_mod.what_if(
        policy, str(policy_path), report_, str(request.from_report), state_dir, obs.message
    )
    result.fail_on = request.fail_on
    return AutoResult(result, result.document(), result.exit_code)


def _tag_targets(hosts: Sequence[Any]) -> dict[str, auto_mod.TagTarget]:
    """Each EC2 host's instance and the ladder and budgets spent its fleetops.io tags show."""
    from fleetops import auto as auto_mod
    from fleetops.policy import SPENT_TAG_KEY, TAG_KEY

    hostvars = {h.name: h.hostvars for h in hosts}
    tags: dict[str, auto_mod.TagTarget] = {}
    for host, target in lease_targets(hosts).items():
        shown = hostvars[host].get("ec2_tags") or {}
        value, spent = shown.get(TAG_KEY), shown.get(SPENT_TAG_KEY)
        tags[host] = auto_mod.TagTarget(
            target["instance"],
            target["region"],
            str(value) if value else None,
            str(spent) if spent else None,
        )
    return tags


def _auto(
    request: AutoRequest,
    obs: RolloutObserver,
    policy: Policy,
    policy_path: Path,
    handle_signals: bool,
    signals: PassSignals,
) -> AutoResult:
    from fleetops import auto as auto_mod
    from fleetops.nodes import read_nodes

    inventories = paths.resolve_inventories(request.inventory)
    listing = _selected(inventories, request.limit, request.group_by)
    hosts = listing.hosts
    # the default transport (the direct path, ansible-playbook for the hosts it cannot serve), on the hosts
    # listed above: no second listing
    report_ = run_scan(
        ScanOptions(inventory=inventories, limit=request.limit, sample_seconds=request.sample_seconds),
        hosts=hosts,
    )
    if request.exclude:
        left_out = set(request.exclude)
        report_ = {
            **report_,
            "hosts": {h: e for h, e in (report_.get("hosts") or {}).items() if h not in left_out},
        }
        hosts = [h for h in hosts if h.name not in left_out]
        obs.message(f"left out (--exclude): {' '.join(sorted(left_out))}", "dim")
    connection = connection_for(inventories) if request.ec2_tags else None
    tags = _tag_targets(hosts) if connection is not None else {}
    selection = {h.name for h in hosts}
    others = [h for h in listing.every if h.name not in selection]  # outside the limit or --exclude
    fleet_tags = _tag_targets(others) if connection is not None else {}

    limited = {h.name for h in listing.hosts}

    def run_action(action: str, names: Sequence[str], params: Mapping[str, Any]) -> auto_mod.ActionRun:
        # the pass's caps and limits, unchanged, for each action's rollout over exactly its hosts; a host
        # outside the limit (a drain a dead pass cut off, run again) is named in the whole inventory
        result = remediate(
            RemediationRequest(
                action=action,
                inventory=inventories,
                limit=request.limit if set(names) <= limited else None,
                hosts=list(names),
                params=params,
                apply=request.apply,
                **rollout_options(request),
            ),
            obs,
            handle_signals=handle_signals,
        )
        rollout = result.rollout
        states = rollout.hosts if rollout is not None else {}
        stopped = (rollout.stopped or {}) if rollout is not None else {}
        results = rollout.results if rollout is not None and get_remediation(action).replaces_host else {}
        replacements = {
            host: (str(new["instance_id"]), tags[host].region)
            for host in names
            if states.get(host) == HOST_DONE and host in tags and host in results
            for r in results[host].task_results()
            for new in (r.get("new_instances") or [])[:1]
            if isinstance(new, Mapping) and new.get("instance_id")
        }
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
            stop_requested=str(stopped.get("reason")) if stopped.get("kind") == STOP_KILL_SWITCH else None,
            replacements=replacements,
            # each host's budget is spent from its batch's start, not from when the action was reserved
            acted={
                h: float(b["started"])
                for b in (rollout.batches if rollout is not None else [])
                if isinstance(b.get("started"), (int, float))
                for h in b.get("hosts") or []
            },
            # no rollout: the remediation's own step found nothing to do on any of them; or it refused some
            cannot_act=frozenset(names)
            if rollout is None and is_empty_document(result.document)
            else frozenset(
                h for h, out in (rollout.results if rollout is not None else {}).items() if refused(out)
            ),
        )

    state_dir = auto_state_dir(request.state_dir)
    # the schedulers' view of every host's node (cordoned, drained), once per pass: the floors count it
    kube = next((dict(p) for a, p in request.action_params.items() if get_remediation(a).kubernetes), {})
    node_states = read_nodes(
        listing.every, {k: str(v) for k, v in kube.items() if k in ("kubectl", "kubeconfig")}
    )
    result = auto_mod.run_pass(
        auto_mod.PassInputs(
            policy=policy,
            policy_source=str(policy_path),
            scan_report=report_,
            group_of={h.name: h.group for h in hosts},
            fleet={h.name: h.group for h in listing.every},
            fleet_tags=fleet_tags,
            state_dir=state_dir,
            apply=request.apply,
            tags=tags,
            connection=connection,
            extra_params=request.action_params,
            store=open_store(inventories),
            operator=operator(),
            nodes=node_states,
            stopped={
                h.name: f"EC2 instance {h.hostvars['ec2_state']}"
                for h in listing.every
                if h.hostvars.get("ec2_state") not in (None, "", "running")
            },
        ),
        run_action,
        obs.message,
        shield=signals.held,
    )
    result.fail_on = request.fail_on
    return AutoResult(result, result.document(), result.exit_code)
