"""Prometheus textfile-collector output for a scan (node_exporter's --collector.textfile.directory).

The Pinterest lesson was "keep metrics for rare transient events": zombie counts, ID headroom and
findings are exactly that, per host, at every scan. Written atomically by prometheus_client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from fleetops.scan import SEVERITIES

PREFIX = "fleetops"


def build_registry(report: dict[str, Any]) -> CollectorRegistry:
    reg = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ("host",)) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", doc, labelnames=labels, registry=reg)

    up = gauge("scan_host_up", "1 when the host answered the scan (status ok), else 0")
    status = gauge("scan_host_status", "1 for the host's scan status", ("host", "status"))
    host_seconds = gauge("scan_host_duration_seconds", "Time the node_health module took on the host")
    memcg_total = gauge("memcg_total", "Memory cgroups the kernel holds (live + dying; host-wide)")
    memcg_live = gauge("memcg_live", "Live memory cgroups (directories) in the scanned scope")
    memcg_zombies = gauge("memcg_zombies", "Dying (zombie) memory cgroups; absent where it cannot be known")
    headroom = gauge(
        "memcg_id_headroom", "Memory cgroup IDs left before the 65,535 limit (mkdir fails: ENOSPC)"
    )
    findings = gauge("findings", "Findings by severity", ("host", "severity"))
    looping = gauge("crashloop_units", "Services crash looping (crashloop_unit findings of warning or worse)")
    ucx_risky = gauge(
        "ucx_risky_processes",
        "Processes with UCX mmap hooks on and an unbounded rcache (ucx_mmap_hooks findings)",
    )
    leaking = gauge("anon_rss_growing_processes", "Processes growing anonymous memory past the threshold")
    errors = gauge("detector_errors", "Detectors that could not run on the host")

    for host, entry in report["hosts"].items():
        up.labels(host).set(1 if entry["status"] == "ok" else 0)
        status.labels(host, entry["status"]).set(1)
        if entry.get("duration_ms") is not None:
            host_seconds.labels(host).set(float(entry["duration_ms"]) / 1000.0)
        memcg = entry.get("facts", {}).get("memcg") or {}
        for g, key in (
            (memcg_total, "total"),
            (memcg_live, "live"),
            (memcg_zombies, "zombies"),
            (headroom, "id_headroom"),
        ):
            if memcg.get(key) is not None:
                g.labels(host).set(memcg[key])
        if entry["status"] == "ok":
            counts = dict.fromkeys(SEVERITIES, 0)
            for f in entry["findings"]:
                counts[f["severity"]] = counts.get(f["severity"], 0) + 1
            for sev, n in counts.items():
                findings.labels(host, sev).set(n)
            by_check: dict[str, int] = {}
            for f in entry["findings"]:
                if f["severity"] in ("warning", "critical") or f["check"] == "ucx_mmap_hooks":
                    by_check[f["check"]] = by_check.get(f["check"], 0) + 1
            looping.labels(host).set(by_check.get("crashloop_unit", 0))
            ucx_risky.labels(host).set(by_check.get("ucx_mmap_hooks", 0))
            leaking.labels(host).set(by_check.get("anon_rss_growth", 0))
            errors.labels(host).set(len(entry.get("errors") or []))

    Gauge(f"{PREFIX}_scan_duration_seconds", "Wall time of the whole scan", registry=reg).set(
        float(report.get("duration_s", 0.0))
    )
    summary = Gauge(f"{PREFIX}_scan_hosts", "Hosts in the scan by status", ["status"], registry=reg)
    for key in ("ok", "unreachable", "failed"):
        summary.labels(key).set(report["summary"][key])
    return reg


def write_textfile(report: dict[str, Any], path: Path) -> None:
    """Write the report's metrics to PATH atomically (a temp file renamed into place)."""
    write_to_textfile(str(path), build_registry(report))
