# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The anon_rss_growth detector, and the /proc helpers the process detectors share.

Processes that grow their anonymous memory fast (the symptom of the Mistral / UCX leak, whatever
its cause), measured with two samples ``sample_seconds`` apart.

Cost, measured on a 6.18 kernel (1,081 processes of ~80 mappings each; see
bench/ucx_process_scan_cost.py):

- ``/proc/PID/statm`` is O(1): the mm's RSS counters, no page-table walk, no mmap_lock;
  ~7 us a process. ``resident - shared`` of statm is the MM_ANONPAGES counter (``RssAnon``).
- ``/proc/PID/stat`` is O(1) as well (~10 us): start time (to tell a reused PID) and comm.
- ``/proc/PID/smaps_rollup`` walks every page table entry of every mapping under the mmap_lock:
  ~90 us for a small process, and ~13 ms per GiB resident (26.5 ms for a 2 GiB process). On a GPU
  node whose inference workers hold tens of GiB each, reading it for every process twice would
  cost seconds and stall the very processes that map and unmap most.
- ``/proc/PID/maps`` is O(mappings): ~75 us for 80 mappings.

So both samples read statm + stat of every process (~20 ms for 1,000 processes); only the
processes whose anonymous memory grew at least at ``CANDIDATE_FRACTION`` of the threshold get
their ``smaps_rollup`` (Anonymous, Rss, Swap) and mapping count read, once, at the end of the
window, for the finding. The rate itself comes from the statm counters at both ends. Since
kernel 6.2 those counters are per-CPU (percpu_counter): a read can be off by the unfolded
per-CPU batches (tens of pages per CPU the process ran on), far below a 100 MB/min threshold.

Units: the kernel's ``kB`` (and every ``*_kb`` key here) is 1,024 bytes; MB (every ``*_mb*`` key,
option and summary) is 10^6 bytes, so a leak of 90 MiB a minute is 94.4 MB/min.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    fmt_int,
    make_finding,
)

CHECK = "anon_rss_growth"
PROC = "/proc"
PF_KTHREAD = 0x00200000  # include/linux/sched.h
CANDIDATE_FRACTION = 0.5
# A rate needs real growth behind it: less than this in the window is noise (a burst of a few
# pages reads as GB/min over a fraction of a second).
MIN_DELTA_KB = 8192
# Processes younger than this at the first sample are warming up (a Python interpreter maps
# ~10 MB in its first second): not compared.
MIN_AGE_SECONDS = 10.0
SMAPS_FIELDS = ("Rss", "Anonymous", "Swap")
KB = 1024  # the kernel's kB in /proc (statm pages, smaps_rollup, meminfo)
MB = 1000 * 1000
CMDLINE_MAX = 300

DEFAULT_THRESHOLDS = {
    "anon_growth_warning_mb_per_min": 100.0,
    "anon_growth_critical_mb_per_min": 1000.0,
}

_UNIT_SUFFIXES = (".service", ".scope")
_USER_MANAGER_RE = re.compile(r"^user@\d+\.service$")


class ProcsError(DetectorError):
    pass


# ------------------------------------------------------------------------------------- readers


def read_bytes(path, limit=None):
    """The whole content of a (proc) file, or None when it is gone or unreadable.

    ``limit`` stops reading after that many bytes. Reads with os.read in 64 KiB chunks: a seq_file
    fills one chunk per call.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total >= limit:
                break
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def list_pids(proc=PROC):
    """The numeric entries of /proc (thread-group leaders), as ints, sorted."""
    try:
        names = os.listdir(proc)
    except OSError as exc:
        raise ProcsError("list", proc, exc.strerror or str(exc))
    return sorted(int(name) for name in names if name.isdigit())


# ------------------------------------------------------------------------------------- parsers


def parse_stat(text):
    """``(comm, state, flags, starttime)`` from /proc/PID/stat text.

    comm may hold spaces and parentheses: it runs from the first '(' to the last ')'.
    """
    start, end = text.find("("), text.rfind(")")
    if start < 0 or end < start:
        raise ValueError("no (comm) field")
    fields = text[end + 2 :].split()
    # after comm: state(3) ppid pgrp session tty_nr tpgid flags(9) ... starttime(22)
    if len(fields) < 20:
        raise ValueError("%d fields after comm, expected at least 20" % len(fields))
    return text[start + 1 : end], fields[0], int(fields[6]), int(fields[19])


def parse_statm(text):
    """``(size, resident, shared)`` in pages from /proc/PID/statm text."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError("expected 7 fields, got %r" % text[:80])
    return int(fields[0]), int(fields[1]), int(fields[2])


def parse_smaps_rollup(text):
    """{field: kB} of the fields of /proc/PID/smaps_rollup (``Rss``, ``Anonymous``, ``Swap`` ...)."""
    values = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep or " " in key:
            continue  # the [rollup] header line
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0])
    return values


def parse_cmdline(data):
    """A command line from /proc/PID/cmdline bytes (NUL-separated), shortened for reports."""
    text = data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return text if len(text) <= CMDLINE_MAX else text[:CMDLINE_MAX] + "..."


def parse_cgroup_unit(text):
    """``(unit, manager, cgroup)`` of a process from /proc/PID/cgroup text.

    The unit is the innermost ``*.service`` or ``*.scope`` component of the systemd path: the
    unified (``0::``) line when it names a unit, else the v1 ``name=systemd`` line. ``manager`` is
    ``system``, ``user`` (the unit belongs to a user's manager, under ``user@UID.service``) or
    None when no unit owns the process (a container runtime's own cgroup, say).
    """
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths["unified"] = parts[2]
        elif parts[1] == "name=systemd":
            paths["systemd"] = parts[2]
    for key in ("unified", "systemd"):
        path = paths.get(key)
        if not path or path == "/":
            continue
        components = [c for c in path.split("/") if c]
        for index in range(len(components) - 1, -1, -1):
            name = components[index]
            if name.endswith(_UNIT_SUFFIXES):
                outer = components[:index]
                manager = "user" if any(_USER_MANAGER_RE.match(c) for c in outer) else "system"
                return name, manager, path
        return None, None, path
    return None, None, None


def parse_meminfo(text):
    """{field: kB} from /proc/meminfo text."""
    values = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and parts and parts[0].isdigit():
            values[key] = int(parts[0])
    return values


# ------------------------------------------------------------------------------------- sample


def sample(proc=PROC, threshold_mb_per_min=None):
    """One sample of every user process: ``stat`` + ``statm`` (both O(1) in the kernel).

    The per-process numbers stay under the private key ``_procs`` ({pid: [starttime, comm,
    anon_kb, rss_kb, vsz_kb]}); node_health does not return private keys.
    """
    started = time.monotonic()
    page_kb = os.sysconf("SC_PAGE_SIZE") // KB
    procs = {}
    unreadable = 0
    kernel_threads = 0
    own = os.getpid()
    for pid in list_pids(proc):
        if pid == own:
            continue
        base = "%s/%d/" % (proc, pid)
        stat = read_bytes(base + "stat")
        if stat is None:
            continue  # exited between listdir and read
        try:
            comm, _state, flags, starttime = parse_stat(stat.decode("utf-8", "replace"))
        except ValueError as exc:
            raise ProcsError("parse", base + "stat", str(exc))
        if flags & PF_KTHREAD:
            kernel_threads += 1
            continue
        statm = read_bytes(base + "statm")
        if statm is None:
            unreadable += 1
            continue
        try:
            size, resident, shared = parse_statm(statm.decode("ascii", "replace"))
        except ValueError as exc:
            raise ProcsError("parse", base + "statm", str(exc))
        if size == 0:
            kernel_threads += 1  # a zombie or an exiting process: no mm
            continue
        procs[pid] = [starttime, comm, (resident - shared) * page_kb, resident * page_kb, size * page_kb]
    uptime = read_bytes(proc + "/uptime")
    return {
        "sampled": False,
        "processes": len(procs),
        "kernel_threads": kernel_threads,
        "unreadable": unreadable,
        "sample_ms": round((time.monotonic() - started) * 1000.0, 3),
        "basis": "statm (resident - shared = anonymous pages) at both ends of the window",
        "_procs": procs,
        "_proc": proc,
        "_threshold": threshold_mb_per_min,
        "_uptime": float(uptime.split()[0]) if uptime else None,
        "_hz": os.sysconf("SC_CLK_TCK"),
    }


def kb_to_mb(kb):
    """MB (10^6 bytes) in ``kb`` of the kernel's kB (1,024 bytes)."""
    return kb * float(KB) / MB


def _mb_per_min(delta_kb, seconds):
    return round(kb_to_mb(delta_kb) * 60.0 / seconds, 1)


def read_detail(pid, proc=PROC):
    """smaps_rollup (Rss, Anonymous, Swap in kB), the mapping count, cmdline and unit of one process."""
    base = "%s/%d/" % (proc, pid)
    detail = {"smaps_rollup": None, "map_count": None, "cmdline": None, "unit": None, "unit_manager": None}
    rollup = read_bytes(base + "smaps_rollup")
    if rollup is not None:
        values = parse_smaps_rollup(rollup.decode("ascii", "replace"))
        detail["smaps_rollup"] = dict((k.lower() + "_kb", values.get(k)) for k in SMAPS_FIELDS)
    maps = read_bytes(base + "maps")
    if maps is not None:
        detail["map_count"] = maps.count(b"\n")
    cmdline = read_bytes(base + "cmdline", limit=4096)
    if cmdline is not None:
        detail["cmdline"] = parse_cmdline(cmdline)
    cgroup = read_bytes(base + "cgroup")
    if cgroup is not None:
        unit, manager, _path = parse_cgroup_unit(cgroup.decode("utf-8", "replace"))
        detail["unit"], detail["unit_manager"] = unit, manager
    return detail


def add_growth(first, second, seconds, read=read_detail, meminfo_path="/proc/meminfo"):
    """Anonymous-memory growth per process between two samples.

    Processes present at both ends with the same start time, at least ``MIN_AGE_SECONDS`` old at
    the first, are compared; those growing at least ``CANDIDATE_FRACTION`` of the threshold (and
    ``MIN_DELTA_KB``) get ``read(pid)`` (smaps_rollup, mapping count, cmdline, unit) at the end of
    the window.
    """
    facts = dict((k, v) for k, v in second.items() if k != "_procs")
    facts["sample_ms"] = [first.get("sample_ms"), second.get("sample_ms")]
    if seconds <= 0:
        return facts
    threshold = first.get("_threshold")
    if threshold is None:
        threshold = DEFAULT_THRESHOLDS["anon_growth_warning_mb_per_min"]
    floor = threshold * CANDIDATE_FRACTION
    before = first.get("_procs", {})
    after = second.get("_procs", {})
    compared = young = 0
    uptime, hz = first.get("_uptime"), first.get("_hz") or 100
    growing = []
    detail_started = time.monotonic()
    for pid, (starttime, comm, anon_kb, rss_kb, vsz_kb) in sorted(after.items()):
        old = before.get(pid)
        if old is None or old[0] != starttime:
            continue  # new, or a reused PID
        if uptime is not None and uptime - float(starttime) / hz < MIN_AGE_SECONDS:
            young += 1
            continue
        compared += 1
        rate = _mb_per_min(anon_kb - old[2], seconds)
        if rate < floor or anon_kb - old[2] < MIN_DELTA_KB:
            continue
        entry = {
            "pid": pid,
            "comm": comm,
            "anon_mb_per_min": rate,
            "rss_mb_per_min": _mb_per_min(rss_kb - old[3], seconds),
            "vsz_mb_per_min": _mb_per_min(vsz_kb - old[4], seconds),
            "anon_kb": [old[2], anon_kb],
            "rss_kb": [old[3], rss_kb],
        }
        entry.update(read(pid, second.get("_proc") or PROC))
        growing.append(entry)
    growing.sort(key=lambda e: -e["anon_mb_per_min"])
    facts.update(
        sampled=True,
        window_seconds=round(float(seconds), 3),
        compared=compared,
        too_young=young,
        growing=growing,
        detail_ms=round((time.monotonic() - detail_started) * 1000.0, 3),
    )
    meminfo = read_bytes(meminfo_path)
    if meminfo is not None:
        facts["mem_available_kb"] = parse_meminfo(meminfo.decode("ascii", "replace")).get("MemAvailable")
    return facts


def public(facts):
    """Facts without the private (``_``-prefixed) keys a sample carries between its two ends."""
    return dict((k, v) for k, v in facts.items() if not k.startswith("_"))


def evaluate(facts, thresholds=None):
    """One finding per process growing at least the warning threshold, fastest first."""
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    findings = []
    if not facts.get("sampled"):
        return findings
    available = facts.get("mem_available_kb")
    for entry in facts.get("growing", []):
        rate = entry["anon_mb_per_min"]
        if rate < limits["anon_growth_warning_mb_per_min"]:
            continue
        severity = "critical" if rate >= limits["anon_growth_critical_mb_per_min"] else "warning"
        where = " in %s" % entry["unit"] if entry.get("unit") else ""
        text = "pid %d (%s)%s grows anonymous memory at %s MB/min (RSS %s MB/min) over %ss" % (
            entry["pid"],
            entry["comm"],
            where,
            _num(rate),
            _num(entry["rss_mb_per_min"]),
            _num(facts.get("window_seconds", 0)),
        )
        rollup = entry.get("smaps_rollup") or {}
        if rollup.get("anonymous_kb") is not None:
            text += "; now %s MB anonymous" % fmt_int(int(kb_to_mb(rollup["anonymous_kb"])))
        if entry.get("map_count") is not None:
            text += " in %s mappings" % fmt_int(entry["map_count"])
        minutes = None
        if available and rate > 0:
            minutes = round(kb_to_mb(available) / rate, 1)
            text += "; MemAvailable gone in ~%s min at this rate" % _num(minutes)
        data = dict(entry)
        data["minutes_to_exhaust_available"] = minutes
        data["window_seconds"] = facts.get("window_seconds")
        data["thresholds"] = dict(
            (k, limits[k]) for k in ("anon_growth_warning_mb_per_min", "anon_growth_critical_mb_per_min")
        )
        findings.append(make_finding(CHECK, severity, text, data))
    return findings


def growing_pids(facts, thresholds=None):
    """{pid: entry} of the processes at or over the warning threshold (for other detectors)."""
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    if not facts or not facts.get("sampled"):
        return {}
    return dict(
        (e["pid"], e)
        for e in facts.get("growing", [])
        if e["anon_mb_per_min"] >= limits["anon_growth_warning_mb_per_min"]
    )


def _num(value):
    return ("%d" % value) if value == int(value) else ("%.1f" % value)
