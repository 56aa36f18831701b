"""What the remediations do beyond their parameters: the gates, the steps before planning (``fix`` and
``unquarantine`` scan first), the extra vars that depend on several parameters, and the checks of values
that become node taints or check names. ``catalog.py`` names these in each declaration.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetops.ansible import facts
from fleetops.errors import UsageError
from fleetops.remediations.declare import Say
from fleetops.rollout.outcome import HostOutcome


def _unit_name(unit: str) -> str:
    return facts.normalize_unit_name(unit)


def _unit_still_looping(post: dict[str, Any], units: list[str]) -> str | None:
    looping = [
        f["data"].get("unit")
        for f in post.get("findings", [])
        if f.get("check") == "crashloop_unit" and f["data"].get("unit") in units
    ]
    return f"gate: still crash looping after the fix: {', '.join(looping)}" if looping else None


def _set_env_still_leaking(post: dict[str, Any], units: list[str]) -> str | None:
    leaking = [
        f["summary"]
        for f in post.get("findings", [])
        if f.get("check") == "ucx_mmap_hooks"
        and f.get("severity") in ("warning", "critical")
        and (f.get("data") or {}).get("unit") in units
    ]
    return f"gate: still running UCX with the leaking setup: {'; '.join(leaking)}" if leaking else None


# ---------------------------------------------------------------------------------- disable-unit


def disable_unit_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    return _unit_still_looping(post, [_unit_name(str(xv.get("fleetops_unit", "")))])


# ---------------------------------------------------------------------------------- fix


def fix_plan_text(todo: Mapping[str, Any]) -> str:
    """One host's fix plan as the steps an operator would type, each a remediation with its options:
    ``disable-unit --unit ecs.service; reclaim; set-env --unit vllm.service --env K=V --restart``
    (never a Python value such as ``reclaim True``); ``nothing`` when it holds no step."""
    steps = [f"disable-unit --unit {shlex.quote(unit)}" for unit in todo.get("disable_units", [])]
    if todo.get("reclaim"):
        steps.append("reclaim")
    steps += [
        f"set-env --unit {shlex.quote(str(entry['unit']))} "
        + " ".join(f"--env {shlex.quote(f'{k}={v}')}" for k, v in entry["env"].items())
        + " --restart"
        for entry in todo.get("set_env", [])
    ]
    return "; ".join(steps) or "nothing"


def fix_prepare(
    p: Mapping[str, Any], inventory: list[Path], limit: str | None, say: Say
) -> tuple[dict[str, Any], list[str] | None]:
    from fleetops.fix import fix_plan_from_report
    from fleetops.scan import ScanOptions, run_scan

    say(f"scanning first ({p['sample_seconds']:g}s between two samples) to find what to fix", "")
    report = run_scan(ScanOptions(inventory=inventory, limit=limit, sample_seconds=p["sample_seconds"]))
    fix_plan, notes = fix_plan_from_report(report, ucx_fix=p["ucx_fix"], protected=tuple(p["protected"]))
    for note in notes:
        say(f"note: {note}", "warning")
    for host, todo in fix_plan.items():
        say(f"  {host}: {fix_plan_text(todo)}", "")
    return {"fleetops_fix_plan": fix_plan}, sorted(fix_plan)


def fix_acts_on(finding: Mapping[str, Any]) -> bool:
    """``fix``'s ``Fixes.acts``: its own plan for a host with only this finding holds a step (a crash-looping
    unit not protected, a culprit named or zombies over the warning, a UCX service it can set the fix on)."""
    from fleetops.fix import fix_plan_from_report

    plan, _notes = fix_plan_from_report({"hosts": {"-": {"status": "ok", "findings": [finding]}}})
    return bool(plan)


def unit_not_protected(key: str) -> Any:
    """``Fixes.acts`` of ``disable-unit``: the unit the finding's ``data[key]`` names is not protected (the
    module refuses those unless --allow-protected: a person's call, not a next step to offer)."""

    def acts(finding: Mapping[str, Any]) -> bool:
        return facts.protected_unit(str((finding.get("data") or {}).get(key))) is None

    return acts


def fix_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    todo = (xv.get("fleetops_fix_plan") or {}).get(host, {})
    return _unit_still_looping(post, list(todo.get("disable_units", []))) or _set_env_still_leaking(
        post, [entry["unit"] for entry in todo.get("set_env", [])]
    )


# ---------------------------------------------------------------------------------- reboot


def reboot_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    before = (outcome.before or {}).get("boot_id")
    after = (outcome.after or {}).get("boot_id")
    if not before or not after:
        return "gate: could not read the boot id before and after the reboot"
    if before == after:
        return "gate: boot id unchanged: the host did not reboot"
    return None


def reboot_post_vars(extravars: dict[str, Any]) -> dict[str, Any] | None:
    if extravars.get("fleetops_phase") == "reboot":
        return {"fleetops_phase": "post"}
    return None


# ---------------------------------------------------------------------------------- set-env


def set_env_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    if not xv.get("fleetops_restart"):
        return None  # without a restart the running processes keep their old environment
    return _set_env_still_leaking(post, [_unit_name(str(xv.get("fleetops_unit", "")))])


# ---------------------------------------------------------------------------------- quarantine


def unquarantine_prepare(
    p: Mapping[str, Any], inventory: list[Path], limit: str | None, say: Say
) -> tuple[dict[str, Any], list[str] | None]:
    """Scan first: the playbook refuses a host whose fresh scan still finds (warning or critical) the
    check it was quarantined for (the node's annotation), or that the scan could not read."""
    from fleetops.scan import ScanOptions, run_scan

    say(
        f"scanning first ({p['sample_seconds']:g}s between two samples): a host still failing its check stays",
        "",
    )
    report = run_scan(ScanOptions(inventory=inventory, limit=limit, sample_seconds=p["sample_seconds"]))
    found: dict[str, list[str]] = {}
    for host, entry in sorted(report.get("hosts", {}).items()):
        if not facts.answered(entry):
            say(f"  {host}: its scan did not complete ({entry.get('status')}): it will be refused", "warning")
            continue
        found[host] = sorted(
            {
                str(f.get("check"))
                for f in entry.get("findings", [])
                if f.get("severity") in ("warning", "critical")
            }
        )
        if found[host]:
            say(
                f"  {host}: the scan finds {', '.join(found[host])}: refused if quarantined for one of them",
                "",
            )
    return {"fleetops_unquarantine_findings": found}, None


# ---------------------------------------------------------------------------------- stop-start


def stop_start_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    """The boot id changed (the host powered off and on), no scheduled EC2 event is left on the instance
    (EC2 completes retirement and maintenance events on a stop), and --finding's check no longer warns."""
    before = (outcome.before or {}).get("boot_id")
    after = (outcome.after or {}).get("boot_id")
    if not before or not after:
        return "gate: could not read the boot id before and after the stop-start"
    if before == after:
        return "gate: boot id unchanged: the host did not power off and on"
    findings = post.get("findings", [])
    events = [
        str((f.get("data") or {}).get("code") or f.get("summary"))
        for f in findings
        if f.get("check") == "ec2_scheduled_event"
    ]
    if events:
        return f"gate: a scheduled EC2 event is still there after the stop-start: {', '.join(events)}"
    check = xv.get("fleetops_stop_start_finding")
    still = [
        str(f.get("summary"))
        for f in findings
        if check and f.get("check") == check and f.get("severity") in ("warning", "critical")
    ]
    if still:
        return f"gate: {check} still found after the stop-start: {'; '.join(still)}"
    return None


# ---------------------------------------------------------------------------------- replace


def replace_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    """The group reported a new instance, and the playbook's scan of it (``post``) finds no warning."""
    replaced = next((r for r in outcome.task_results() if r.get("new_instances")), None)
    if replaced is None:
        return "gate: the Auto Scaling group reported no new instance"
    warnings = [str(f.get("summary")) for f in post.get("findings", []) if f.get("severity") == "warning"]
    if warnings:
        return "gate: the new instance's scan finds: " + "; ".join(warnings)
    return None


# ---------------------------------------------------------------------------------- values checked


def check_taint_value(remediation: str, finding: Any) -> None:
    """quarantine's ``--finding``: it becomes a node taint's value."""
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", str(finding)):
        raise UsageError(
            f"remediate {remediation}: --finding {finding!r} is not a check name usable as a taint value "
            "(1-63 letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        )


def check_check_name(remediation: str, finding: Any) -> None:
    """stop-start's ``--finding``: a check the gate looks for."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", str(finding)):
        raise UsageError(
            f"remediate {remediation}: --finding {finding!r} is not a check name (e.g. gpu_health)"
        )


def _refuse(remediation: str, option: str, problem: str | None) -> None:
    if problem is not None:
        raise UsageError(f"remediate {remediation}: {option}: {problem}")


def check_unit(remediation: str, unit: Any) -> None:
    """``--unit``: a name systemctl accepts (``ecs`` or ``ecs.service``), as the module checks it."""
    _refuse(remediation, "--unit", facts.unit_name_problem(str(unit)))


def check_containers(remediation: str, names: Any) -> None:
    """``--container``: docker container names, as disable_unit checks them."""
    _refuse(remediation, "--container", facts.container_names_problem(list(names)))


def check_protected(remediation: str, patterns: Any) -> None:
    """``--protected``: unit-name globs, as the modules check them."""
    _refuse(remediation, "--protected", facts.unit_patterns_problem(list(patterns), "--protected"))


def check_drop_in(remediation: str, name: Any) -> None:
    """``--drop-in``: a plain file name ending in .conf, as set_env checks it."""
    _refuse(remediation, "--drop-in", facts.drop_in_problem(str(name)))


def check_env(remediation: str, env: Any) -> None:
    """``--env``: variable names and values set_env writes (never a value in the message)."""
    pairs = dict(env) if isinstance(env, Mapping) else dict(env or ())
    _refuse(remediation, "--env", facts.env_problem(pairs))


# ---------------------------------------------------------------------------------- extra vars across parameters


def reboot_phase(p: Mapping[str, Any], xv: dict[str, Any]) -> dict[str, Any]:
    """With a post hook or a drain, the reboot runs in two phases: uncordon and the post hook run after
    the gate (``reboot_post_vars``)."""
    if p["post_hook"] or p["kube_drain"]:
        xv["fleetops_phase"] = "reboot"
    return xv


def unquarantine_findings(p: Mapping[str, Any], xv: dict[str, Any]) -> dict[str, Any]:
    """What the scan before the run found per host (``unquarantine_prepare`` fills it in)."""
    return {**xv, "fleetops_unquarantine_findings": {}}


# ---------------------------------------------------------------------------------- replace's batches

ASG_TAG = "aws:autoscaling:groupName"  # the tag EC2 Auto Scaling puts on every instance of a group


def auto_scaling_group(hostvars: Mapping[str, Any]) -> str | None:
    """The Auto Scaling group of an EC2 inventory host (its ``ec2_tags``), or None."""
    tags = hostvars.get("ec2_tags")
    group = tags.get(ASG_TAG) if isinstance(tags, Mapping) else None
    return str(group) if group else None


def refuse_group_member(hostvars: Mapping[str, Any]) -> str | None:
    """stop-start refuses an Auto Scaling group's instance: the group counts a stopped member as
    unhealthy and replaces it, a replacement outside every budget and capacity floor."""
    group = auto_scaling_group(hostvars)
    if group is None:
        return None
    return (
        f"it is an instance of the Auto Scaling group {group}, which would replace it once stopped "
        "(a replacement outside every budget and floor): use remediate replace, or put it in Standby first"
    )
