"""The verbs that only read the fleet: ``scan``, ``merge`` and ``drift`` (and ``scan_metrics``), apart from the
rollouts' (``fleetops.api.verbs``): a scan imports none of the planner, the engine, the lease or the
remediations (~45 ms of its start, before its first ssh)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetops import paths
from fleetops.ansible import facts, knobs
from fleetops.ansible.inventory import load_hosts
from fleetops.api.scan_extras import next_steps as _next_steps
from fleetops.api.scan_extras import scan_policy as _scan_policy
from fleetops.api.scan_extras import scan_recorder as _scan_recorder
from fleetops.api.scan_types import (
    DriftRequest,
    DriftResult,
    MergeRequest,
    MergeResult,
    ScanRequest,
    ScanResult,
)
from fleetops.api.selection import selected as _selected
from fleetops.api.selection import shared_store as open_store
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.scan import (
    FAIL_ON,
    TRANSPORTS,
    PartialReport,
    ScanOptions,
    run_scan,
    shard_hosts,
    with_nodes,
    write_report,
)
from fleetops.scan import selection_record as _selection_record
from fleetops.util import check_writable, on_slurm

OnHost = Callable[[str, dict[str, Any]], None]
# the hosts a scan targets, listed before it starts (with their group key): a progress bar's total, a table's groups
OnTargets = Callable[[Sequence[Any]], None]


# ------------------------------------------------------------------------------------------ scan


def scan(
    request: ScanRequest,
    on_host: OnHost | None = None,
    cancel: threading.Event | None = None,
    on_targets: OnTargets | None = None,
) -> ScanResult:
    """Scan the hosts; ``on_host`` sees each host's entry as it answers; ``cancel`` stops the scan,
    keeping what has arrived (exit code INTERRUPTED); ``on_targets`` gets the targeted hosts
    (InventoryHost, listed once) before the scan starts."""
    from fleetops.scan import exit_code

    warning = facts.zombie_warning_default() if request.zombie_warning is None else request.zombie_warning
    critical = facts.zombie_critical_default() if request.zombie_critical is None else request.zombie_critical
    if warning > critical:
        raise UsageError(f"--zombie-warning ({warning}) must not exceed --zombie-critical ({critical})")
    if request.fail_on not in FAIL_ON:
        raise UsageError(f"--fail-on: {request.fail_on!r} is not one of {', '.join(FAIL_ON)}")
    if request.transport not in TRANSPORTS:
        raise UsageError(f"--transport: {request.transport!r} is not one of {', '.join(TRANSPORTS)}")
    # what the hosts would be sent, checked here as node_health would check it on each of them
    if request.checks:
        knobs.check_checks(request.checks)
    inventories = paths.resolve_inventories(request.inventory)
    for inv in inventories:
        if not inv.exists():
            raise UsageError(f"inventory not found: {inv}")
    for out_path in (request.output, request.prometheus):
        why = check_writable(out_path) if out_path is not None else None
        if why:
            raise UsageError(f"cannot write {out_path}: {why}")
    # the request's scan options (None: the module's default; only what the caller set reaches the
    # playbook), with the inventories resolved and its own copy of the extra vars
    opts = ScanOptions(
        **{f.name: getattr(request, f.name) for f in dataclasses.fields(ScanOptions)}
        | {
            "inventory": inventories,
            "checks": list(request.checks) if request.checks else None,
            "extravars": dict(request.extravars),
        }
    )
    if request.unit_allowlist is not None:
        from fleetops.drift import load_unit_allowlist

        opts.extravars["fleetops_unit_allowlist"] = load_unit_allowlist(request.unit_allowlist)
    knobs.check_scan_vars(opts.playbook_vars())  # every knob sent, as the module checks it
    # the policy, read once for the record and the next steps: a given one now (a bad one: exit 2 before any
    # host is contacted), the one fleetops ships when a finding or the record first needs it, once the hosts
    # are being scanned (pydantic and the policy: about 0.15 s of the start before the first ssh)
    records = bool(request.fleet_record and request.inventory)
    steps = _next_steps(request, _scan_policy(request) if records and request.policy is not None else None)
    shared = open_store(inventories) if records else None  # checked before any host
    record = _scan_recorder(request, steps.policy if records else None, shared)
    # the selected hosts, listed once (names checked): a shard's exact targets, the partial file's header;
    # a part of the limit that matches nothing is ansible's to ignore, and the report's to say
    listing = _selected(inventories, request.limit, None, strict=False)
    listed = listing.hosts
    selection = _selection_record(inventories, request.limit, [h.name for h in listed], listing.unmatched)
    targets = shard_hosts([h.name for h in listed], request.shard)
    held = set(targets)
    if on_targets is not None:
        on_targets([h for h in listed if h.name in held])
    output = request.output
    partial = None
    if output is not None:
        partial = PartialReport(
            output.with_name(output.name + ".partial"),
            targets=targets,
            shard=opts.shard,
            options=opts.record(),
            selection=selection,
            transport=opts.transport,
        )

    # each Slurm host's node, read once before the hosts answer, so that every entry carries it as it streams
    nodes: dict[str, dict[str, Any]] = {}
    if any(on_slurm(h.hostvars) for h in listed if h.name in held):
        from fleetops.nodes import scan_view

        nodes = scan_view([h for h in listed if h.name in held])

    def seen(host: str, entry: dict[str, Any]) -> None:
        entry = steps.entry(host, entry)
        if host in nodes:
            entry = {**entry, "node": nodes[host]}
        if partial is not None:
            partial.add(host, entry)
        if on_host is not None:
            on_host(host, entry)

    try:
        report_ = run_scan(
            opts, on_host=seen, cancel=cancel, targets=targets, hosts=[h for h in listed if h.name in held]
        )
    finally:
        if partial is not None:
            partial.close(done=False)  # kept until the final report is written
    report_ = {**steps.report(with_nodes(report_, nodes)), "selection": selection, "next_steps": steps.record}
    if report_["summary"]["hosts"] == 0 and not report_.get("interrupted") and request.shard is None:
        if partial is not None:
            partial.close(done=True)
        raise UsageError("no hosts matched the inventory and limit")
    code = exit_code(report_, request.fail_on)
    where, warnings = record(report_, listed) if record is not None else ("", [])
    result = ScanResult(
        report_, ExitCode.INTERRUPTED if report_.get("interrupted") else code, where, tuple(warnings)
    )
    if output is not None:
        write_report(output, result.json() + "\n")
        if partial is not None:
            partial.close(done=True)
    if request.prometheus is not None:
        from fleetops.metrics import write_textfile

        write_textfile(report_, request.prometheus)
    return result


def scan_metrics(report: Mapping[str, Any]) -> bytes:
    """A scan report's node_exporter textfile (what ``ScanRequest.prometheus`` writes), for another sink."""
    from fleetops.metrics import textfile

    return textfile(dict(report))


def merge(request: MergeRequest) -> MergeResult:
    """Join shard reports into the report one scan of all their hosts would have written (its exit
    code too); a ``MergeError`` (exit 2, one line) when they are not the parts of one scan. Changes
    nothing but ``request.output``, written only when the merge succeeds."""
    from fleetops.merge import merge as merge_reports

    why = check_writable(request.output) if request.output is not None else None
    if why:
        raise UsageError(f"cannot write {request.output}: {why}")
    merged = merge_reports(list(request.reports))
    result = MergeResult(merged.report, merged.exit_code, merged.notes)
    if request.output is not None:
        write_report(request.output, result.json() + "\n")
    return result


# ------------------------------------------------------------------------------------------ drift


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
    """The localhost inventory as a list: the checkout's, or the one the package ships."""
    return [paths.default_inventory()]
