"""What `fleetops remediate fix` does per host, derived from a scan report (fleetops.scan/v1).

Cause first, then reclaim: a unit that crash loops (a crashloop_unit finding of warning or worse,
or a culprit named by the zombie_memcg finding) is turned off; a host that had a unit turned off, or
whose zombie count (not only its growth) is over the warning threshold, is reclaimed. Growth with no
culprit named is left for a human: reclaiming while an unknown cause keeps making zombies is futile. Rebooting
what still needs it is a separate, slower rollout (`needs_reboot` in the reclaim result).

A container docker keeps re-creating (a crashloop_container finding of warning or worse) is stopped at its
cause: the systemd unit that owns it (the finding's ``owner_unit``: a PODMAN_SYSTEMD_UNIT label, the
``docker run`` / ``docker start`` client in a service, or a known creator such as ecs-init, which re-creates
``ecs-agent`` from ``ecs.service``) is turned off like a crash-looping unit, and disable_unit removes the
container it leaves (``"containers": {unit: [names]}`` in the host's plan). A container no unit could be
attributed to (docker's own restart policy, a client run by hand) or owned by a protected unit
(docker.service, containerd.service, ...) is left alone, with a note.

A process running UCX with the leaking memory-hook setup (a ucx_mmap_hooks finding of warning or worse)
gets the environment fix on the systemd service that owns it — ``UCX_MEM_MMAP_HOOK_MODE=none`` by default,
``UCX_RCACHE_MAX_UNRELEASED=1024`` with ``--ucx-fix rcache-bound`` — through a drop-in, and the service
is restarted (set_env). A UCX process no system service owns (a container, a user session) is left for a
human, as is a unit that is also being turned off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetops.ansible import facts

ACTIONABLE = ("warning", "critical")


def ucx_fixes() -> dict[str, dict[str, str]]:
    """The UCX environment fixes by name (plugins/module_utils/ucx.py FIXES)."""
    return facts.ucx_fixes()


def _too_many_zombies(data: dict[str, Any]) -> bool:
    """A count-based zombie finding (not growth alone): known zombies over the warning, or IDs running out."""
    thresholds = data.get("thresholds") or {}
    zombies = data.get("zombies")
    if zombies is not None and zombies >= thresholds.get("zombie_warning", facts.zombie_warning_default()):
        return True
    pct = data.get("id_headroom_pct")
    return pct is not None and pct < thresholds.get(
        "headroom_critical_pct", facts.headroom_critical_pct_default()
    )


def _ucx_fix(
    host: str, data: dict[str, Any], env: dict[str, str], set_env: list[dict[str, Any]], notes: list[str]
) -> None:
    unit = data.get("unit")
    if data.get("fixable_unit") and unit:
        if all(entry["unit"] != unit for entry in set_env):
            set_env.append({"unit": unit, "env": dict(env)})
        return
    owner = f"{unit} ({data.get('unit_manager')} manager)" if unit else (data.get("cgroup") or "no unit")
    notes.append(
        f"{host}: pid {data.get('pid')} ({data.get('comm')}) runs UCX with the leaking hook setup but no "
        f"system service owns it ({owner}): left for a human"
    )


def _container_fix(
    host: str, data: dict[str, Any], units: list[str], containers: dict[str, list[str]], notes: list[str]
) -> None:
    name = data.get("name") or "?"
    unit = data.get("owner_unit")
    if unit and data.get("owner_protected"):
        notes.append(
            f"{host}: container {name} crash loops and is owned by {unit}, a protected unit: left for a human"
        )
        return
    if not unit:
        why = data.get("owner_basis") or "no owner label, client process or known creator found"
        policy = data.get("restart_policy")
        if policy and policy != "no":
            why += f"; docker itself restarts it (restart policy {policy})"
        notes.append(
            f"{host}: container {name} ({data.get('image') or 'unknown image'}) crash loops but could not be "
            f"attributed to a unit ({why}): left alone"
        )
        return
    if unit not in units:
        units.append(unit)
    owned = containers.setdefault(unit, [])
    if name not in owned:
        owned.append(name)


def fix_plan_from_report(
    report: dict[str, Any], ucx_fix: str | None = None, protected: Sequence[str] = ()
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({host: {"disable_units": [...], "reclaim": bool}}, notes)`` for hosts with something to fix.

    A host with a UCX finding to fix also gets ``"set_env": [{"unit": ..., "env": {...}}]``
    (``ucx_fix`` is a key of ucx_fixes()); one whose crash-looping containers were attributed to units gets
    ``"containers": {unit: [container, ...]}`` (those units are in ``disable_units``).

    A protected unit (the modules' built-in list plus ``protected``, the --protected patterns) is never
    planned: it is named in a note, left for a human. On the host disable_unit checks again, against
    every name systemd resolves the unit to.
    """
    fixes = ucx_fixes()
    if ucx_fix is None:
        ucx_fix = facts.ucx_default_fix()
    if ucx_fix not in fixes:
        raise ValueError(f"unknown UCX fix {ucx_fix!r} (one of {', '.join(fixes)})")
    plan: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for host, entry in sorted(report["hosts"].items()):
        if not facts.answered(entry):  # ok or partial: its findings stand
            why = f" ({entry['msg']})" if entry.get("msg") else ""
            notes.append(f"{host}: {entry['status']} in the scan, left alone{why}")
            continue
        units: list[str] = []
        set_env: list[dict[str, Any]] = []
        containers: dict[str, list[str]] = {}
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
            elif finding["check"] == "crashloop_container":
                _container_fix(host, finding["data"], units, containers, notes)
            elif finding["check"] == "ucx_mmap_hooks":
                _ucx_fix(host, finding["data"], fixes[ucx_fix], set_env, notes)
        for unit in list(units):
            pattern = facts.protected_unit(unit, protected)
            if pattern is not None:
                units.remove(unit)
                notes.append(f"{host}: {unit} crash loops but is protected ({pattern}): left for a human")
        if units:
            reclaim = True
        set_env = [entry for entry in set_env if entry["unit"] not in units]
        if units or reclaim or set_env:
            plan[host] = {"disable_units": units, "reclaim": reclaim}
            if set_env:
                plan[host]["set_env"] = set_env
            if containers:
                plan[host]["containers"] = containers
    if not plan:
        notes.append("no host has a crash-looping unit or zombie memory cgroups to fix")
    return plan, notes
