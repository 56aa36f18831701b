"""Prometheus textfile-collector output for a scan (node_exporter's --collector.textfile.directory).

The Pinterest lesson was "keep metrics for rare transient events": zombie counts, ID headroom and
findings are exactly that, per host, at every scan. Written atomically (fleetops.util.atomic_write).

The gauges (names, help texts, labels) and their values per host are defined once, in the collection's
``plugins/module_utils/gauges.py``: the host timer (``playbooks/detector_timer.yml``) writes the same
gauges on each host, every interval, with the same code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from fleetops.ansible import facts
from fleetops.ansible.facts import gauges
from fleetops.remediations import REMEDIATIONS
from fleetops.scan import node_out
from fleetops.util import atomic_write


def build_registry(report: dict[str, Any]) -> CollectorRegistry:
    reg = CollectorRegistry()
    shared = gauges()
    made = {
        g.name: Gauge(shared.metric_name(g.name), g.help, labelnames=g.labels, registry=reg)
        for g in shared.GAUGES
    }
    for host, entry in report["hosts"].items():
        for name, labels, value in shared.host_series(host, entry):
            made[name].labels(*labels).set(value)

    made["scan_duration_seconds"].set(float(report.get("duration_s", 0.0)))
    if report.get("started_at"):
        started = datetime.fromisoformat(str(report["started_at"]))  # "...Z": UTC
        made["scan_timestamp_seconds"].set(started.timestamp())
    else:
        reg.unregister(made["scan_timestamp_seconds"])  # no start time (an older report): no wrong one
    for key in (*facts.answered_statuses(), "unreachable", "failed"):
        made["scan_hosts"].labels(key).set(report["summary"].get(key, 0))
    nodes = {h: e["node"] for h, e in report["hosts"].items() if e.get("node")}
    # the controller's reading of the scheduler (fleetops.nodes.scan_view): not a host timer's gauge
    if nodes:
        name, text, labels = SCHEDULER_NODE_GAUGE
        phase = Gauge(f"fleetops_{name}", text, labelnames=labels, registry=reg)
        for host, node in sorted(nodes.items()):
            by = ("fleetops" if node.get("ours") else "other") if node_out(node) else ""
            phase.labels(
                host, str(node.get("backend")), str(node.get("node")), str(node.get("phase")), by
            ).set(1)
    return reg


# (name, help, labels): each scanned Slurm host's node, as the scan read it once from the controller
SCHEDULER_NODE_GAUGE = (
    "scheduler_node_phase",
    "1 for each host's scheduler node, labelled with its phase (in, draining, drained, down, out, missing, "
    "unknown: not read) and who took it out (fleetops, other; empty when it is not out)",
    ("host", "backend", "node", "phase", "by"),
)


def textfile(report: dict[str, Any]) -> bytes:
    """The report's metrics, in node_exporter's textfile format."""
    return bytes(generate_latest(build_registry(report), openmetrics.ALLOWUTF8))


def write_textfile(report: dict[str, Any], path: Path) -> None:
    """Write the report's metrics to PATH atomically (a temp file ending in .tmp, which node_exporter
    does not read, renamed into place), mode 0644 whatever the umask, as the host timer writes its own
    (``facts.textfile_mode``): node_exporter reads it as its own user, and the gauges hold no secret
    (counts, unit and check names, kernel versions: what the alerts need)."""
    atomic_write(path, textfile(report), mode=facts.textfile_mode(), exact=True)


# ---- the auto pass's own state (``remediate auto --prometheus FILE``)

# (name, help, labels): one definition, read by build_auto_registry and by the alert rules' tests.
AUTO_GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("auto_pass_timestamp_seconds", "When the last remediate auto pass ended (Unix time)", ()),
    (
        "auto_pass_exit_code",
        "The last pass's exit code (0 ok, 1 a person must act with --fail-on human, 3 failed, 5 paused)",
        (),
    ),
    ("auto_pass_apply", "1 when the last pass acted (--apply), 0 for a dry run", ()),
    ("auto_hosts", "Hosts of the last pass by decision status", ("status",)),
    ("auto_human_needed", "1 per host whose ladder reached 'human' or ran out", ("host", "rule", "check")),
    ("auto_brake", "1 per rule a storm brake holds (its reboot, stop-start and replace rungs)", ("rule",)),
    (
        "auto_budget_blocked",
        "Hosts the last pass held back because an action's budget was spent",
        ("action",),
    ),
    ("auto_rung_failed", "Hosts an action was attempted on and did not finish in the last pass", ("action",)),
    ("auto_floor_held", "Hosts the last pass held back to keep their group's capacity floor", ("group",)),
    ("auto_paused", "1 when automation was paused (fleetops pause) at the last pass", ()),
    ("auto_store_failure", "1 when the last pass could not use the shared store (nothing more acted)", ()),
    (
        "auto_stranded",
        "1 per disruptive step a dead pass left that passes failed to finish for too long: a person must "
        "finish it, then 'fleetops store forget ENTRY' (cause: the last failed attempt's)",
        ("host", "action", "entry", "cause"),
    ),
    ("auto_unreachable", "Hosts the last pass could not reach", ()),
    (
        "auto_unreachable_tolerated",
        "1 when the last pass's unreachable hosts were within its policy's share (they did not fail it)",
        (),
    ),
)
AUTO_STATUSES = (
    "act",
    "wait",
    "budget",
    "brake",
    "floor",
    "human",
    "exhausted",
    "clean",
    "no_rule",
    "not_scanned",
)


def build_auto_registry(doc: Mapping[str, Any], ended: float) -> CollectorRegistry:
    """The gauges of one pass, from its document (``fleetops.auto/v1``); ``ended``: when it ended."""
    reg = CollectorRegistry()
    made = {
        name: Gauge(f"fleetops_{name}", text, labelnames=labels, registry=reg)
        for name, text, labels in AUTO_GAUGES
    }
    decisions = list(doc.get("decisions") or [])
    made["auto_pass_timestamp_seconds"].set(ended)
    made["auto_pass_exit_code"].set(int(doc.get("exit_code", 0)))
    made["auto_pass_apply"].set(1 if doc.get("apply") else 0)
    counts = Counter(str(d.get("status")) for d in decisions)
    for status in AUTO_STATUSES:
        made["auto_hosts"].labels(status).set(counts.get(status, 0))
    for d in decisions:
        if d.get("status") in ("human", "exhausted"):
            made["auto_human_needed"].labels(d.get("host"), d.get("rule") or "", d.get("check") or "").set(1)
    for rule in sorted(doc.get("brakes") or {}):
        made["auto_brake"].labels(rule).set(1)
    blocked = Counter(str(d.get("rung_action")) for d in decisions if d.get("status") == "budget")
    failed = Counter(
        str(a.get("action"))
        for a in doc.get("actions") or []
        for h in a.get("attempted") or []
        if h not in (a.get("done") or [])
    )
    for action in sorted(set(blocked) | set(failed) | {a for a in REMEDIATIONS}):
        made["auto_budget_blocked"].labels(action).set(blocked.get(action, 0))
        made["auto_rung_failed"].labels(action).set(failed.get(action, 0))
    for c in doc.get("capacity") or []:
        made["auto_floor_held"].labels(str(c.get("group"))).set(len(c.get("held") or []))
    shared = doc.get("store") or {}
    made["auto_paused"].set(1 if shared.get("paused") else 0)
    made["auto_store_failure"].set(1 if shared.get("failure") else 0)
    for s in shared.get("stranded") or []:
        made["auto_stranded"].labels(
            s.get("host"), s.get("action"), s.get("entry"), s.get("cause") or ""
        ).set(1)
    unreachable = doc.get("unreachable") or {}
    made["auto_unreachable"].set(len(unreachable.get("hosts") or []))
    made["auto_unreachable_tolerated"].set(1 if unreachable.get("tolerated") else 0)
    return reg


def write_auto_textfile(doc: Mapping[str, Any], path: Path, ended: float) -> None:
    """Write the pass's gauges to PATH atomically (node_exporter's textfile directory), mode 0644 as
    ``write_textfile`` does: decisions, rule and check names, counts; no secret."""
    atomic_write(
        path,
        generate_latest(build_auto_registry(doc, ended), openmetrics.ALLOWUTF8),
        mode=facts.textfile_mode(),
        exact=True,
    )
