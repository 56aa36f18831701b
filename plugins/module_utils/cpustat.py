# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The cpu_starvation detector: per-CPU system + irq + softirq time between two samples.

In the Pinterest incident one core spent seconds at 100% system time (kubelet walking zombie
memory cgroups); the ENA driver's queue on that core missed its 5 s TX watchdog and the NIC reset.
A host-wide average hides that, so this looks at every CPU on its own.

Each sample reads three small files, each O(CPUs), never anything per process:

- ``/proc/stat`` ``cpuN`` lines (USER_HZ ticks: user nice system idle iowait irq softirq steal
  guest guest_nice; guest time is already inside user/nice and is not added again);
- ``/proc/softirqs`` per-CPU counts (NET_RX, NET_TX, TIMER, RCU, ...): which softirq ran on the hot
  CPU, the NIC's receive/transmit work included;
- ``/proc/interrupts`` per-CPU counts: which device's interrupts landed there (an ENA queue
  ``ens5-Tx-Rx-3``, say).

With one sample there is no rate (the counters run since boot): the facts say so and there is no
finding. With two samples (``sample_seconds``) a CPU whose kernel share (system + irq + softirq)
of the interval reaches ``cpu_system_warning_pct`` is a warning, ``cpu_system_critical_pct`` a
critical finding; the finding names the CPUs, their shares and the top softirqs and interrupts
that grew on them.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import DetectorError, make_finding

CHECK = "cpu_starvation"
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
# guest and guest_nice are already counted in user and nice
_TOTAL = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
KERNEL = ("system", "irq", "softirq")
DEFAULT_THRESHOLDS = {"cpu_system_warning_pct": 50.0, "cpu_system_critical_pct": 90.0}
NEEDS_SAMPLES = "a per-CPU rate needs two samples (--sample-seconds / sample_seconds > 0)"
TOP = 3


class CpuStatError(DetectorError):
    pass


def parse_stat(text, source="/proc/stat"):
    """``{cpu_number: {field: ticks}}`` from the ``cpuN`` lines of ``/proc/stat``."""
    cpus = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        number = fields[0][3:]
        if not number.isdigit():
            raise CpuStatError("parse", source, "line %d: %r is not a cpuN label" % (lineno, fields[0]))
        if len(fields) < 5:
            raise CpuStatError(
                "parse", source, "line %d: %d fields, expected at least 4 counters" % (lineno, len(fields))
            )
        counters = {}
        for name, value in zip(FIELDS, fields[1:]):  # noqa: B905 (3.9 has no strict=)
            if not value.isdigit():
                raise CpuStatError(
                    "parse", source, "line %d: %s %r is not an integer" % (lineno, name, value)
                )
            counters[name] = int(value)
        for name in FIELDS[len(fields) - 1 :]:
            counters[name] = 0  # older kernels have fewer columns
        cpus[int(number)] = counters
    if not cpus:
        raise CpuStatError("parse", source, "no per-CPU (cpuN) lines")
    return cpus


def parse_table(text):
    """``{name: {cpu_number: count}}`` from ``/proc/softirqs`` or ``/proc/interrupts``.

    The header names the CPU columns (``CPU0 CPU1 ...``). Rows with fewer counts than columns
    (``ERR``, ``MIS``) are skipped. An interrupt's name is its device (the last word, e.g.
    ``ens5-Tx-Rx-3``) with its number (``IRQ 45 ens5-Tx-Rx-3``); a named row keeps its label.
    Unreadable input gives an empty table: these only add detail to a finding.
    """
    lines = text.splitlines()
    if not lines:
        return {}
    columns = []
    for word in lines[0].split():
        if not (word.startswith("CPU") and word[3:].isdigit()):
            return {}
        columns.append(int(word[3:]))
    table = {}
    for line in lines[1:]:
        label, _sep, rest = line.partition(":")
        words = rest.split()
        if len(words) < len(columns):
            continue
        counts = words[: len(columns)]
        if not all(word.isdigit() for word in counts):
            continue
        label = label.strip()
        if label.isdigit():
            tail = words[len(columns) :]
            label = "IRQ %s %s" % (label, tail[-1]) if tail else "IRQ " + label
        table[label] = dict((cpu, int(count)) for cpu, count in zip(columns, counts))  # noqa: B905
    return table


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError) as err:
        raise CpuStatError("read", path, err.strerror or str(err))


def _read_optional(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return ""


def sample(proc="/proc", warning_pct=None):
    """One sample: the raw counters (private ``_`` keys) and the facts that need no rate.

    ``warning_pct`` rides along (``_warning_pct``) so that ``add_growth`` details the CPUs that matter.
    """
    started = time.monotonic()
    stat = parse_stat(_read(proc + "/stat"), proc + "/stat")
    softirqs = parse_table(_read_optional(proc + "/softirqs"))
    interrupts = parse_table(_read_optional(proc + "/interrupts"))
    return {
        "sampled": False,
        "cpus": len(stat),
        "reason": NEEDS_SAMPLES,
        "sample_ms": round((time.monotonic() - started) * 1000.0, 3),
        "_stat": stat,
        "_softirqs": softirqs,
        "_interrupts": interrupts,
        "_warning_pct": warning_pct,
    }


def shares(before, after):
    """Percent of the interval per field for one CPU, plus ``kernel_pct``; None when no tick passed."""
    deltas = dict((name, max(0, after.get(name, 0) - before.get(name, 0))) for name in FIELDS)
    total = sum(deltas[name] for name in _TOTAL)
    if total <= 0:
        return None  # offline, or the interval was shorter than a tick
    out = dict(("%s_pct" % name, round(100.0 * deltas[name] / total, 1)) for name in _TOTAL)
    out["kernel_pct"] = round(100.0 * sum(deltas[name] for name in KERNEL) / total, 1)
    out["ticks"] = total
    return out


def _top(first, second, cpu, limit=TOP):
    grown = []
    for name, counts in second.items():
        delta = counts.get(cpu, 0) - first.get(name, {}).get(cpu, 0)
        if delta > 0:
            grown.append((delta, name))
    grown.sort(key=lambda item: (-item[0], item[1]))
    return [{"name": name, "delta": delta} for delta, name in grown[:limit]]


def add_growth(first, second, seconds):
    """Per-CPU shares of the interval between two samples, and the CPUs over half the warning mark."""
    facts = dict((k, v) for k, v in second.items() if not k.startswith("_"))
    if seconds <= 0:
        return facts
    warning_pct = first.get("_warning_pct")
    if warning_pct is None:
        warning_pct = DEFAULT_THRESHOLDS["cpu_system_warning_pct"]
    per_cpu = {}
    busiest = []
    for cpu, after in sorted(second["_stat"].items()):
        before = first["_stat"].get(cpu)
        if before is None:
            continue  # came online between the samples
        share = shares(before, after)
        if share is None:
            continue
        per_cpu[str(cpu)] = share["kernel_pct"]
        busiest.append(dict(share, cpu=cpu))
    busiest.sort(key=lambda entry: (-entry["kernel_pct"], entry["cpu"]))
    hot = []
    for entry in busiest:
        if entry["kernel_pct"] < warning_pct / 2.0:
            break
        entry["top_softirqs"] = _top(first["_softirqs"], second["_softirqs"], entry["cpu"])
        entry["top_interrupts"] = _top(first["_interrupts"], second["_interrupts"], entry["cpu"])
        hot.append(entry)
    facts.update(
        sampled=True,
        reason=None,
        window_seconds=round(float(seconds), 3),
        kernel_pct=per_cpu,
        max_kernel_pct=busiest[0]["kernel_pct"] if busiest else None,
        max_cpu=busiest[0]["cpu"] if busiest else None,
        hot=hot,
    )
    return facts


def evaluate(facts, thresholds=None):
    """One finding naming every CPU at or over the warning share (critical when any is over critical)."""
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    if not facts.get("sampled"):
        return []
    over = [
        entry for entry in facts.get("hot", []) if entry["kernel_pct"] >= limits["cpu_system_warning_pct"]
    ]
    if not over:
        return []
    severity = "critical" if over[0]["kernel_pct"] >= limits["cpu_system_critical_pct"] else "warning"
    parts = []
    for entry in over[:4]:
        text = "CPU %d %s%% (system %s, irq %s, softirq %s)" % (
            entry["cpu"],
            _num(entry["kernel_pct"]),
            _num(entry["system_pct"]),
            _num(entry["irq_pct"]),
            _num(entry["softirq_pct"]),
        )
        if entry["top_softirqs"]:
            text += "; softirqs " + ", ".join(
                "%s +%d" % (s["name"], s["delta"]) for s in entry["top_softirqs"]
            )
        parts.append(text)
    if len(over) > 4:
        parts.append("%d more CPUs" % (len(over) - 4))
    summary = "%d of %d CPUs spent >= %s%% of %ss in the kernel (system+irq+softirq): %s" % (
        len(over),
        facts.get("cpus", len(facts.get("kernel_pct", {}))),
        _num(limits["cpu_system_warning_pct"]),
        _num(facts["window_seconds"]),
        "; ".join(parts),
    )
    data = {
        "cpus": over,
        "window_seconds": facts["window_seconds"],
        "warning_pct": limits["cpu_system_warning_pct"],
        "critical_pct": limits["cpu_system_critical_pct"],
    }
    return [make_finding(CHECK, severity, summary, data)]


def _num(value):
    return ("%d" % value) if value == int(value) else ("%.1f" % value)
