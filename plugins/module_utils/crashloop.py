# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The crashloop_unit detector, and culprit attribution for zombie memory cgroup growth.

One ``systemctl list-units`` and one ``journalctl`` to find candidates, one ``systemctl show`` for
all of them (never one call per unit; ``show`` of every service costs ~1 ms per unit in systemd). ``NRestarts`` (systemd >= 235)
resets on a manual start and at boot, so a rate needs two samples (``sample_seconds``) or, with
one sample, the journal's "Scheduled restart job" entries (MESSAGE_ID
5eb03494b6584870a536b337290809b3) in a window: one ``journalctl`` call for all units.
From the scan's runner and the host timer (root) the ``list-units`` is its D-Bus call instead
(``module_utils/sdbus.py``: no systemctl process), systemctl whenever that cannot answer.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    RESTART_RATE_THRESHOLDS,
    DetectorError,
    fmt_int,
    make_finding,
    restart_rate_severity,
)
from ansible_collections.fleetops.node.plugins.module_utils.sdbus import BusError
from ansible_collections.fleetops.node.plugins.module_utils.systemd import is_systemd_host, parse_show

CHECK = "crashloop_unit"
RESTART_MESSAGE_ID = "5eb03494b6584870a536b337290809b3"
SHOW_PROPS = (
    "Id,LoadState,ActiveState,SubState,Result,NRestarts,ExecMainStatus,ExecMainCode,UnitFileState,"
    "UnitFilePreset,FragmentPath,Restart,ActiveEnterTimestampMonotonic,InactiveEnterTimestampMonotonic"
)
VENDOR_DIRS = ("/lib/systemd/", "/usr/lib/systemd/", "/usr/local/lib/systemd/")
# Where journald keeps the system journal (persistent, volatile): <dir>/<machine-id>/system.journal.
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")
FAILED_RESULTS = ("exit-code", "signal", "core-dump", "watchdog", "timeout", "start-limit-hit", "oom-kill")

DEFAULT_THRESHOLDS = dict(
    RESTART_RATE_THRESHOLDS,
    crashloop_min_restarts=3,
    journal_window_seconds=600,
    # memory cgroups piling up this fast (per minute) name their likely culprits (attribute_culprits)
    zombie_growth_warning_per_min=10.0,
)


class CrashloopError(DetectorError):
    pass


def parse_units(text):
    """Service facts from ``systemctl show`` text: {unit: {...}} for units that have restarted or failed."""
    try:
        blocks = parse_show(text)
    except ValueError as exc:
        raise CrashloopError("parse", "systemctl show output", str(exc))
    units = {}
    for props in blocks:
        unit = props.get("Id", "")
        if not unit.endswith(".service"):
            continue
        restarts = props.get("NRestarts", "")
        n_restarts = int(restarts) if restarts.isdigit() else 0
        sub_state = props.get("SubState", "")
        result = props.get("Result", "")
        if not (n_restarts or sub_state == "auto-restart" or result in FAILED_RESULTS):
            continue
        fragment = props.get("FragmentPath", "")
        status = props.get("ExecMainStatus", "")
        units[unit] = {
            "unit": unit,
            "active_state": props.get("ActiveState", ""),
            "sub_state": sub_state,
            "result": result,
            "n_restarts": n_restarts,
            "exec_main_status": int(status) if status.lstrip("-").isdigit() else None,
            "restart": props.get("Restart", ""),
            "unit_file_state": props.get("UnitFileState", ""),
            "unit_file_preset": props.get("UnitFilePreset", ""),
            "fragment_path": fragment,
            # A unit file shipped in a vendor directory and enabled: the image (a package) turned it on.
            "vendor_unit": fragment.startswith(VENDOR_DIRS),
        }
    return units, len(blocks)


def parse_journal_restarts(text):
    """{unit: count} of "Scheduled restart job" entries from ``journalctl -o json`` lines."""
    counts = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            raise CrashloopError("parse", "journalctl output", "line %d is not JSON" % lineno)
        unit = entry.get("UNIT") or entry.get("USER_UNIT")
        if isinstance(unit, str) and unit:
            counts[unit] = counts.get(unit, 0) + 1
    return counts


def parse_list_units(text):
    """{unit: (load, active, sub)} from ``systemctl list-units --plain --no-legend --full`` lines."""
    units = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split(None, 4)
        if not fields:
            continue
        if len(fields) < 4:
            raise CrashloopError("parse", "systemctl list-units output", "line %d: %r" % (lineno, line[:80]))
        units[fields[0]] = (fields[1], fields[2], fields[3])
    return units


def system_journal_readable(dirs=JOURNAL_DIRS):
    """True when this user can read a system journal file, False when one exists and none is readable (a
    user not root, not in systemd-journal or adm: journalctl then shows only the user's own entries, with
    exit 0), None when there is no system journal file to tell."""
    found = False
    for folder in dirs:
        try:
            machines = sorted(os.listdir(folder))
        except OSError:
            continue
        for machine in machines:
            path = os.path.join(folder, machine, "system.journal")
            if os.path.isfile(path):
                found = True
                if os.access(path, os.R_OK):
                    return True
    return False if found else None


def list_services(run, bus=None):
    """{unit: (load, active, sub)} of every loaded service: ``systemctl list-units --type=service --all``, or
    the D-Bus call it makes (``ListUnitsByPatterns``; systemctl keeps the ``.service`` ids itself, the pattern
    ``*.service`` keeps the same ones in PID 1) when ``bus`` (sdbus.Systemd) answers."""
    if bus is not None:
        try:
            return dict((unit[0], tuple(unit[2:5])) for unit in bus.list_units(["*.service"]))
        except BusError:
            pass  # systemctl, as always
    rc, out, err = run(
        ["systemctl", "list-units", "--type=service", "--all", "--plain", "--no-legend", "--full"]
    )
    if rc != 0:
        raise CrashloopError("run", "systemctl list-units", (err or out).strip() or "exit %d" % rc)
    return parse_list_units(out)


def collect(
    run,
    use_journal=True,
    window_seconds=600,
    systemd_dir="/run/systemd/system",
    journal_dirs=JOURNAL_DIRS,
    bus=None,
):
    """One sample. ``run(argv) -> (rc, stdout, stderr)``; ``bus``: list the services over D-Bus.

    Cheap at any unit count: one ``list-units`` (a single D-Bus call) and one ``journalctl`` pick
    the candidates (between crashes, failed, activating, or with "Scheduled restart job" entries in
    the window); one ``systemctl show`` reads them all. Without a journal it falls back to one
    ``systemctl show`` of every service. The journal's counts give the rate when ``use_journal``.
    """
    if not is_systemd_host(systemd_dir):
        return {"systemd": False, "reason": "systemd is not PID 1 on this host", "services": 0, "units": {}}
    listed = list_services(run, bus)
    candidates = set(
        unit
        for unit, (_load, active, sub) in listed.items()
        if sub == "auto-restart" or active in ("failed", "activating")
    )
    since = "@%d" % int(time.time() - window_seconds)
    rc, jout, jerr = run(
        [
            "journalctl",
            "--no-pager",
            "-q",
            "-o",
            "json",
            "--output-fields=UNIT,USER_UNIT",
            "--since",
            since,
            "MESSAGE_ID=" + RESTART_MESSAGE_ID,
        ]
    )
    counts = parse_journal_restarts(jout) if rc == 0 else None
    if counts is not None:
        candidates.update(unit for unit in counts if unit.endswith(".service"))
        targets = sorted(candidates)
    else:
        targets = ["*"]  # no journal: read every service (still one call)
    units = {}
    if targets:
        rc, out, err = run(["systemctl", "show", "--type=service", "--all", "-p", SHOW_PROPS, "--"] + targets)
        if rc != 0:
            raise CrashloopError("run", "systemctl show", (err or out).strip() or "exit %d" % rc)
        units, _shown = parse_units(out)
    facts = {
        "systemd": True,
        "reason": None,
        "services": len(listed),
        "units": units,
        "sampled_at": time.time(),
        "rate_basis": None,
    }
    if counts is None:
        facts["journal_error"] = (jerr or jout).strip()[:200] or "journalctl exit %d" % rc
    elif use_journal:
        facts["journal_readable"] = system_journal_readable(journal_dirs)
        facts["rate_basis"] = "journal"
        facts["window_seconds"] = window_seconds
        for unit, data in units.items():
            data["restarts_in_window"] = counts.get(unit, 0)
            data["restarts_per_min"] = round(counts.get(unit, 0) * 60.0 / window_seconds, 2)
    return facts


def add_growth(first, second, seconds):
    """Restart rates from two samples: NRestarts deltas (a drop means a reset: count from zero)."""
    facts = dict(second)
    if not second.get("systemd") or seconds <= 0:
        return facts
    facts["rate_basis"] = "samples"
    facts["window_seconds"] = round(float(seconds), 3)
    units = {}
    for unit, data in second["units"].items():
        previous = first.get("units", {}).get(unit)
        if previous is None:
            # not a candidate at the first sample: no NRestarts to subtract, so no rate
            units[unit] = dict(data, restarts_in_window=None, restarts_per_min=None)
            continue
        before = previous["n_restarts"]
        delta = data["n_restarts"] - before if data["n_restarts"] >= before else data["n_restarts"]
        units[unit] = dict(data, restarts_in_window=delta, restarts_per_min=round(delta * 60.0 / seconds, 2))
    facts["units"] = units
    return facts


def evaluate(facts, thresholds=None):
    """One finding per crash-looping unit, worst first."""
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    findings = []
    for unit, data in sorted(facts.get("units", {}).items()):
        rate = data.get("restarts_per_min")
        severity = None
        if rate is not None:
            severity = restart_rate_severity(rate, limits)
        elif data["n_restarts"] >= limits["crashloop_min_restarts"] and data["sub_state"] == "auto-restart":
            severity = "warning"  # no rate source: between crashes with restarts piling up
        if severity is None and data["result"] == "start-limit-hit" and data["unit_file_state"] == "enabled":
            severity = "warning"
        if severity is None:
            continue
        origin = (
            "enabled by the image"
            if data["vendor_unit"] and data["unit_file_state"] == "enabled"
            else ("unit file state %s" % (data["unit_file_state"] or "unknown"))
        )
        if rate is not None:
            what = "restarting %s/min (%s in %ss by %s)" % (
                _num(rate),
                fmt_int(data["restarts_in_window"]),
                _num(facts.get("window_seconds", 0)),
                facts.get("rate_basis"),
            )
        elif data["result"] == "start-limit-hit":
            what = "gave up after crash looping (start-limit-hit)"
        else:
            what = "between crashes (auto-restart)"
        summary = "%s is crash looping: %s; NRestarts %s since its last start; %s" % (
            unit,
            what,
            fmt_int(data["n_restarts"]),
            origin,
        )
        finding_data = dict(data)
        finding_data["rate_basis"] = facts.get("rate_basis")
        findings.append(make_finding(CHECK, severity, summary, finding_data))
    return findings


def attribute_culprits(memcg_facts, crashloop_facts, growth_warning_per_min=None):
    """Culprits for zombie memcg growth: looping units whose restarts happen in the same window.

    Returns ``(growth_per_min, basis, culprits)``; culprits are sorted by restart rate, each with
    the evidence (restarts/min and memcgs gained per restart). Empty when there is no growth.
    """
    if growth_warning_per_min is None:
        growth_warning_per_min = DEFAULT_THRESHOLDS["zombie_growth_warning_per_min"]
    growth = (memcg_facts or {}).get("growth") or {}
    rate, basis = growth.get("zombies_per_min"), "zombies"
    if rate is None:
        # namespace scope: the host-wide total rising while this host's own live cgroups do not
        rate, basis = growth.get("total_per_min"), "host-wide total"
        live = growth.get("live_per_min")
        if rate is not None and live is not None and live > 0:
            rate = rate - live
    if rate is None or rate < growth_warning_per_min:
        return rate, basis, []
    culprits = []
    for unit, data in (crashloop_facts or {}).get("units", {}).items():
        restarts = data.get("restarts_per_min")
        if restarts:
            culprits.append(
                {
                    "unit": unit,
                    "restarts_per_min": restarts,
                    "memcgs_per_restart": round(rate / restarts, 2),
                    "unit_file_state": data.get("unit_file_state"),
                    "vendor_unit": data.get("vendor_unit"),
                }
            )
    culprits.sort(key=lambda c: -c["restarts_per_min"])
    return rate, basis, culprits


def _num(value):
    return ("%d" % value) if value == int(value) else ("%.2f" % value).rstrip("0").rstrip(".")
