# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Shared shapes for node_health detectors: findings, errors, severities.

Every detector returns facts plus findings ``{check, severity, summary, data}``. A detector
that cannot run raises a ``DetectorError`` (or a subclass); the module converts it, once, into
an ``errors`` entry ``{check, msg}`` and carries on with the other detectors.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

# Where system tools live when PATH (an ssh session's, a cron job's) leaves the sbin folders out.
SYSTEM_BIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin", "/usr/local/bin")


SEVERITIES = ("info", "warning", "critical")
# The restart-rate thresholds (restarts per minute) of crashloop_unit and crashloop_container, both
# judged by restart_rate_severity(): node_health's option defaults, defined here once.
RESTART_RATE_THRESHOLDS = {"crashloop_warning_per_min": 0.5, "crashloop_critical_per_min": 5.0}
_SEVERITY_RANK = dict((name, rank) for rank, name in enumerate(SEVERITIES))

# Coverage: whether a check could look at what it checks on this host, declared once (the controller reads
# these names through fleetops.ansible.facts). "full": it saw everything there is to see; "partial": it saw
# part (the reason says what it missed and why); "none": it could not look at all (reason). Each level's
# value is the fleetops_check_coverage gauge's (plugins/module_utils/gauges.py).
COVERAGE = (("full", 1.0), ("partial", 0.5), ("none", 0.0))
COVERAGE_LEVELS = tuple(level for level, _value in COVERAGE)
# A host that answered the scan is "ok" when every check it ran looked fully, else "partial": its findings
# stand, but a clean result there does not mean clean.
ANSWERED_STATUSES = ("ok", "partial")


class DetectorError(Exception):
    """A detector could not run: unreadable or malformed input.

    ``str(err)`` is the whole message, "Failed to <verb> <object>: <cause>".
    """

    def __init__(self, verb, obj, cause):
        self.verb = verb
        self.obj = obj
        self.cause = cause
        super(DetectorError, self).__init__("Failed to %s %s: %s" % (verb, obj, cause))


def severity_rank(severity):
    """Order of a severity: info < warning < critical. Unknown names raise ValueError."""
    try:
        return _SEVERITY_RANK[severity]
    except KeyError:
        raise ValueError("unknown severity %r (expected one of %s)" % (severity, ", ".join(SEVERITIES)))


def worst_severity(severities):
    """The worst of an iterable of severities, or None when it is empty."""
    worst = None
    for severity in severities:
        if worst is None or severity_rank(severity) > severity_rank(worst):
            worst = severity
    return worst


def make_finding(check, severity, summary, data=None):
    """One finding: a dict with exactly the keys check, severity, summary, data."""
    severity_rank(severity)
    return {
        "check": check,
        "severity": severity,
        "summary": summary,
        "data": dict(data or {}),
    }


def restart_rate_severity(rate, limits):
    """critical / warning / None for a restarts-per-minute rate against the crashloop_* thresholds."""
    if rate >= limits["crashloop_critical_per_min"]:
        return "critical"
    if rate >= limits["crashloop_warning_per_min"]:
        return "warning"
    return None


def make_coverage(level, reason=None):
    """One check's coverage: ``{"level": full|partial|none, "reason": text or None}``; a level other than
    full needs its reason."""
    if level not in COVERAGE_LEVELS:
        raise ValueError("unknown coverage %r (expected one of %s)" % (level, ", ".join(COVERAGE_LEVELS)))
    if level != "full" and not reason:
        raise ValueError("coverage %s needs a reason" % level)
    return {"level": level, "reason": reason or None}


def answered_status(coverage):
    """The status of a host that answered, from its ``coverage`` ({check: make_coverage(...)}): "ok" when
    every check looked fully, else "partial"."""
    full = all((c or {}).get("level") == "full" for c in (coverage or {}).values())
    return ANSWERED_STATUSES[0] if full else ANSWERED_STATUSES[1]


def make_error(check, msg):
    """One errors entry: a detector that could not run (the module itself still succeeds)."""
    return {"check": check, "msg": str(msg)}


def fmt_int(value):
    """A count for a summary line: 1523 -> '1,523'."""
    return "{:,}".format(int(value))


def fmt_rate(value):
    """A per-minute rate for a summary line: signed, at most one decimal."""
    if value == int(value):
        return "{:+,}".format(int(value))
    return "{:+,.1f}".format(value)


def which(name):
    """The path of an executable ``name`` on PATH or in SYSTEM_BIN_DIRS, or None (AnsibleModule.get_bin_path
    for callers that run without a module: tests, bench/gpu_health_probe.py, the host's runner). A name with a
    folder in it is checked as it is."""
    if os.path.dirname(name):
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    for folder in os.environ.get("PATH", "").split(os.pathsep) + list(SYSTEM_BIN_DIRS):
        path = os.path.join(folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None
