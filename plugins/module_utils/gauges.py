# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The fleetops Prometheus gauges, defined once: names, help texts, label names, and their values for one
host's node_health result.

Two writers use this file. The controller's ``fleetops scan --prometheus`` (``fleetops.metrics``, through
``fleetops.ansible.facts``, with prometheus_client) writes every host of a scan; the host timer's runner
(``textfile``, installed by ``playbooks/detector_timer.yml``, stdlib only) writes its own host's, every
interval, with ``render`` below. Host-side series carry the same labels plus ``instance_id`` and ``az``
where the inventory knows them (``IDENTITY_LABELS``).

Stdlib only, Python >= 3.9: this file runs on the hosts.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import math

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    ANSWERED_STATUSES,
    COVERAGE,
    SEVERITIES,
)

PREFIX = "fleetops"

# Who writes a gauge: "host" gauges describe one host (both writers, a series per host); "scan" gauges
# describe one run (the controller's whole scan, or one run of the host timer); "controller" gauges only
# make sense for a scan of many hosts.
SCOPES = ("host", "scan", "controller")

# Labels the host timer adds to every series it writes, when known (the inventory's ec2_instance_id and
# ec2_az, given at install): what an alert needs to name the machine.
IDENTITY_LABELS = ("instance_id", "az")

Gauge = collections.namedtuple("Gauge", ["name", "help", "labels", "scope"])

# In the order the controller's textfile lists them (prometheus_client writes families in creation order).
GAUGES = (
    Gauge("scan_host_up", "1 when the host answered the scan (status ok or partial), else 0", ("host",), "host"),
    Gauge("scan_host_status", "1 for the host's scan status", ("host", "status"), "host"),
    Gauge("scan_host_duration_seconds", "Time the node_health module took on the host", ("host",), "host"),
    Gauge("memcg_total", "Memory cgroups the kernel holds (live + dying; host-wide)", ("host",), "host"),
    Gauge("memcg_live", "Live memory cgroups (directories) in the scanned scope", ("host",), "host"),
    Gauge(
        "memcg_zombies", "Dying (zombie) memory cgroups; absent where it cannot be known", ("host",), "host"
    ),
    Gauge(
        "memcg_id_headroom",
        "Memory cgroup IDs left before the 65,535 limit (mkdir fails: ENOSPC)",
        ("host",),
        "host",
    ),
    Gauge("findings", "Findings by severity", ("host", "severity"), "host"),
    Gauge(
        "check_findings",
        "Findings by detector and severity, for every detector that ran on the host",
        ("host", "check", "severity"),
        "host",
    ),
    Gauge(
        "crashloop_units",
        "Services crash looping (crashloop_unit findings of warning or worse)",
        ("host",),
        "host",
    ),
    Gauge(
        "ucx_risky_processes",
        "Processes with UCX mmap hooks on and an unbounded rcache (ucx_mmap_hooks findings)",
        ("host",),
        "host",
    ),
    Gauge(
        "anon_rss_growing_processes",
        "Processes growing anonymous memory past the threshold",
        ("host",),
        "host",
    ),
    Gauge(
        "unexpected_units",
        "Enabled units not on the fleet's allow-list (unexpected_unit findings)",
        ("host",),
        "host",
    ),
    Gauge("enabled_units", "Unit files enabled on the host (unexpected_unit facts)", ("host",), "host"),
    Gauge("host_info", "1, labelled with the host's kernel and OS (drift)", ("host", "kernel", "os"), "host"),
    Gauge("detector_errors", "Detectors that could not run on the host", ("host",), "host"),
    Gauge(
        "check_coverage",
        "Whether each check that ran could look: %s"
        % ", ".join("%g %s" % (value, level) for level, value in COVERAGE),
        ("host", "check"),
        "host",
    ),
    Gauge(
        "ena_resets",
        "ENA NIC resets since the driver loaded, all ENA interfaces (ena_resets)",
        ("host",),
        "host",
    ),
    Gauge("ena_reset_failures", "ENA resets that failed (reset_fail), all ENA interfaces", ("host",), "host"),
    Gauge(
        "cpu_system_max_pct",
        "Highest per-CPU share of the sampling window in the kernel (system+irq+softirq); only when sampled",
        ("host",),
        "host",
    ),
    Gauge(
        "gpu_xid_events",
        "NVIDIA Xid events in the kernel log this boot, by severity",
        ("host", "severity"),
        "host",
    ),
    Gauge(
        "gpu_ecc_uncorrected",
        "Uncorrectable ECC errors since the driver loaded (volatile), all GPUs",
        ("host",),
        "host",
    ),
    Gauge("gpu_remap_problems", "GPUs with a pending row remap or a remap failure", ("host",), "host"),
    Gauge(
        "unit_findings",
        "Findings that name a systemd unit (crashloop_unit, unexpected_unit, ...), by detector, severity and unit",
        ("host", "check", "severity", "unit"),
        "host",
    ),
    Gauge(
        "gpu_findings",
        "GPU problems (Xid events, ECC, row remaps) by severity and GPU (its PCI bus id)",
        ("host", "severity", "gpu"),
        "host",
    ),
    Gauge("scan_duration_seconds", "Wall time of the whole scan", (), "scan"),
    Gauge(
        "scan_timestamp_seconds",
        "Unix time the scan started (the report's started_at): how old the other gauges are",
        (),
        "scan",
    ),
    Gauge("scan_hosts", "Hosts in the scan by status", ("status",), "controller"),
)
BY_NAME = dict((g.name, g) for g in GAUGES)
_COVERAGE_VALUE = dict(COVERAGE)


def metric_name(name):
    """``"memcg_zombies"`` -> ``"fleetops_memcg_zombies"``."""
    return "%s_%s" % (PREFIX, name)


def severities(found=()):
    """Every known severity worst first (a zero each: absent would mean 'not scanned'), plus any other one
    in ``found``."""
    known = list(reversed(SEVERITIES))
    return tuple(known + [s for s in dict.fromkeys(found) if s not in known])


def host_series(host, entry):
    """The "host" gauges of one host's scan entry (``status``, ``facts``, ``findings``, ``checks``,
    ``errors``, ``duration_ms``: a node_health result plus its status), as ``(name, labels, value)``
    triples with ``labels`` a tuple of values in the gauge's label order. A gauge whose detector did not
    run, or whose value cannot be known, is left out (absent, not zero)."""
    out = []

    def add(name, labels, value):
        out.append((name, (host,) + tuple(labels), value))

    ok = entry["status"] in ANSWERED_STATUSES
    add("scan_host_up", (), 1 if ok else 0)
    add("scan_host_status", (entry["status"],), 1)
    if entry.get("duration_ms") is not None:
        add("scan_host_duration_seconds", (), float(entry["duration_ms"]) / 1000.0)
    facts = entry.get("facts") or {}
    memcg = facts.get("memcg") or {}
    for name, key in (
        ("memcg_total", "total"),
        ("memcg_live", "live"),
        ("memcg_zombies", "zombies"),
        ("memcg_id_headroom", "id_headroom"),
    ):
        if memcg.get(key) is not None:
            add(name, (), memcg[key])
    if not ok:
        return out
    findings = entry.get("findings") or []
    counts = collections.Counter((f["check"], f["severity"]) for f in findings)
    sevs = severities(sev for _check, sev in counts)
    for sev in sevs:
        add("findings", (sev,), sum(n for (_check, s), n in counts.items() if s == sev))
    for check in dict.fromkeys(list(entry.get("checks") or ()) + [c for c, _sev in counts]):
        for sev in sevs:
            add("check_findings", (check, sev), counts[check, sev])
    by_check = collections.Counter()
    for (check, sev), n in counts.items():
        if sev in ("warning", "critical") or check == "ucx_mmap_hooks":
            by_check[check] += n
    add("crashloop_units", (), by_check.get("crashloop_unit", 0))
    add("ucx_risky_processes", (), by_check.get("ucx_mmap_hooks", 0))
    add("anon_rss_growing_processes", (), by_check.get("anon_rss_growth", 0))
    add("unexpected_units", (), by_check.get("unexpected_unit", 0))
    units = facts.get("units") or {}
    if units.get("systemd"):
        add("enabled_units", (), len(units.get("enabled") or ()))
    info = facts.get("host") or {}
    if info.get("kernel"):
        add("host_info", (str(info["kernel"]), str(info.get("os") or "")), 1)
    add("detector_errors", (), len(entry.get("errors") or []))
    for check, cov in (entry.get("coverage") or {}).items():
        add("check_coverage", (check,), _COVERAGE_VALUE[cov["level"]])
    _hardware(facts, add)
    _subjects(findings, add)
    return out


def _hardware(facts, add):
    """ena_resets, cpu_starvation and gpu_health facts as gauges (a gauge only where its detector ran)."""
    ena = facts.get("ena")
    if ena is not None:
        interfaces = (ena.get("interfaces") or {}).values()
        add("ena_resets", (), sum(i.get("resets") or 0 for i in interfaces))
        add("ena_reset_failures", (), sum((i.get("counters") or {}).get("reset_fail", 0) for i in interfaces))
    cpu = facts.get("cpu") or {}
    if cpu.get("sampled") and cpu.get("max_kernel_pct") is not None:
        add("cpu_system_max_pct", (), float(cpu["max_kernel_pct"]))
    gpu = facts.get("gpu")
    if gpu is not None:
        by_severity = dict.fromkeys(severities(), 0)
        for entry in (gpu.get("xid") or {}).values():
            by_severity[entry["severity"]] = by_severity.get(entry["severity"], 0) + int(entry["count"])
        for severity, count in by_severity.items():
            add("gpu_xid_events", (severity,), count)
        gpus = gpu.get("gpus") or []
        add("gpu_ecc_uncorrected", (), sum(g.get("ecc_uncorrected_volatile") or 0 for g in gpus))
        add(
            "gpu_remap_problems",
            (),
            sum(1 for g in gpus if g.get("remapped_rows_pending") or g.get("remapped_rows_failure")),
        )


def _subjects(findings, add):
    """What an alert names: the unit of each finding that has one, the GPU of each GPU problem."""
    by_unit = collections.Counter()
    by_gpu = collections.Counter()
    for finding in findings:
        data = finding.get("data") or {}
        if isinstance(data.get("unit"), str) and data["unit"]:
            by_unit[finding["check"], finding["severity"], data["unit"]] += 1
        if finding["check"] == "gpu_health":
            for code in (data.get("xid") or {}).values():
                for pci in code.get("pcis") or ():
                    by_gpu[code.get("severity") or finding["severity"], str(pci)] += int(
                        code.get("count") or 1
                    )
            for gpu in data.get("gpus") or ():
                pci = gpu.get("pci_bus_id") or gpu.get("index")
                if pci is not None:
                    by_gpu[finding["severity"], str(pci)] += len(gpu.get("problems") or ()) or 1
    for (check, severity, unit), n in sorted(by_unit.items()):
        add("unit_findings", (check, severity, unit), n)
    for (severity, pci), n in sorted(by_gpu.items()):
        add("gpu_findings", (severity, pci), n)


# Prometheus text exposition format 0.0.4 (what node_exporter's textfile collector reads).


def escape_help(text):
    """A HELP text: backslash and line feed escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(value):
    """A label value: backslash, double quote and line feed escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value):
    """A sample value as Prometheus (and prometheus_client) writes it: ``1.0``, ``+Inf``, ``NaN``."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def render(series, extra_labels=()):
    """Text format for ``series`` (``(name, labels, value)`` triples, ``labels`` in the gauge's label
    order), families in GAUGES' order, each with its HELP and TYPE once. ``extra_labels`` (``(name,
    value)`` pairs: the host timer's ``host``, ``instance_id``, ``az``) go on every series, after its
    ``host`` label (first when it has none), except those the gauge has itself. Pairs with an empty value
    are left out (Prometheus reads an empty label as no label)."""
    extra = [(k, v) for k, v in extra_labels if v not in (None, "")]
    by_family = collections.OrderedDict((g.name, []) for g in GAUGES)
    for name, labels, value in series:
        if name not in by_family:
            raise ValueError("unknown gauge %r (not in gauges.GAUGES)" % name)
        gauge = BY_NAME[name]
        if len(labels) != len(gauge.labels):
            raise ValueError("gauge %s takes labels %s, got %d values" % (name, gauge.labels, len(labels)))
        by_family[name].append(([(gauge.labels[i], labels[i]) for i in range(len(labels))], value))
    lines = []
    for gauge in GAUGES:
        samples = by_family[gauge.name]
        if not samples:
            continue
        full = metric_name(gauge.name)
        lines.append("# HELP %s %s" % (full, escape_help(gauge.help)))
        lines.append("# TYPE %s gauge" % full)
        added = [(k, v) for k, v in extra if k not in gauge.labels]
        for pairs, value in samples:
            pairs = pairs[:1] + added + pairs[1:] if pairs and pairs[0][0] == "host" else added + pairs
            text = ",".join('%s="%s"' % (k, escape_label_value(v)) for k, v in pairs)
            lines.append("%s%s %s" % (full, "{%s}" % text if text else "", format_value(value)))
    return "\n".join(lines) + "\n" if lines else ""
