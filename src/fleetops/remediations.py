"""The remediations a rollout can run: for each, its playbook, its parameters and the extra vars they
become, what its gate checks, how a resume probes a host, and an optional step before planning.

The library's registry: the CLI adds one argparse sub-command per entry (``fleetops.cli.remediate``)
and passes the parsed options as ``params``; the API, the demo and AWX-side code pass ``params``
directly (``fleetops.api.RemediationRequest``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.ansible import facts
from fleetops.errors import UsageError
from fleetops.rollout.gate import GateCheck
from fleetops.rollout.guards import DEFAULT_REBOOT_MAX_UNHEALTHY
from fleetops.rollout.outcome import HostOutcome
from fleetops.util import DAY_S

REQUIRED = object()  # a parameter without a default
DEFAULT_HOST_TIMEOUT_S = 600  # a task on a host (a unit disabled, a cache dropped, a service restarted)
MAX_HOST_TIMEOUT_S = DAY_S
REBOOT_HOST_TIMEOUT_S = 1800  # drain (600) + reboot (600) + hooks, with room to spare
Say = Callable[[str, str], None]  # (text, style) for the operator
# (params, inventory, limit, say) -> (extra vars, the hosts to target or None: every selected host)
Prepare = Callable[[Mapping[str, Any], list[Path], str | None, Say], tuple[dict[str, Any], list[str] | None]]


def check_host_timeout(seconds: int) -> int:
    """``--host-timeout``: whole seconds, at least 1, at most a day; UsageError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise UsageError(f"--host-timeout must be whole seconds, got {seconds!r}")
    if not 1 <= seconds <= MAX_HOST_TIMEOUT_S:
        raise UsageError(f"--host-timeout must be between 1 and {MAX_HOST_TIMEOUT_S} seconds, got {seconds}")
    return seconds


@dataclass(frozen=True)
class Remediation:
    """A remediation the rollout can run: its playbook and the module whose result is the host's."""

    name: str
    playbook: str
    actions: tuple[str, ...]
    help: str
    # parameter name -> default (REQUIRED: none); a callable default is called when needed
    params: Mapping[str, Any]
    extravars: Callable[[Mapping[str, Any]], dict[str, Any]]
    # Optional: work out, before planning, which hosts need what (``fix`` scans first).
    prepare: Prepare | None = None
    # Optional: what the batch gate checks on top of "answers, no new critical finding".
    gate: GateCheck | None = None
    # Optional: extra vars that make the playbook only probe the host (resume after a kill).
    probe_vars: dict[str, Any] | None = None
    # Optional: extra vars for a second pass over the hosts that passed their gate (None: no pass).
    post_vars: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    cooldown: float = 0.0  # default cooldown between batches
    # --host-timeout's default: seconds each remediation task may take on a host (task `timeout:`)
    host_timeout: int = DEFAULT_HOST_TIMEOUT_S
    # --max-unhealthy's default (guards.MaxUnhealthy text); None: no capacity floor unless asked
    max_unhealthy: str | None = None
    # The playbook replaces each host by a new one (replace): the gate judges the playbook's own scan of
    # the new host (gate.replacement_entry) instead of scanning the old one, which is gone.
    replaces_host: bool = False

    def check_host_timeout(self, seconds: int, extravars: Mapping[str, Any]) -> int:
        """``seconds`` if it is a usable ``--host-timeout`` for this remediation, else UsageError.

        A reboot's limit must leave room for what it waits for: the drain and the reboot itself."""
        check_host_timeout(seconds)
        waits = [
            (name, int(extravars[var]))
            for name, var in (
                ("--reboot-timeout", "fleetops_reboot_timeout"),
                ("--drain-timeout", "fleetops_drain_timeout"),
                ("--stop-timeout", "fleetops_stop_timeout"),
                ("--start-timeout", "fleetops_start_timeout"),
                ("--timeout", "fleetops_replace_timeout"),
                ("--timeout (ssh)", "fleetops_replace_connect_timeout"),
            )
            if isinstance(extravars.get(var), int) and not isinstance(extravars.get(var), bool)
        ]
        if waits and seconds <= sum(v for _n, v in waits):
            told = " + ".join(f"{n} {v}" for n, v in waits)
            raise UsageError(f"--host-timeout {seconds} must be more than {told}, which it includes")
        return seconds

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters with defaults filled in; unknown or missing ones are a UsageError."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise UsageError(f"remediate {self.name}: unknown parameter(s): {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for name, default in self.params.items():
            if name in given and given[name] is not None:
                out[name] = given[name]
            elif default is REQUIRED:
                raise UsageError(f"remediate {self.name}: the parameter {name!r} is required")
            else:
                out[name] = default() if callable(default) else default
        return out


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


def _disable_unit_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "fleetops_unit": p["unit"],
        "fleetops_containers": list(p["containers"]),
        "fleetops_protected": list(p["protected"]),
        "fleetops_allow_protected": bool(p["allow_protected"]),
    }


def _disable_unit_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    return _unit_still_looping(post, [_unit_name(str(xv.get("fleetops_unit", "")))])


# ---------------------------------------------------------------------------------- reclaim


def _set_only(**knobs: Any) -> dict[str, Any]:
    """``fleetops_<name>`` for each knob given (None: unset, the module's default applies)."""
    return {f"fleetops_{name}": value for name, value in knobs.items() if value is not None}


def _reclaim_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    return _set_only(
        min_zombies=p["min_zombies"], reboot_threshold=p["reboot_threshold"], reclaim_method=p["method"]
    )


# ---------------------------------------------------------------------------------- fix


def _fix_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "fleetops_protected": list(p["protected"]),
        **_set_only(
            min_zombies=p["min_zombies"], reboot_threshold=p["reboot_threshold"], reclaim_method=p["method"]
        ),
    }


def set_env_plan_text(todo: Mapping[str, Any]) -> str:
    return "".join(
        f"; set-env {entry['unit']} {' '.join(f'{k}={v}' for k, v in entry['env'].items())} (restart)"
        for entry in todo.get("set_env", [])
    )


def _fix_prepare(
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
        say(
            f"  {host}: disable {', '.join(todo['disable_units']) or '-'}; reclaim {todo['reclaim']}"
            + set_env_plan_text(todo),
            "",
        )
    return {**_fix_vars(p), "fleetops_fix_plan": fix_plan}, sorted(fix_plan)


def _fix_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    todo = (xv.get("fleetops_fix_plan") or {}).get(host, {})
    return _unit_still_looping(post, list(todo.get("disable_units", []))) or _set_env_still_leaking(
        post, [entry["unit"] for entry in todo.get("set_env", [])]
    )


# ---------------------------------------------------------------------------------- reboot


def _reboot_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    before = (outcome.before or {}).get("boot_id")
    after = (outcome.after or {}).get("boot_id")
    if not before or not after:
        return "gate: could not read the boot id before and after the reboot"
    if before == after:
        return "gate: boot id unchanged: the host did not reboot"
    return None


def _reboot_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    xv: dict[str, Any] = {"fleetops_reboot_timeout": p["reboot_timeout"]}
    if p["pre_hook"]:
        xv["fleetops_pre_hook"] = p["pre_hook"]
    if p["post_hook"]:
        xv["fleetops_post_hook"] = p["post_hook"]
    if p["kube_drain"]:
        xv.update(
            fleetops_kube_drain=True,
            fleetops_drain_timeout=p["drain_timeout"],
            fleetops_kubectl=p["kubectl"],
        )
        if p["kubeconfig"]:
            xv["fleetops_kubeconfig"] = str(Path(p["kubeconfig"]).expanduser().resolve())
    if p["post_hook"] or p["kube_drain"]:
        xv["fleetops_phase"] = "reboot"  # uncordon and the post hook run after the gate (post_vars)
    return xv


def _reboot_post_vars(extravars: dict[str, Any]) -> dict[str, Any] | None:
    if extravars.get("fleetops_phase") == "reboot":
        return {"fleetops_phase": "post"}
    return None


# ---------------------------------------------------------------------------------- set-env


def _set_env_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "fleetops_unit": p["unit"],
        "fleetops_env": dict(p["env"]),
        "fleetops_restart": bool(p["restart"]),
        "fleetops_drop_in": p["drop_in"],
        # values digested in results, state, audit and reports unless shown (fleetops.rollout.state)
        **({"fleetops_show_values": True} if p.get("show_values") else {}),
    }


def _set_env_gate(
    host: str, outcome: HostOutcome, pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    if not xv.get("fleetops_restart"):
        return None  # without a restart the running processes keep their old environment
    return _set_env_still_leaking(post, [_unit_name(str(xv.get("fleetops_unit", "")))])


# ---------------------------------------------------------------------------------- quarantine


def _kubectl_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    xv: dict[str, Any] = {"fleetops_kubectl": p["kubectl"]}
    if p["kubeconfig"]:
        xv["fleetops_kubeconfig"] = str(Path(p["kubeconfig"]).expanduser().resolve())
    return xv


def _quarantine_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", str(p["finding"])):
        raise UsageError(
            f"remediate quarantine: --finding {p['finding']!r} is not a check name usable as a taint value "
            "(1-63 letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        )
    return {
        "fleetops_quarantine_check": p["finding"],
        "fleetops_quarantine_reason": p["reason"],
        "fleetops_quarantine_evict": bool(p["evict"]),
        **({"fleetops_drain_timeout": p["drain_timeout"]} if p["evict"] else {}),
        **_kubectl_vars(p),
    }


def _unquarantine_prepare(
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
        if entry.get("status") != "ok":
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
    return {**_kubectl_vars(p), "fleetops_unquarantine_findings": found}, None


# ---------------------------------------------------------------------------------- stop-start

STOP_START_HOST_TIMEOUT_S = 1800  # stop (600) + start (600), with room for ssh and the boot id reads


def _stop_start_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    xv: dict[str, Any] = {
        "fleetops_stop_timeout": p["stop_timeout"],
        "fleetops_start_timeout": p["start_timeout"],
    }
    if p["finding"]:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", str(p["finding"])):
            raise UsageError(
                f"remediate stop-start: --finding {p['finding']!r} is not a check name (e.g. gpu_health)"
            )
        xv["fleetops_stop_start_finding"] = p["finding"]
    return xv


def _stop_start_gate(
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

REPLACE_HOST_TIMEOUT_S = 1800  # the group's replacement (600) + the new instance's ssh (600) + its scan


def _replace_vars(p: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "fleetops_replace_timeout": p["timeout"],
        "fleetops_replace_connect_timeout": p["timeout"],
        "fleetops_replace_method": p["method"],
    }


def _replace_gate(
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


REMEDIATIONS: dict[str, Remediation] = {
    r.name: r
    for r in (
        Remediation(
            name="disable-unit",
            playbook="fleetops.node.remediate_disable_unit",
            actions=("fleetops.node.disable_unit",),
            help="stop, disable and mask a unit (and remove its container)",
            params={"unit": REQUIRED, "containers": (), "protected": (), "allow_protected": False},
            extravars=_disable_unit_vars,
            gate=_disable_unit_gate,
        ),
        Remediation(
            name="reclaim",
            playbook="fleetops.node.remediate_reclaim",
            actions=("fleetops.node.reclaim_memcg",),
            help="free zombie memory cgroups by dropping the page cache that pins them",
            # None: the module's default, the scan's zombie warning level (plugins/module_utils/memcg.py)
            # method None: the module's, drop_caches
            params={"min_zombies": None, "reboot_threshold": None, "method": None},
            extravars=_reclaim_vars,
        ),
        Remediation(
            name="fix",
            playbook="fleetops.node.remediate_fix",
            actions=("fleetops.node.disable_unit", "fleetops.node.reclaim_memcg", "fleetops.node.set_env"),
            help="scan, then fix what was found: turn off crash-looping units, set the UCX fix, reclaim zombie memcgs",
            params={
                "sample_seconds": 10.0,
                "protected": (),
                "reboot_threshold": None,
                "min_zombies": None,
                "method": None,  # the reclaim's (None: the module's, drop_caches)
                "ucx_fix": None,
            },
            extravars=_fix_vars,
            prepare=_fix_prepare,
            gate=_fix_gate,
        ),
        Remediation(
            name="reboot",
            playbook="fleetops.node.rolling_reboot",
            actions=("ansible.builtin.reboot",),
            help="reboot hosts a few at a time; each must come back with a new boot id",
            params={
                "reboot_timeout": 600,
                "pre_hook": None,
                "post_hook": None,
                "kube_drain": False,
                "drain_timeout": 600,
                "kubeconfig": None,
                "kubectl": "kubectl",
            },
            extravars=_reboot_vars,
            gate=_reboot_gate,
            probe_vars={"fleetops_probe_only": True},
            post_vars=_reboot_post_vars,
            cooldown=10.0,
            host_timeout=REBOOT_HOST_TIMEOUT_S,
            max_unhealthy=DEFAULT_REBOOT_MAX_UNHEALTHY,
        ),
        Remediation(
            name="set-env",
            playbook="fleetops.node.remediate_set_env",
            actions=("fleetops.node.set_env",),
            help="set environment variables of a service (a systemd drop-in), restart it if asked",
            params={
                "unit": REQUIRED,
                "env": REQUIRED,
                "restart": False,
                "drop_in": "50-fleetops-env.conf",
                "show_values": False,
            },
            extravars=_set_env_vars,
            gate=_set_env_gate,
        ),
        Remediation(
            name="quarantine",
            playbook="fleetops.node.quarantine",
            actions=("ansible.builtin.command", "ansible.builtin.debug"),  # debug: a dry run's note
            help="take hosts' Kubernetes nodes out of scheduling for a finding: cordon, taint "
            "fleetops.io/quarantine=<check>:NoSchedule, annotate; --evict drains too",
            params={
                "finding": REQUIRED,
                "reason": "",
                "evict": False,
                "drain_timeout": 600,
                "kubeconfig": None,
                "kubectl": "kubectl",
            },
            extravars=_quarantine_vars,
            host_timeout=900,  # --evict: the drain (600) with room to spare
        ),
        Remediation(
            name="stop-start",
            playbook="fleetops.node.stop_start",
            actions=("fleetops.node.ec2_stop_start",),
            help="move EC2 instances to other hardware: stop, wait, start, wait, then ssh and a new boot id "
            "(for scheduled retirement/maintenance events and hardware faults a reboot cannot fix)",
            params={"stop_timeout": 600, "start_timeout": 600, "finding": None},
            extravars=_stop_start_vars,
            gate=_stop_start_gate,
            probe_vars={"fleetops_probe_only": True},
            cooldown=10.0,
            host_timeout=STOP_START_HOST_TIMEOUT_S,
            max_unhealthy=DEFAULT_REBOOT_MAX_UNHEALTHY,
        ),
        Remediation(
            name="unquarantine",
            playbook="fleetops.node.unquarantine",
            actions=("ansible.builtin.command", "ansible.builtin.debug"),  # debug: a dry run's note
            help="scan, then give nodes back to scheduling unless the scan still finds their quarantine's "
            "check: remove our taint, uncordon if we cordoned, drop the annotation",
            params={"sample_seconds": 10.0, "kubeconfig": None, "kubectl": "kubectl"},
            extravars=lambda p: {**_kubectl_vars(p), "fleetops_unquarantine_findings": {}},
            prepare=_unquarantine_prepare,
        ),
        Remediation(
            name="replace",
            playbook="fleetops.node.replace",
            actions=("fleetops.node.ec2_asg_replace", "fleetops.node.node_health"),
            help="have each host's EC2 Auto Scaling group replace its instance (terminate in group keeping the "
            "desired capacity, or mark it Unhealthy), then reach and scan the new one: it must scan clean",
            params={"timeout": 600, "method": "terminate"},
            extravars=_replace_vars,
            gate=_replace_gate,
            host_timeout=REPLACE_HOST_TIMEOUT_S,
            replaces_host=True,
        ),
    )
}


def get(name: str) -> Remediation:
    try:
        return REMEDIATIONS[name]
    except KeyError:
        raise UsageError(f"unknown remediation {name!r} (one of {', '.join(REMEDIATIONS)})") from None
