"""What `fleetops remediate fix` does per host, derived from a scan report (fleetops.scan/v1).

Cause first, then reclaim: a unit that crash loops (a crashloop_unit finding of warning or worse,
or a culprit named by the zombie_memcg finding) is turned off; a host whose memory cgroups pile up
(a zombie_memcg finding of warning or worse) or that had a unit turned off is reclaimed. Rebooting
what still needs it is a separate, slower rollout (`needs_reboot` in the reclaim result).
"""

from __future__ import annotations

from typing import Any

ACTIONABLE = ("warning", "critical")


def fix_plan_from_report(report: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({host: {"disable_units": [...], "reclaim": bool}}, notes)`` for hosts with something to fix.

    Protected units are not filtered here: disable_unit refuses them on the host (built-in list plus
    --protected), which fails that host and so stops the rollout for a human to look.
    """
    plan: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for host, entry in sorted(report["hosts"].items()):
        if entry["status"] != "ok":
            notes.append(
                f"{host}: {entry['status']} in the scan, left alone ({entry.get('msg', '')})".rstrip(" ()")
            )
            continue
        units: list[str] = []
        reclaim = False
        for finding in entry["findings"]:
            if finding["severity"] not in ACTIONABLE:
                continue
            if finding["check"] == "crashloop_unit":
                unit = finding["data"].get("unit")
                if unit and unit not in units:
                    units.append(unit)
            elif finding["check"] == "zombie_memcg":
                reclaim = True
                for culprit in finding["data"].get("culprits") or []:
                    if culprit["unit"] not in units:
                        units.append(culprit["unit"])
        if units:
            reclaim = True
        if units or reclaim:
            plan[host] = {"disable_units": units, "reclaim": reclaim}
    if not plan:
        notes.append("no host has a crash-looping unit or zombie memory cgroups to fix")
    return plan, notes
