# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The gpu_health detector: NVIDIA Xid events in the kernel log, and ECC / row-remap counters.

OpenAI's 7,500-node fleet runs passive GPU checks on every node (ECC and Xid errors) and cordons or
drains a node that fails them. This detector is that check, in the same single scan round trip.

Sources (each optional; a host with neither has empty facts, no finding and no error):

- the kernel log (``kernlog``: ``/dev/kmsg`` or the journal, one read shared with ena_resets),
  lines of the NVIDIA driver such as::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)

  parsed into code, PCI address, pid and process name (when present), the rest of the message
  and the time. A "NVRM: The NVIDIA GPU 0000:b3:00.0 ... has fallen off the bus" line without an
  Xid (newer drivers at probe time) counts as Xid 79;
- ``nvidia-smi`` when the binary exists, ONE call::

    nvidia-smi --query-gpu=index,pci.bus_id,uuid,name,ecc.mode.current,
      ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,
      ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.correctable,
      remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure
      --format=csv,noheader,nounits

  ``[N/A]`` / ``[Not Supported]`` (an H200 has no page retirement: ``retired_pages.pending`` is
  ``[N/A]``) become null. "No devices were found" is no GPU, not an error; any other failure of
  an installed nvidia-smi is a warning finding (a GPU node whose driver cannot reach its GPUs).

Severity of Xid events follows the "Resolution Bucket (Immediate Action)" of NVIDIA's Xid catalog
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) for Ampere and newer:

=============================================  ==========  ==============================================
Xid                                            severity    catalog immediate action / meaning
=============================================  ==========  ==============================================
79 (fallen off the bus)                        critical    RESTART_BM: reboot the node
48 (double-bit ECC), 171/172 (its details)     critical    WORKFLOW_XID_48: reset GPU or reboot
74 (NVLink), 144-150 (NVLink5)                 critical    WORKFLOW_NVLINK_ERR: reset GPU or reboot
46, 62, 64, 95, 109, 110, 119, 120, 136, 140,  critical    RESET_GPU (stopped processing, micro-
143, 155, 158                                              controller halt, remap failure, uncontained
                                                           ECC, GSP timeout/error, ...)
63 (row remap pending), 92 (high SBE rate),    warning     memory is being repaired: a reset applies it;
94 (contained ECC), 156/157 (resource                      94 kills one app, "reset the GPU when
retirement)                                                convenient"
154 (recovery action changed)                  by action   "Node Reboot Required", "GPU Reset Required",
                                                           "Drain and Reset": critical; "Drain P2P":
                                                           warning; "None": info
RESTART_APP / IGNORE codes (13, 31, 43, 45,    info        application faults; the GPU stays healthy
...: ``APP_XIDS``)
any other code                                 warning     not in this table: look it up in the catalog
=============================================  ==========  ==============================================

nvidia-smi counters:

- ``remapped_rows.failure`` Yes (the GPU ran out of spare rows: RMA) or uncorrectable volatile ECC
  errors > 0 (since the driver loaded; the GPU needs a reset): critical;
- ``remapped_rows.pending`` Yes or ``retired_pages.pending`` Yes (a repair waits for a GPU reset):
  warning;
- aggregate (lifetime) uncorrectable errors, correctable counts: facts only.

The kernel log covers the current boot, so an Xid stays reported until the node reboots; with two
samples the finding also counts the events new in the window.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.fleetops.node.plugins.module_utils import kernlog
from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    fmt_int,
    make_finding,
    severity_rank,
    which,
)

CHECK = "gpu_health"
# Present while the NVIDIA kernel driver is loaded: only then can Xid lines reach the kernel log.
NVIDIA_DRIVER_DIR = "/sys/module/nvidia"
SMI_FIELDS = (
    "index", "pci.bus_id", "uuid", "name", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
)  # fmt: skip
SMI_ARGS = ["--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]
_KEYS = (
    "index", "pci_bus_id", "uuid", "name", "ecc_mode", "ecc_uncorrected_volatile", "ecc_corrected_volatile",
    "ecc_uncorrected_aggregate", "retired_pages_pending", "remapped_rows_correctable",
    "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
)  # fmt: skip
_INTS = ("index", "ecc_uncorrected_volatile", "ecc_corrected_volatile", "ecc_uncorrected_aggregate",
         "remapped_rows_correctable", "remapped_rows_uncorrectable")  # fmt: skip
_BOOLS = ("retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure")
_NOT_AVAILABLE = (
    "[N/A]",
    "N/A",
    "[Not Supported]",
    "Not Supported",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "",
)

CRITICAL_XIDS = frozenset(
    [46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 158, 171, 172]
    + list(range(144, 151))
)
WARNING_XIDS = frozenset([63, 92, 94, 156, 157])
# RESTART_APP / IGNORE in the catalog: an application's fault, the GPU is fine
APP_XIDS = frozenset(
    [8, 11, 13, 14, 25, 31, 32, 37, 38, 39, 40, 41, 43, 44, 45, 60, 66, 67, 68, 69, 70, 71, 72, 75, 76, 77, 80,
     82, 83, 84, 85, 86, 88, 89, 93, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 121, 126,
     127, 128, 129, 130, 131, 132, 133, 134, 135, 137, 139, 141, 160, 161]
)  # fmt: skip
RECOVERY_SEVERITY = {
    "none": "info",
    "drain p2p": "warning",
    "gpu reset required": "critical",
    "node reboot required": "critical",
    "drain and reset": "critical",
}
_XID = kernlog.LazyPattern(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_PID = kernlog.LazyPattern(r"^pid=(?P<pid>'[^']*'|[^,\s]+),\s*")
_NAME = kernlog.LazyPattern(r"^name=(?P<name>'[^']*'|[^,]+?),\s*")
_RECOVERY = kernlog.LazyPattern(
    r"GPU recovery action changed from (?P<from_code>0x[0-9a-fA-F]+) \((?P<from_name>[^)]*)\) to "
    r"(?P<to_code>0x[0-9a-fA-F]+) \((?P<to_name>[^)]*)\)"
)
_FALLEN = kernlog.LazyPattern(r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F:.]+)")
MAX_EVENTS = 50


class GpuError(DetectorError):
    pass


def parse_xid(message):
    """``{code, pci, pid, name, detail, recovery_action}`` of one ``NVRM: Xid`` message, or None."""
    match = _XID.search(message)
    if not match:
        return None
    rest = match.group("rest")
    pid = name = None
    pid_match = _PID.match(rest)
    if pid_match:
        pid = pid_match.group("pid").strip("'")
        rest = rest[pid_match.end() :]
        name_match = _NAME.match(rest)
        if name_match:
            name = name_match.group("name").strip("'")
            rest = rest[name_match.end() :]
    event = {
        "code": int(match.group("code")),
        "pci": match.group("pci").lower(),
        "pid": int(pid) if pid and pid.isdigit() else None,
        "name": None if name in (None, "<unknown>") else name,
        "detail": rest.strip()[:300],
        "recovery_action": None,
    }
    recovery = _RECOVERY.search(rest)
    if recovery:
        event["recovery_action"] = {
            "from": recovery.group("from_name"),
            "to": recovery.group("to_name"),
            "to_code": int(recovery.group("to_code"), 16),
        }
    return event


def parse_log(lines):
    """Xid events (oldest first) from kernel-log ``(epoch, message)`` lines.

    "NVRM: The NVIDIA GPU 0000:b3:00.0" followed by "NVRM: fallen off the bus ..." (newer drivers log
    it at probe time, without an Xid) counts as an Xid 79 on that GPU unless an Xid 79 names it too.
    """
    events = []
    gpu_named = None
    fallen = []
    for stamp, message in lines:
        event = parse_xid(message)
        if event is not None:
            event["time"] = stamp
            events.append(event)
            continue
        named = _FALLEN.search(message)
        if named:
            gpu_named = named.group("pci").lower()
        if "fallen off the bus" in message:
            fallen.append({"code": 79, "pci": gpu_named or "unknown", "pid": None, "name": None,
                           "detail": "fallen off the bus (no Xid line)", "recovery_action": None, "time": stamp})  # fmt: skip
            gpu_named = None
    seen = set(_bus(e["pci"]) for e in events if e["code"] == 79)
    for event in fallen:
        if _bus(event["pci"]) not in seen:
            events.append(event)
    events.sort(key=lambda e: e["time"])
    return events


def _bus(pci):
    """``0000:b3:00`` for both ``0000:b3:00`` (Xid lines) and ``0000:b3:00.0`` (a full PCI address)."""
    return pci.split(".")[0]


def xid_severity(event):
    """info / warning / critical for one Xid event (the table in the module docstring)."""
    code = event["code"]
    if code == 154:
        action = (event.get("recovery_action") or {}).get("to", "")
        return RECOVERY_SEVERITY.get(action.strip().lower(), "warning")
    if code in CRITICAL_XIDS:
        return "critical"
    if code in WARNING_XIDS:
        return "warning"
    if code in APP_XIDS:
        return "info"
    return "warning"


def _value(key, raw):
    raw = raw.strip()
    if raw in _NOT_AVAILABLE:
        return None
    if key in _INTS:
        return int(raw) if raw.isdigit() else None
    if key in _BOOLS:
        return {"yes": True, "no": False}.get(raw.lower())
    return raw


def parse_smi_csv(text):
    """One dict per GPU from the ``SMI_ARGS`` query's CSV (no header, no units)."""
    gpus = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(_KEYS):
            raise GpuError(
                "parse",
                "nvidia-smi --query-gpu output",
                "line %d: %d fields, expected %d: %r" % (lineno, len(fields), len(_KEYS), line[:120]),
            )
        gpu = dict((key, _value(key, raw)) for key, raw in zip(_KEYS, fields))  # noqa: B905 (3.9 has no strict=)
        if gpu["pci_bus_id"]:
            gpu["pci_bus_id"] = gpu["pci_bus_id"].lower()
        gpus.append(gpu)
    return gpus


def collect(run, log=None, nvidia_smi=None, driver_dir=NVIDIA_DRIVER_DIR):
    """One sample. ``run(argv) -> (rc, stdout, stderr)``; ``log`` is a ``kernlog.read`` result."""
    log = log if log is not None else kernlog.read(run)
    events = parse_log(log["lines"])
    smi = nvidia_smi or which("nvidia-smi")
    gpus = []
    smi_error = None
    if smi is not None:
        rc, out, err = run([smi] + SMI_ARGS)
        text = (out or "") + (err or "")
        if rc != 0 and "No devices were found" in text:
            pass  # the tool is installed on a host without GPUs
        elif rc != 0:
            smi_error = (text.strip().splitlines() or ["exit %d" % rc])[0][:200]
        else:
            gpus = parse_smi_csv(out)
    return {
        "nvidia_smi": smi is not None,
        "nvidia_driver": os.path.isdir(driver_dir),
        "smi_error": smi_error,
        "gpus": gpus,
        "kernel_log": kernlog.summary(log),
        "xid": summarize(events),
        "xid_events": events[-MAX_EVENTS:],
        "xid_total": len(events),
    }


def summarize(events):
    """``{code: {count, severity, pcis, last}}`` (code as a string, for JSON) over every event."""
    by_code = {}
    for event in events:
        severity = xid_severity(event)
        entry = by_code.setdefault(
            str(event["code"]), {"count": 0, "severity": severity, "pcis": [], "last": None}
        )
        entry["count"] += 1
        if severity_rank(severity) > severity_rank(entry["severity"]):
            entry["severity"] = severity  # Xid 154 can escalate (None -> Node Reboot Required)
        if event["pci"] not in entry["pcis"]:
            entry["pcis"].append(event["pci"])
        entry["last"] = event
    return by_code


def add_growth(first, second, seconds):
    """Xid events logged between the two samples (``new_xid_events``)."""
    facts = dict(second)
    if seconds <= 0:
        return facts
    facts["window_seconds"] = round(float(seconds), 3)
    facts["new_xid_events"] = max(0, second.get("xid_total", 0) - first.get("xid_total", 0))
    return facts


def _gpu_problems(gpu):
    problems = []
    if gpu.get("remapped_rows_failure"):
        problems.append(("critical", "row remapping FAILED (out of spare rows: RMA)"))
    if gpu.get("ecc_uncorrected_volatile"):
        problems.append(
            (
                "critical",
                "%s uncorrectable ECC errors since the driver loaded"
                % fmt_int(gpu["ecc_uncorrected_volatile"]),
            )
        )
    if gpu.get("remapped_rows_pending"):
        problems.append(("warning", "a row remap is pending (reset the GPU to apply it)"))
    if gpu.get("retired_pages_pending"):
        problems.append(("warning", "a page retirement is pending (reset the GPU to apply it)"))
    return problems


def evaluate(facts):
    """One finding for the host when an Xid or an ECC / remap counter says a GPU is unwell."""
    worst = None
    parts = []
    by_code = facts.get("xid", {})
    for code, entry in sorted(
        by_code.items(), key=lambda item: (-severity_rank(item[1]["severity"]), int(item[0]))
    ):
        if worst is None or severity_rank(entry["severity"]) > severity_rank(worst):
            worst = entry["severity"]
        last = entry["last"]
        if code == "154":
            what = "recovery action: %s" % (last["recovery_action"] or {}).get("to", "?")
        else:
            what = last["detail"][:80]
        parts.append("Xid %s x%s on %s (%s, %s)" % (code, fmt_int(entry["count"]), ", ".join(entry["pcis"]), what,
                                                    entry["severity"]))  # fmt: skip
    for gpu in facts.get("gpus", []):
        for severity, text in _gpu_problems(gpu):
            if worst is None or severity_rank(severity) > severity_rank(worst):
                worst = severity
            parts.append("GPU %s (%s): %s" % (gpu.get("index"), gpu.get("pci_bus_id"), text))
    if facts.get("smi_error"):
        if worst is None or severity_rank("warning") > severity_rank(worst):
            worst = "warning"
        parts.append("nvidia-smi failed: %s" % facts["smi_error"])
    if worst is None:
        return []
    summary = "GPU health: " + "; ".join(parts)
    if facts.get("new_xid_events"):
        summary += "; %s new Xid event(s) in the last %ss" % (
            fmt_int(facts["new_xid_events"]),
            facts["window_seconds"],
        )
    data = {
        "xid": by_code,
        "gpus": [dict(gpu, problems=[text for _severity, text in _gpu_problems(gpu)]) for gpu in facts.get("gpus", [])
                 if _gpu_problems(gpu)],
        "smi_error": facts.get("smi_error"),
        "new_xid_events": facts.get("new_xid_events"),
    }  # fmt: skip
    return [make_finding(CHECK, worst, summary, data)]
