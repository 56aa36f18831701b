"""Prometheus textfile-collector output for a scan (node_exporter's --collector.textfile.directory).

The Pinterest lesson was "keep metrics for rare transient events": zombie counts, ID headroom and
findings are exactly that, per host, at every scan. Written atomically (fleetops.util.atomic_write).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from fleetops.ansible.facts import severities
from fleetops.util import atomic_write

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
    check_findings = gauge(
        "check_findings",
        "Findings by detector and severity, for every detector that ran on the host",
        ("host", "check", "severity"),
    )
    looping = gauge("crashloop_units", "Services crash looping (crashloop_unit findings of warning or worse)")
    ucx_risky = gauge(
        "ucx_risky_processes",
        "Processes with UCX mmap hooks on and an unbounded rcache (ucx_mmap_hooks findings)",
    )
    leaking = gauge("anon_rss_growing_processes", "Processes growing anonymous memory past the threshold")
    unexpected = gauge(
        "unexpected_units", "Enabled units not on the fleet's allow-list (unexpected_unit findings)"
    )
    enabled_units = gauge("enabled_units", "Unit files enabled on the host (unexpected_unit facts)")
    host_info = gauge(
        "host_info", "1, labelled with the host's kernel and OS (drift)", ("host", "kernel", "os")
    )
    errors = gauge("detector_errors", "Detectors that could not run on the host")
    ena_resets = gauge(
        "ena_resets", "ENA NIC resets since the driver loaded, all ENA interfaces (ena_resets)"
    )
    ena_reset_fail = gauge("ena_reset_failures", "ENA resets that failed (reset_fail), all ENA interfaces")
    cpu_kernel = gauge(
        "cpu_system_max_pct",
        "Highest per-CPU share of the sampling window in the kernel (system+irq+softirq); only when sampled",
    )
    xid_events = gauge(
        "gpu_xid_events", "NVIDIA Xid events in the kernel log this boot, by severity", ("host", "severity")
    )
    ecc_uncorrected = gauge(
        "gpu_ecc_uncorrected", "Uncorrectable ECC errors since the driver loaded (volatile), all GPUs"
    )
    remap_flags = gauge("gpu_remap_problems", "GPUs with a pending row remap or a remap failure")

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
            counts = Counter((f["check"], f["severity"]) for f in entry["findings"])
            for sev in _severities(counts):
                findings.labels(host, sev).set(sum(n for (_, s), n in counts.items() if s == sev))
            for check in dict.fromkeys([*(entry.get("checks") or ()), *(c for c, _ in counts)]):
                for sev in _severities(counts):
                    check_findings.labels(host, check, sev).set(counts[check, sev])
            by_check: Counter[str] = Counter()
            for (check, sev), n in counts.items():
                if sev in ("warning", "critical") or check == "ucx_mmap_hooks":
                    by_check[check] += n
            looping.labels(host).set(by_check.get("crashloop_unit", 0))
            ucx_risky.labels(host).set(by_check.get("ucx_mmap_hooks", 0))
            leaking.labels(host).set(by_check.get("anon_rss_growth", 0))
            unexpected.labels(host).set(by_check.get("unexpected_unit", 0))
            units = (entry.get("facts") or {}).get("units") or {}
            if units.get("systemd"):
                enabled_units.labels(host).set(len(units.get("enabled") or ()))
            info = (entry.get("facts") or {}).get("host") or {}
            if info.get("kernel"):
                host_info.labels(host, str(info["kernel"]), str(info.get("os") or "")).set(1)
            errors.labels(host).set(len(entry.get("errors") or []))
            _hardware_gauges(host, entry.get("facts") or {}, ena_resets, ena_reset_fail, cpu_kernel, xid_events,
                             ecc_uncorrected, remap_flags)  # fmt: skip

    Gauge(f"{PREFIX}_scan_duration_seconds", "Wall time of the whole scan", registry=reg).set(
        float(report.get("duration_s", 0.0))
    )
    if report.get("started_at"):
        started = datetime.fromisoformat(str(report["started_at"]))  # "...Z": UTC
        Gauge(
            f"{PREFIX}_scan_timestamp_seconds",
            "Unix time the scan started (the report's started_at): how old the other gauges are",
            registry=reg,
        ).set(started.timestamp())
    summary = Gauge(f"{PREFIX}_scan_hosts", "Hosts in the scan by status", ["status"], registry=reg)
    for key in ("ok", "unreachable", "failed"):
        summary.labels(key).set(report["summary"][key])
    return reg


def _severities(counts: Counter[tuple[str, str]]) -> tuple[str, ...]:
    """Every known severity (a zero each: absent would mean 'not scanned'), plus any other one found."""
    return tuple(dict.fromkeys([*severities(), *(sev for _, sev in counts)]))


def _hardware_gauges(
    host: str,
    facts: dict[str, Any],
    ena_resets: Gauge,
    ena_reset_fail: Gauge,
    cpu_kernel: Gauge,
    xid_events: Gauge,
    ecc_uncorrected: Gauge,
    remap_flags: Gauge,
) -> None:
    """ena_resets, cpu_starvation and gpu_health facts as gauges (a gauge only where its detector ran)."""
    ena = facts.get("ena")
    if ena is not None:
        interfaces = (ena.get("interfaces") or {}).values()
        ena_resets.labels(host).set(sum(i.get("resets") or 0 for i in interfaces))
        ena_reset_fail.labels(host).set(
            sum((i.get("counters") or {}).get("reset_fail", 0) for i in interfaces)
        )
    cpu = facts.get("cpu") or {}
    if cpu.get("sampled") and cpu.get("max_kernel_pct") is not None:
        cpu_kernel.labels(host).set(float(cpu["max_kernel_pct"]))
    gpu = facts.get("gpu")
    if gpu is not None:
        by_severity = dict.fromkeys(severities(), 0)
        for entry in (gpu.get("xid") or {}).values():
            by_severity[entry["severity"]] = by_severity.get(entry["severity"], 0) + int(entry["count"])
        for severity, count in by_severity.items():
            xid_events.labels(host, severity).set(count)
        gpus = gpu.get("gpus") or []
        ecc_uncorrected.labels(host).set(sum(g.get("ecc_uncorrected_volatile") or 0 for g in gpus))
        remap_flags.labels(host).set(
            sum(1 for g in gpus if g.get("remapped_rows_pending") or g.get("remapped_rows_failure"))
        )


def write_textfile(report: dict[str, Any], path: Path) -> None:
    """Write the report's metrics to PATH atomically (a temp file renamed into place)."""
    atomic_write(path, generate_latest(build_registry(report), openmetrics.ALLOWUTF8))
