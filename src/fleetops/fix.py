"""What `fleetops remediate fix` does per host, derived from a scan report (fleetops.scan/v1).

Cause first, then reclaim: a unit that crash loops (a crashloop_unit finding of warning or worse,
or a culprit named by the zombie_memcg finding) is turned off; a host that had a unit turned off, or
whose zombie count (not only its growth) is over the warning threshold, is reclaimed. Growth with no
culprit named is left for a human: reclaiming while an unknown cause keeps making zombies is futile. Rebooting
what still needs it is a separate, slower rollout (`needs_reboot` in the reclaim result).
"""

from __future__ import annotations

from typing import Any

ACTIONABLE = ("warning", "critical")


def _too_many_zombies(data: dict[str, Any]) -> bool:
    """A count-based zombie finding (not growth alone): known zombies over the warning, or IDs running out."""
    thresholds = data.get("thresholds") or {}
    zombies = data.get("zombies")
    if zombies is not None and zombies >= thresholds.get("zombie_warning", 1000):
        return True
    pct = data.get("id_headroom_pct")
    return pct is not None and pct < thresholds.get("headroom_critical_pct", 20.0)


def fix_plan_from_report(report: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({host: {"disable_units": [...], "reclaim": bool}}, notes)`` for hosts with something to fix.

    Protected units are not filtered here: disable_unit refuses them on the host (built-in list plus
    --protected), which fails that host and so stops the rollout for a human to look.
    """
    plan: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for host, entry in sorted(report["hosts"].items()):
        if entry["status"] != "ok":
            why = f" ({entry['msg']})" if entry.get("msg") else ""
            notes.append(f"{host}: {entry['status']} in the scan, left alone{why}")
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
                culprits = [c["unit"] for c in finding["data"].get("culprits") or []]
                units.extend(u for u in culprits if u not in units)
                if _too_many_zombies(finding["data"]):
                    reclaim = True
                elif not culprits:
                    notes.append(
                        f"{host}: memory cgroups growing with no culprit named: left for a human to look at"
                    )
        if units:
            reclaim = True
        if units or reclaim:
            plan[host] = {"disable_units": units, "reclaim": reclaim}
    if not plan:
        notes.append("no host has a crash-looping unit or zombie memory cgroups to fix")
    return plan, notes
