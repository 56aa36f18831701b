# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The ec2_scheduled_event detector: EC2 maintenance events scheduled for this instance.

Events come from the inventory (the fleetops.node.ec2 plugin's ``ec2_scheduled_events`` hostvar,
from DescribeInstanceStatus, passed in by the scan playbook) and, on an EC2 instance, from the
instance metadata service (IMDSv2: a PUT for a token, then
``/latest/meta-data/events/maintenance/scheduled``), merged by event id / code. IMDS is asked only
when the host says it is on EC2 (DMI board vendor / hypervisor uuid), with short timeouts, so a
host off EC2 never waits and never errors.

Stdlib only; importable on Python >= 3.9.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.fleetops.node.plugins.module_utils.findings import make_finding

CHECK = "ec2_scheduled_event"
IMDS_URL = "http://169.254.169.254"
# When to ask IMDS: auto (only on an EC2 instance, by its firmware), always, never; the first is the default.
IMDS_MODES = ("auto", "always", "never")
EVENTS_PATH = "/latest/meta-data/events/maintenance/scheduled"
# Codes that take the instance away (stop, retire) are critical; reboots and maintenance warn.
CRITICAL_CODES = ("instance-stop", "instance-retirement", "system-maintenance-stop")
DMI_VENDOR = "/sys/devices/virtual/dmi/id/board_vendor"
HYPERVISOR_UUID = "/sys/hypervisor/uuid"


def on_ec2(dmi_vendor=DMI_VENDOR, hypervisor_uuid=HYPERVISOR_UUID):
    """True when the host's firmware says it is an EC2 instance (no network involved)."""
    for path, test in (
        (dmi_vendor, lambda t: "amazon" in t.lower()),
        (hypervisor_uuid, lambda t: t.lower().startswith("ec2")),
    ):
        try:
            with open(path) as handle:
                if test(handle.read().strip()):
                    return True
        except (IOError, OSError):
            continue
    return False


def _norm(event, source):
    code = event.get("code") or event.get("Code")
    if not code:
        return None
    return {
        "code": code,
        "description": event.get("description") or event.get("Description") or "",
        "not_before": event.get("not_before") or event.get("NotBefore"),
        "not_after": event.get("not_after") or event.get("NotAfter"),
        "event_id": event.get("instance_event_id") or event.get("EventId"),
        "state": event.get("State") or event.get("state"),
        "source": source,
    }


def parse_imds_events(text):
    """The IMDS scheduled-events document (a JSON list) to events; raises ValueError on garbage."""
    data = json.loads(text or "[]")
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of events")
    return [e for e in (_norm(item, "imds") for item in data if isinstance(item, dict)) if e]


def _ansible_open_url(url, **kwargs):
    # Imported here, not at the top: the host timer's runner (module_utils.textfile, stdlib only, no ansible
    # on the host) passes its own opener, and must be able to import this file.
    from ansible.module_utils.urls import open_url

    return open_url(url, **kwargs)


def fetch_imds(base_url=IMDS_URL, timeout=0.5, opener=None):
    """IMDSv2: a session token, then the events document. Returns (events, error).

    ``opener(url, method=..., timeout=..., headers=...)`` returns a response with ``read()``; default
    ansible's ``open_url``."""
    open_url = opener or _ansible_open_url
    try:
        token = (
            open_url(
                base_url + "/latest/api/token",
                method="PUT",
                timeout=timeout,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
            )
            .read()
            .decode()
        )
        body = (
            open_url(base_url + EVENTS_PATH, timeout=timeout, headers={"X-aws-ec2-metadata-token": token})
            .read()
            .decode()
        )
        return parse_imds_events(body), None
    except ValueError as exc:
        return [], "IMDS answered something that is not an events list: %s" % exc
    except Exception as exc:  # network errors of every kind: off EC2, IMDS disabled, hop limit
        return [], "IMDS not reachable: %s" % exc


def collect(inventory_events=None, imds=IMDS_MODES[0], imds_url=IMDS_URL, timeout=0.5, opener=None):
    """Facts: the merged events, and where they came from."""
    events = [
        e
        for e in (_norm(item, "inventory") for item in inventory_events or [] if isinstance(item, dict))
        if e
    ]
    facts = {"on_ec2": None, "imds": None, "imds_error": None}
    ask = imds == "always" or (imds == "auto" and on_ec2())
    if imds == "auto":
        facts["on_ec2"] = bool(ask)
    if ask:
        found, error = fetch_imds(imds_url, timeout, opener)
        facts["imds"] = error is None
        facts["imds_error"] = error
        for event in found:
            same = [
                e
                for e in events
                if (event["event_id"] and e["event_id"] == event["event_id"]) or e["code"] == event["code"]
            ]
            if same:
                same[0]["source"] = "inventory+imds"
                for key, value in event.items():
                    if value and not same[0].get(key):
                        same[0][key] = value
            else:
                events.append(event)
    facts["events"] = events
    return facts


def evaluate(facts):
    findings = []
    for event in facts.get("events", []):
        if (event.get("state") or "").lower() in ("completed", "canceled"):
            continue
        severity = "critical" if event["code"] in CRITICAL_CODES else "warning"
        when = event.get("not_before") or "an unannounced time"
        summary = "EC2 scheduled event %s from %s (%s)%s" % (
            event["code"],
            when,
            event["source"],
            (": " + event["description"]) if event.get("description") else "",
        )
        findings.append(make_finding(CHECK, severity, summary, dict(event)))
    return findings
