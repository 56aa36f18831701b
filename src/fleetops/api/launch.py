"""The launch of a rollout: the targets a request selects, its plan, the rollout started from them
(``start``: names, the remediation's own step, preflight, the guards' settings, the lease's targets),
and its run under the lock (``execute``: also a resume's)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops import paths
from fleetops.ansible.inventory import DEFAULT_GROUP_VARS, InventoryHost, InventoryTargets, load_targets
from fleetops.api.requests import PlanResult, RemediationRequest, RolloutCaps, plan_document
from fleetops.api.selection import selected, shared_store
from fleetops.api.signals import ctrl_c
from fleetops.errors import UsageError
from fleetops.planner import MaxParallel, one_per_batch
from fleetops.planner import plan as plan_batches
from fleetops.remediations import REMEDIATIONS, Remediation, backends
from fleetops.remediations.catalog import KUBECONFIG, KUBECTL
from fleetops.rollout import guards, killswitch
from fleetops.rollout.audit import ensure_writable as ensure_audit_writable
from fleetops.rollout.batch import NOT_IN_INVENTORY, InventoryScanner, PlaybookBatchRunner
from fleetops.rollout.engine import (
    GUARDS_KEY,
    HOST_TIMEOUT_VAR,
    REFUSED,
    Engine,
    FleetCapacity,
    RolloutObserver,
)
from fleetops.rollout.lease import connection_for, lease_targets
from fleetops.rollout.locks import locked
from fleetops.rollout.outcome import HostOutcome
from fleetops.rollout.preflight import preflight
from fleetops.rollout.state import (
    HOST_FAILED,
    HOST_PENDING,
    HOST_RUNNING,
    HOST_SKIPPED,
    Rollout,
    RolloutError,
    new_rollout,
)

if TYPE_CHECKING:
    from fleetops.store import Store


def plan_hosts(
    action: str, caps: RolloutCaps, exclude: Sequence[str], hosts: Sequence[InventoryHost]
) -> PlanResult:
    """The batches of ``hosts`` under ``caps``, ``exclude`` left out."""
    guards.require_targets([h.name for h in hosts], "the selection")
    max_parallel = caps.max_parallel
    if not isinstance(max_parallel, MaxParallel):
        max_parallel = MaxParallel.parse(str(max_parallel))
    result = plan_batches(
        hosts,
        max_parallel=max_parallel,
        per_group_max=caps.per_group_max,
        canary=caps.canary,
        exclude=list(exclude),
    )
    remediation = REMEDIATIONS.get(action)
    if remediation is not None and remediation.one_per_batch is not None:
        key, why = remediation.one_per_batch
        hostvars = {h.name: h.hostvars for h in hosts}
        result = one_per_batch(result, lambda name: key(hostvars.get(name) or {}), why)
    group_by = caps.group_by or "|".join(DEFAULT_GROUP_VARS)
    return PlanResult(result, group_by, plan_document(action, result, group_by))


def start(request: RemediationRequest, remediation: Remediation, observer: RolloutObserver) -> Rollout | None:
    """The rollout ``request`` asks for, planned and saved nowhere yet; None: nothing to do."""
    return start_listed(request, remediation, observer)[0]


def start_listed(
    request: RemediationRequest, remediation: Remediation, observer: RolloutObserver
) -> tuple[Rollout | None, InventoryTargets]:
    """``start``, and the inventory listing the rollout was planned from, for ``execute``: the targets
    are resolved once."""
    inventories = paths.resolve_inventories(request.inventory)
    params = remediation.resolve(request.params)
    extravars = remediation.extravars(params)
    limit = request.limit
    # every selected name is checked before anything runs (``fix`` scans first); a step before
    # planning narrows the selection by exact names, never by a limit joined from them
    listing = selected(inventories, limit, request.group_by)
    hosts = listing.hosts
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
        more, wanted_hosts = remediation.prepare(params, inventories, limit, observer.message)
        extravars = {**extravars, **more}
        if wanted_hosts is not None:
            if not wanted_hosts:
                return None, listing
            wanted = set(wanted_hosts)
            if request.hosts is not None:  # the step saw the whole selection: keep the hosts named
                wanted &= set(request.hosts)
                if not wanted:
                    return None, listing
            unknown = sorted(wanted - {h.name for h in hosts})
            if unknown:
                raise UsageError(
                    f"remediate {remediation.name}: its plan names host(s) outside the selection: {' '.join(unknown)}"
                )
            hosts = [h for h in hosts if h.name in wanted]
    if remediation.kubernetes is not None:  # quarantine, unquarantine: each host's backend decides
        backends.check_targets(hosts, evict=bool(extravars.get("fleetops_quarantine_evict")))
    elif extravars.get("fleetops_kube_drain"):
        for target in hosts:
            node = target.hostvars.get("k8s_node_name") or target.name
            guards.check_k8s_node_name(str(node), target.name)
    reasons: dict[str, str | None] = {}
    exclude = list(request.exclude)
    refused = {
        h.name: REFUSED + why for h in hosts if remediation.refuse and (why := remediation.refuse(h.hostvars))
    }
    for host, why in refused.items():
        observer.message(f"{host}: {why}", "warning")
    exclude += list(refused)
    if request.apply:
        reasons = preflight(
            [h for h in hosts if h.name not in refused],
            timeout=request.preflight_timeout,
            inventory=inventories,
        )
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
    planned = plan_hosts(remediation.name, request, exclude, hosts)
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
    if "fleetops_kube_drain" in rollout.extravars or remediation.kubernetes == "cordon":
        rollout.extravars["fleetops_rollout"] = rollout.id  # the node annotation names who cordoned it
    if request.apply and request.ec2_lease:
        instances = lease_targets(h for h in hosts if h.name in rollout.hosts)
        if instances and connection_for(inventories) is not None:
            rollout.lease = {"ttl": request.lease_ttl, "settle": request.lease_settle, "instances": instances}
    for host, reason in reasons.items():
        if reason:
            rollout.hosts[host] = HOST_SKIPPED
            rollout.results[host] = HostOutcome(status="skipped", msg=f"preflight: {reason}")
    for host, why in refused.items():
        rollout.hosts[host] = HOST_SKIPPED
        rollout.results[host] = HostOutcome(status="skipped", msg=why)
    return rollout, listing


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


def leave_out_gone(rollout: Rollout, present: frozenset[str], observer: RolloutObserver) -> None:
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


def with_pause(
    ec2_stop: Callable[[float], killswitch.StopRequest | None] | None, store: Store | None
) -> Callable[[float], killswitch.StopRequest | None]:
    """The engine's before-batch stop check, with the pauses first: a rollout stops after its current
    batch when automation is paused (whenever it started) on this controller (``rollout.pause``) or in
    the shared store, or when the store cannot be read (nothing disruptive without it)."""
    from fleetops.rollout.pause import local_pause, pause_path

    def check(running_since: float) -> killswitch.StopRequest | None:
        here = local_pause()
        if here is not None:
            return killswitch.StopRequest(
                None, here.operator, here.since, here.reason, str(pause_path()), scope="fleetops pause"
            )
        if store is not None:
            from fleetops.store import StoreFailure

            try:
                pause = store.paused()
            except StoreFailure as exc:
                return killswitch.StopRequest(
                    None, "fleetops", time.time(), str(exc), store.where(), scope="the shared store"
                )
            if pause is not None:
                return killswitch.StopRequest(
                    None, pause.operator, pause.since, pause.reason, store.where(), scope="fleetops pause"
                )
        return ec2_stop(running_since) if ec2_stop is not None else None

    return check


def _kube_here(kube: Mapping[str, str]) -> bool:
    """Whether this controller can reach the cluster a rollout names, as the reboot playbook's kubectl hooks
    judge it (``kubectl hooks skipped: no kubectl`` / ``no kubeconfig on the controller``): the kubectl runs,
    and a kubeconfig it names (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``) exists, or
    this is a pod (in-cluster config). Without them the rollout touches no node, and its floor reads none."""
    kubectl = kube.get("kubectl") or KUBECTL.default
    if shutil.which(str(kubectl)) is None:
        return False
    configs = [kube["kubeconfig"]] if kube.get("kubeconfig") else [
        p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p
    ] or [os.path.expanduser("~/.kube/config")]  # fmt: skip
    return any(os.path.exists(p) for p in configs) or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def fleet_capacity(
    listing: InventoryTargets,
    extravars: Mapping[str, Any],
    store: Store | None = None,
    own: Collection[str] = (),
) -> Callable[[], FleetCapacity]:
    """The live fleet for a rollout's capacity floor (``Engine.fleet``), read before each batch that has a
    floor: every group's size in the whole inventory (not only the rollout's hosts), the hosts whose
    nodes are out of scheduling by anyone (``fleetops.nodes.read_nodes``: one scontrol or kubectl call, the
    Kubernetes cluster only when the rollout names one, as ``remediate auto`` reads it), and, with a shared
    store, the hosts a disruptive action of an auto pass is on now (``StoredState.busy``: in a batch, or
    left half done). A host whose backend is not one fleetops knows, or whose scheduler or store cannot be
    read, makes its group's capacity unknown. ``own``: the rollout's hosts, never counted as busy in the
    store (an auto pass reserves its whole action before the action's rollout runs its batches)."""
    every = list(listing.every)
    group_of = {h.name: h.group for h in every}
    sizes = dict(Counter(group_of.values()))
    kube = {
        "kubectl": str(extravars.get(KUBECTL.extravars[0]) or ""),
        "kubeconfig": str(extravars.get(KUBECONFIG.extravars[0]) or ""),
    }
    kube_here = _kube_here(kube)  # without it, Kubernetes nodes are not read (as the hooks are skipped)

    def read() -> FleetCapacity:
        from fleetops.nodes import read_nodes

        unknown: dict[str | None, str] = {}
        known = []
        for host in every:
            try:
                backend = backends.backend_of(host.name, host.hostvars)
            except UsageError as exc:
                unknown.setdefault(host.group, str(exc))
                continue
            if backend is not backends.BACKENDS["kubernetes"] or kube_here:
                known.append(host)
        reading = read_nodes(known, kube)
        for name, why in reading.unknown.items():
            unknown.setdefault(group_of.get(name), why)
        out = {h: group_of.get(h) for h in reading.out()}
        if store is not None:
            from fleetops.store import StoredState, StoreFailure

            try:
                state = StoredState(store)
                state.load()
                disruptive = [name for name, r in REMEDIATIONS.items() if r.disruptive]
                half_done = [name for name, r in REMEDIATIONS.items() if r.in_flight]
                busy = state.busy(disruptive, half_done)
                out.update({h: group_of.get(h) for h in busy if h in group_of and h not in own})
            except StoreFailure as exc:
                for group in sizes:
                    unknown.setdefault(group, str(exc))
        return FleetCapacity(sizes, out, unknown)

    return read


def execute(
    rollout: Rollout,
    remediation: Remediation,
    observer: RolloutObserver,
    break_lock: bool | str,
    handle_signals: bool,
    listing: InventoryTargets | None = None,
) -> Rollout:
    """Run a started (or resumed) rollout under its hosts' locks, with ``ctrl_c``'s handlers.
    ``listing``: the inventory ``start`` planned from; None (a resume): listed again."""
    inventory = [Path(p) for p in rollout.inventory]
    # A resume's hosts are checked again: groups may have come since, hosts may have gone.
    if listing is None:
        listing = load_targets(inventory)
    groups, present = listing.groups, listing.present
    leave_out_gone(rollout, present, observer)
    names = [h for h, s in rollout.hosts.items() if s != HOST_SKIPPED]
    guards.check_target_names(names, groups)
    if rollout.apply:
        ensure_audit_writable()  # never change a host unaudited (AuditError, exit 3, nothing changed)
    store = shared_store(inventory)
    with locked(rollout, names, break_lock, say=lambda line: observer.message(line, "dim")) as held:
        engine = Engine(
            rollout=rollout,
            actions=remediation.actions,
            # replace's playbook names a new instance uniquely in groups['all']: the whole inventory
            runner=PlaybookBatchRunner(
                remediation.playbook, inventory, whole_inventory=remediation.replaces_host
            ),
            scanner=InventoryScanner(inventory, groups, present),
            observer=observer,
            gate_check=remediation.gate,
            probe_vars=remediation.probe_vars,
            replaces_host=remediation.replaces_host,
            post_vars=remediation.post_vars(rollout.extravars) if remediation.post_vars else None,
            guard=held.guard,
            ec2_stop=with_pause(held.ec2_stop, store)
            if rollout.apply
            else held.ec2_stop,  # a dry run is not held
            fleet=fleet_capacity(listing, rollout.extravars, store, frozenset(rollout.hosts)),
        )
        if rollout.apply:
            observer.message(f"rollout {rollout.id}: state {rollout.state_path}", "dim")
        with ctrl_c(engine, observer) if handle_signals else contextlib.nullcontext():
            return engine.run()
