# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The ena_resets detector: resets of the EC2 Elastic Network Adapter (ENA) driver.

The last link of the Pinterest chain: a core stuck in system time starves the ENA queue it serves,
the driver's TX completion check (or the kernel's netdev TX watchdog, or the device's keep-alive)
fires after 5 s, the driver resets the device and the instance drops off the network for seconds.

Per scan:

- interfaces on the ``ena`` driver: the basename of ``/sys/class/net/IFACE/device/driver``
  (a symlink; virtual interfaces have no ``device``). None: empty facts, no finding, no error. ENA
  reset lines in the kernel log of a host with no ENA interface do not count: an instance without
  the device cannot have its resets, and such a line (written by hand, replayed, or from a driver
  that is not bound to any interface) is noise. They are still counted, as ``ignored_log_lines``
  in the facts (the kernel log is read anyway for gpu_health), so an operator sees them, and a lab
  host without ENA (a VM lab host's NIC is virtio) shows that the detector reads its own log;
- one ``ethtool -S IFACE`` per ENA interface ("NIC statistics:" then ``name: value`` lines). The
  device-wide counters kept (whichever the driver version has) are in ``COUNTERS``: the reset
  counters of ena 2.13+ (``total_resets``, ``reset_fail`` and one per reset reason:
  ``wd_expired`` keep-alive, ``os_netdev_wd`` / ``tx_timeout`` the kernel's TX watchdog,
  ``missing_tx_cmpl``, ``missing_intr``, ...), ``interface_up`` / ``interface_down``, and the ENI
  allowance counters (``bw_in_allowance_exceeded``, ``pps_allowance_exceeded``, ...).
  Per-queue counters are not kept. ENA present without ``ethtool``: a detector error;
- the kernel log (``kernlog``, one read shared with gpu_health): the driver's reset lines
  ("Trigger reset is on", "Device reset completed successfully", "Reset attempt failed. Can not
  reset the device", "Keep alive watchdog timeout.", "TX hasn't completed" / "Found a Tx that
  wasn't completed on time" / "lost tx completions", "Transmit time out") and the kernel's
  "NETDEV WATCHDOG: IFACE (ena): transmit queue N timed out", counted per interface and kind.

Severity (per host, one finding):

- critical: ``reset_fail`` > 0, a "Can not reset the device" line, or at least
  ``ena_resets_critical`` (default 3) resets since the driver loaded;
- warning: any reset or TX timeout since the driver loaded (``total_resets``, ``tx_timeout``,
  ``wd_expired``, ``os_netdev_wd``, ``missing_tx_cmpl``, ... > 0, or reset lines in the log), and
  with two samples any increase between them (named in the summary: the NIC reset during the scan).

Resets are ``total_resets`` where the driver has it, else ``tx_timeout + wd_expired`` (older
drivers count no other reset reason device-wide), else the kernel log's reset lines.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.fleetops.node.plugins.module_utils import kernlog
from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    fmt_int,
    make_finding,
    which,
)

CHECK = "ena_resets"
DRIVER = "ena"
# Device-wide counters kept from `ethtool -S` (those the driver has)
RESET_COUNTERS = (
    "total_resets", "reset_fail", "tx_timeout", "wd_expired", "os_netdev_wd", "missing_tx_cmpl",
    "missing_intr", "missing_first_intr", "suspected_poll_starvation", "missing_admin_interrupt",
    "admin_to", "device_request_reset", "invalid_state", "bad_tx_req_id", "bad_rx_req_id",
    "bad_rx_desc_num", "rx_desc_malformed", "tx_desc_malformed",
)  # fmt: skip
OTHER_COUNTERS = (
    "interface_up", "interface_down", "suspend", "resume", "io_suspend", "io_resume", "admin_q_pause",
    "bw_in_allowance_exceeded", "bw_out_allowance_exceeded", "pps_allowance_exceeded",
    "conntrack_allowance_exceeded", "linklocal_allowance_exceeded", "conntrack_allowance_available",
)  # fmt: skip
COUNTERS = RESET_COUNTERS + OTHER_COUNTERS
# Kernel-log kinds, first match wins
LOG_KINDS = (
    ("reset_failed", kernlog.LazyPattern(r"Can not reset the device|Reset attempt failed|Device reset failed", re.I)),
    ("reset_completed", kernlog.LazyPattern(r"Device reset completed successfully", re.I)),
    ("reset_triggered", kernlog.LazyPattern(r"Trigger reset is on|Reset the device|Resetting the device", re.I)),
    ("keep_alive_timeout", kernlog.LazyPattern(r"Keep alive watchdog timeout", re.I)),
    ("missing_tx_completion", kernlog.LazyPattern(
        r"TX hasn't completed|wasn't completed on time|lost tx completions|missing tx completions", re.I)),
    ("tx_timeout", kernlog.LazyPattern(r"Transmit time out|transmit queue \d+ timed out", re.I)),
)  # fmt: skip
_ENA_LINE = kernlog.LazyPattern(
    r"^ena (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?: (?P<iface>[^\s:]+))?: (?P<msg>.*)$"
)
_WATCHDOG = kernlog.LazyPattern(r"^NETDEV WATCHDOG: (?P<iface>\S+) \(ena\): (?P<msg>.*)$")
DEFAULT_THRESHOLDS = {"ena_resets_critical": 3}
MAX_RECENT = 10


class EnaError(DetectorError):
    pass


def find_interfaces(sys_class_net="/sys/class/net"):
    """``{iface: pci_address}`` of the interfaces bound to the ena driver."""
    found = {}
    try:
        names = sorted(os.listdir(sys_class_net))
    except OSError:
        return found
    for name in names:
        device = os.path.join(sys_class_net, name, "device")
        try:
            driver = os.path.basename(os.readlink(os.path.join(device, "driver")))
        except OSError:
            continue  # virtual interface (lo, veth, bridge): no device or no driver
        if driver == DRIVER:
            try:
                found[name] = os.path.basename(os.readlink(device))
            except OSError:
                found[name] = None
    return found


def parse_ethtool_stats(text, iface="IFACE"):
    """``{counter: value}`` from ``ethtool -S IFACE``: every ``name: integer`` line after the header."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "NIC statistics:":
        raise EnaError(
            "parse",
            "ethtool -S %s output" % iface,
            "no 'NIC statistics:' header (got %r)" % (lines[0][:80] if lines else ""),
        )
    stats = {}
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        name, sep, value = line.strip().rpartition(": ")
        if not sep:
            name, sep, value = line.strip().rpartition(":")
        value = value.strip()
        if not sep or not name or not value.lstrip("-").isdigit():
            raise EnaError(
                "parse",
                "ethtool -S %s output" % iface,
                "line %d: %r is not 'name: integer'" % (lineno, line.strip()[:80]),
            )
        stats[name.strip()] = int(value)
    return stats


def parse_log(lines):
    """``{iface: {kind: count}}`` and the recent matching lines from kernel-log ``(epoch, message)`` lines."""
    counts = {}
    events = []
    for stamp, message in lines:
        match = _ENA_LINE.match(message) or _WATCHDOG.match(message)
        if not match:
            continue
        text = match.group("msg")
        iface = match.groupdict().get("iface") or match.groupdict().get("pci") or "?"
        for kind, pattern in LOG_KINDS:
            if pattern.search(text):
                per = counts.setdefault(iface, {})
                per[kind] = per.get(kind, 0) + 1
                events.append({"time": stamp, "iface": iface, "kind": kind, "message": message[:300]})
                break
    return counts, events


def resets(counters, log_counts):
    """``(count, basis)``: resets since the driver loaded, from the best source there is."""
    if "total_resets" in counters:
        return counters["total_resets"], "total_resets"
    if "tx_timeout" in counters or "wd_expired" in counters:
        return counters.get("tx_timeout", 0) + counters.get("wd_expired", 0), "tx_timeout+wd_expired"
    logged = log_counts.get("reset_triggered", 0) or log_counts.get("reset_completed", 0)
    return logged, "kernel log"


def collect(run, log=None, sys_class_net="/sys/class/net", ethtool=None):
    """One sample. ``run(argv) -> (rc, stdout, stderr)``; ``log`` is a ``kernlog.read`` result (or a
    function returning one), read here when None."""
    interfaces = find_interfaces(sys_class_net)
    if not interfaces:
        facts = {"interfaces": {}, "reason": "no interface uses the ena driver"}
        if log is not None:  # the caller's (shared) read: counted, never judged (module docstring)
            if callable(log):
                log = log()
            ignored = sum(sum(kinds.values()) for kinds in parse_log(log["lines"])[0].values())
            facts["ignored_log_lines"] = ignored
            if ignored:
                facts["reason"] += (
                    "; %d ENA driver line(s) in the kernel log ignored: no ENA device here to have reset"
                    % ignored
                )
        return facts
    ethtool = ethtool or which("ethtool")
    if ethtool is None:
        raise EnaError(
            "run",
            "ethtool -S",
            "ethtool is not installed, and %s use the ena driver (install the "
            "ethtool package)" % ", ".join(sorted(interfaces)),
        )
    if callable(log):
        log = log()  # read the kernel log only on a host that has ENA interfaces
    log = log if log is not None else kernlog.read(run)
    log_counts, events = parse_log(log["lines"])
    facts_ifaces = {}
    for iface, pci in sorted(interfaces.items()):
        rc, out, err = run([ethtool, "-S", iface])
        if rc != 0:
            raise EnaError("run", "ethtool -S %s" % iface, (err or out).strip()[:200] or "exit %d" % rc)
        stats = parse_ethtool_stats(out, iface)
        counters = dict((name, stats[name]) for name in COUNTERS if name in stats)
        per_log = dict(log_counts.get(iface, {}))
        if pci is not None:
            # dev_err lines name the PCI device, not the interface
            for kind, count in log_counts.get(pci, {}).items():
                per_log[kind] = per_log.get(kind, 0) + count
        count, basis = resets(counters, per_log)
        facts_ifaces[iface] = {
            "pci": pci,
            "counters": counters,
            "resets": count,
            "resets_basis": basis,
            "log": per_log,
        }
    return {
        "interfaces": facts_ifaces,
        "reason": None,
        "kernel_log": kernlog.summary(log),
        "recent": [e for e in events if e["iface"] in interfaces or e["iface"] in interfaces.values()][
            -MAX_RECENT:
        ],
        "_read_at": log["read_at"],
    }


def add_growth(first, second, seconds):
    """Counter and kernel-log increases per interface between two samples."""
    facts = dict(second)
    if seconds <= 0 or not second.get("interfaces"):
        return facts
    facts["window_seconds"] = round(float(seconds), 3)
    interfaces = {}
    for iface, data in second["interfaces"].items():
        before = first.get("interfaces", {}).get(iface)
        if before is None:
            interfaces[iface] = dict(data, increase=None)
            continue
        increase = {}
        for name, value in data["counters"].items():
            if name not in RESET_COUNTERS:
                continue  # allowance counters grow with traffic shaping, not resets
            old = before["counters"].get(name)
            if old is not None and value > old:
                increase[name] = value - old  # a driver reload resets counters: no increase then
        for kind, value in data["log"].items():
            old = before["log"].get(kind, 0)
            if value > old:
                increase["log:" + kind] = value - old
        interfaces[iface] = dict(data, increase=increase)
    facts["interfaces"] = interfaces
    return facts


def _reset_signals(data):
    """Counters and log kinds that mean a reset or a TX stall happened (name -> count)."""
    signals = dict((name, value) for name, value in data["counters"].items()
                   if name in RESET_COUNTERS and value > 0)  # fmt: skip
    for kind, value in data["log"].items():
        if value > 0:
            signals["log:" + kind] = value
    return signals


def evaluate(facts, thresholds=None):
    """One finding for the host when any ENA interface reset or timed out (see the module docstring)."""
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    severity = None
    parts = []
    data = {}
    for iface, info in sorted(facts.get("interfaces", {}).items()):
        signals = _reset_signals(info)
        increase = info.get("increase") or {}
        if not signals and not increase:
            continue
        failed = info["counters"].get("reset_fail", 0) > 0 or info["log"].get("reset_failed", 0) > 0
        many = info["resets"] >= limits["ena_resets_critical"]
        level = "critical" if failed or many else "warning"
        if severity != "critical":
            severity = level
        text = "%s: %s resets since the driver loaded (%s)" % (
            iface,
            fmt_int(info["resets"]),
            info["resets_basis"],
        )
        shown = ", ".join("%s %s" % (name, fmt_int(value)) for name, value in sorted(signals.items())
                          if name not in ("total_resets",))  # fmt: skip
        if shown:
            text += "; " + shown
        if increase:
            text += "; +%s in the last %ss" % (
                ", +".join("%s %s" % (fmt_int(value), name) for name, value in sorted(increase.items())),
                facts.get("window_seconds"),
            )
        if failed:
            text += "; a reset FAILED"
        parts.append(text)
        data[iface] = dict(info, signals=signals)
    if severity is None:
        return []
    summary = "ENA NIC reset or TX timeout: " + "; ".join(parts)
    finding_data = {"interfaces": data, "ena_resets_critical": limits["ena_resets_critical"],
                    "window_seconds": facts.get("window_seconds"), "recent": facts.get("recent", [])}  # fmt: skip
    return [make_finding(CHECK, severity, summary, finding_data)]
