"""Prometheus textfile-collector output for a scan (node_exporter's --collector.textfile.directory).

The Pinterest lesson was "keep metrics for rare transient events": zombie counts, ID headroom and
findings are exactly that, per host, at every scan. Written atomically (fleetops.util.atomic_write).

The gauges (names, help texts, labels) and their values per host are defined once, in the collection's
``plugins/module_utils/gauges.py``: the host timer (``playbooks/detector_timer.yml``) writes the same
gauges on each host, every interval, with the same code.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from fleetops.ansible.facts import gauges
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
    for key in ("ok", "unreachable", "failed"):
        made["scan_hosts"].labels(key).set(report["summary"][key])
    return reg


def write_textfile(report: dict[str, Any], path: Path) -> None:
    """Write the report's metrics to PATH atomically (a temp file renamed into place)."""
    atomic_write(path, generate_latest(build_registry(report), openmetrics.ALLOWUTF8))
