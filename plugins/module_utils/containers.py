# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The crashloop_container detector: containers that docker keeps re-creating or restarting.

``RestartCount`` counts only Docker's own restart policy. The ECS agent's ``ecs-init`` re-creates the
``ecs-agent`` container on every start, so its RestartCount stays 0: a re-created container shows
as a new Id under the same name between two samples, or, with one sample, as a container created
and started seconds ago. Two docker calls for all containers (``ps -aq``, one ``inspect``).
No docker, or no daemon answering: no finding, no error.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import json
import re
import time

from ansible_collections.fleetops.node.plugins.module_utils.findings import (
    DetectorError,
    make_finding,
    restart_rate_severity,
)

CHECK = "crashloop_container"
RECENT_SECONDS = 60
DEFAULT_THRESHOLDS = {"crashloop_warning_per_min": 0.5, "crashloop_critical_per_min": 5.0}
_TS_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


class ContainerError(DetectorError):
    pass


def parse_timestamp(text):
    """Docker's RFC 3339 timestamps (nanoseconds, Z or offset) to epoch seconds; None for the zero time."""
    if not text or text.startswith("0001-01-01"):
        return None
    match = _TS_RE.match(text)
    if not match:
        raise ValueError("not an RFC 3339 timestamp: %r" % text)
    base = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    frac = float("0" + match.group(2)) if match.group(2) else 0.0
    zone = match.group(3)
    offset = 0 if zone == "Z" else (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * (1 if zone[0] == "+" else -1)
    return base + frac - offset


def parse_inspect(text, now):
    """{name: container facts} from ``docker inspect`` JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContainerError("parse", "docker inspect output", str(exc))
    if not isinstance(data, list):
        raise ContainerError("parse", "docker inspect output", "expected a JSON list")
    out = {}
    for item in data:
        try:
            name = item["Name"].lstrip("/")
            state = item.get("State") or {}
            created = parse_timestamp(item.get("Created"))
            started = parse_timestamp(state.get("StartedAt"))
            out[name] = {
                "name": name,
                "id": item["Id"][:12],
                "image": (item.get("Config") or {}).get("Image", ""),
                "status": state.get("Status", ""),
                "restarting": bool(state.get("Restarting")),
                "exit_code": state.get("ExitCode"),
                "restart_count": int(item.get("RestartCount") or 0),
                "restart_policy": ((item.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name", ""),
                "created_age_s": None if created is None else round(now - created, 1),
                "started_age_s": None if started is None else round(now - started, 1),
            }
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ContainerError("parse", "docker inspect output", "container entry: %s" % exc)
    return out


def collect(run, docker):
    """One sample. ``docker``: the docker binary's path, or None when it is not installed."""
    if not docker:
        return {"docker": False, "reason": "docker is not installed", "containers": {}}
    rc, out, err = run([docker, "ps", "-aq", "--no-trunc"])
    if rc != 0:
        return {"docker": False, "reason": "docker daemon not reachable: %s" % (err or out).strip()[:200], "containers": {}}
    ids = out.split()
    now = time.time()
    containers = {}
    if ids:
        rc, out, err = run([docker, "inspect"] + ids)
        if rc != 0 and not out.strip():
            raise ContainerError("run", "docker inspect", (err or "exit %d" % rc).strip())
        containers = parse_inspect(out, now)
    return {"docker": True, "reason": None, "containers": containers, "sampled_at": now, "rate_basis": None}


def add_growth(first, second, seconds):
    """Re-creations (same name, new Id) and restarts (RestartCount delta) per minute between two samples."""
    facts = dict(second)
    if not second.get("docker") or seconds <= 0:
        return facts
    facts["rate_basis"] = "samples"
    facts["window_seconds"] = round(float(seconds), 3)
    containers = {}
    for name, data in second["containers"].items():
        before = first.get("containers", {}).get(name)
        recreated = 1 if before is not None and before["id"] != data["id"] else 0
        if before is None and data["created_age_s"] is not None and data["created_age_s"] <= seconds:
            recreated = 1  # appeared during the window
        restarts = data["restart_count"] - before["restart_count"] if before and not recreated else 0
        events = recreated + max(0, restarts)
        containers[name] = dict(data, recreated=recreated, restarts_in_window=events,
                                restarts_per_min=round(events * 60.0 / seconds, 2))
    facts["containers"] = containers
    return facts


def evaluate(facts, thresholds=None):
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update(thresholds or {})
    findings = []
    for name, data in sorted((facts.get("containers") or {}).items()):
        rate = data.get("restarts_per_min")
        severity = None
        if rate is not None:
            severity = restart_rate_severity(rate, limits)
            what = "re-created or restarted %s times in %ss (%s/min)" % (
                data["restarts_in_window"], facts.get("window_seconds"), rate)
        else:
            young = data["created_age_s"] is not None and data["created_age_s"] < RECENT_SECONDS
            if data["restarting"] or data["restart_count"] >= 3:
                severity = "warning"
                what = "restarting (RestartCount %d, policy %s)" % (data["restart_count"], data["restart_policy"] or "no")
            elif young and data["status"] != "running":
                severity = "warning"
                what = "created %ss ago and already %s (exit %s): a runtime re-creating it?" % (
                    data["created_age_s"], data["status"], data["exit_code"])
        if severity is None:
            continue
        summary = "container %s (%s) crash loops: %s" % (name, data["image"], what)
        findings.append(make_finding(CHECK, severity, summary, dict(data, rate_basis=facts.get("rate_basis"))))
    return findings
