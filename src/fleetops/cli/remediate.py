"""`fleetops remediate ACTION`: run a remediation playbook batch by batch through the planner.

One batch = one ansible-runner invocation limited to that batch's hosts. A dry run (check mode +
diff) unless ``--apply``. A circuit breaker stops the rollout once failed hosts pass
``--max-failures`` (exactly that many are tolerated; one more stops it): hosts of later batches
stay untouched and are reported as pending.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetops import paths
from fleetops.ansible.inventory import load_hosts
from fleetops.cli.plan import add_rollout_args, add_target_args, plan_document, plan_from_args
from fleetops.errors import UsageError
from fleetops.rollout.engine import (
    HOST_FAILED,
    HOST_SKIPPED,
    Engine,
    GateCheck,
    Rollout,
    RolloutError,
    locked,
    new_rollout,
    preflight,
)
from fleetops.rollout.lease import DEFAULT_SETTLE_S, DEFAULT_TTL_S, connection_for, lease_targets, rollout_id

SCHEMA = "fleetops.rollout.engine/v1"
EXIT_OK = 0
EXIT_FAILED = 3
EXIT_INTERRUPTED = 130
ROLLOUT_EPILOG = (
    "While it runs: progress on stderr (a live line on a terminal, plain 'progress:' lines otherwise). "
    "Ctrl-C stops after the current batch with the state saved (a second Ctrl-C aborts the batch; "
    "--resume probes its hosts first). Exit codes: 0 done, 2 usage error, 3 a host failed or the rollout "
    "stopped, 4 hosts locked (lock file or EC2 lease) by another rollout, 130 interrupted."
)


@dataclass(frozen=True)
class Remediation:
    """A remediation the rollout can run: its playbook and the module whose result is the host's."""

    name: str
    playbook: str
    actions: tuple[str, ...]
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    extravars: Callable[[argparse.Namespace], dict[str, Any]]
    # Optional: work out, before planning, which hosts need what (``fix`` scans first). Returns the
    # extra vars and the hosts to target (None: every host the inventory and --limit select).
    prepare: Callable[[argparse.Namespace, Console], tuple[dict[str, Any], list[str] | None]] | None = None
    # Optional: what the batch gate checks on top of "answers, no new critical finding".
    gate: GateCheck | None = None
    # Optional: extra vars that make the playbook only probe the host (resume after a kill).
    probe_vars: dict[str, Any] | None = None
    # Optional: extra vars for a second pass over the hosts that passed their gate (None: no pass).
    post_vars: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    cooldown: float = 0.0  # default --cooldown between batches


def _disable_unit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit", required=True, metavar="NAME", help="the unit to stop, disable and mask")
    p.add_argument(
        "--container",
        dest="containers",
        action="append",
        default=[],
        metavar="NAME",
        help="a docker container the unit ran, removed too when docker is present (repeatable)",
    )
    p.add_argument(
        "--protected",
        action="append",
        default=[],
        metavar="PATTERN",
        help="more units to refuse, on top of the built-in protected list (repeatable)",
    )
    p.add_argument(
        "--allow-protected", action="store_true", help="override the protected-unit refusal (think twice)"
    )


def _disable_unit_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "fleetops_unit": args.unit,
        "fleetops_containers": list(args.containers),
        "fleetops_protected": list(args.protected),
        "fleetops_allow_protected": bool(args.allow_protected),
    }


def _reclaim_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-zombies",
        type=int,
        default=1000,
        metavar="N",
        help="do nothing on hosts with fewer zombies (default: 1000, the scan's warning level: dropping the page "
        "cache costs every workload on the host its cached files)",
    )
    p.add_argument(
        "--reboot-threshold",
        type=int,
        default=1000,
        metavar="N",
        help="zombies left after the reclaim that mark a host as needing a reboot (default: 1000)",
    )


def _reclaim_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {"fleetops_min_zombies": args.min_zombies, "fleetops_reboot_threshold": args.reboot_threshold}


def _fix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="the scan before the fix takes two samples S seconds apart, for restart and growth rates (default: 10)",
    )
    p.add_argument(
        "--protected",
        action="append",
        default=[],
        metavar="PATTERN",
        help="more units never to turn off, on top of the built-in protected list (repeatable)",
    )
    p.add_argument(
        "--reboot-threshold", type=int, default=1000, metavar="N", help="see reclaim (default: 1000)"
    )
    _set_env_ucx_fix_arg(p)


def _fix_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {"fleetops_protected": list(args.protected), "fleetops_reboot_threshold": args.reboot_threshold}


def _fix_prepare(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], list[str] | None]:
    from fleetops.fix import fix_plan_from_report
    from fleetops.scan import ScanOptions, run_scan

    inventories = list(args.inventory or [])
    if not inventories:
        plan_inventory = paths.default_inventory()
        inventories = [plan_inventory] if plan_inventory else []
        args.inventory = inventories
    console.print(f"scanning first ({args.sample_seconds:g}s between two samples) to find what to fix")
    report = run_scan(
        ScanOptions(inventory=inventories, limit=args.limit, sample_seconds=args.sample_seconds)
    )
    fix_plan, notes = fix_plan_from_report(report, ucx_fix=args.ucx_fix)
    for note in notes:
        console.print(f"[yellow]note: {note}[/]")
    for host, todo in fix_plan.items():
        console.print(
            f"  {host}: disable {', '.join(todo['disable_units']) or '-'}; reclaim {todo['reclaim']}"
            + _set_env_plan_text(todo)
        )
    return {**_fix_vars(args), "fleetops_fix_plan": fix_plan}, sorted(fix_plan)


def _unit_still_looping(post: dict[str, Any], units: list[str]) -> str | None:
    looping = [
        f["data"].get("unit")
        for f in post.get("findings", [])
        if f.get("check") == "crashloop_unit" and f["data"].get("unit") in units
    ]
    return f"gate: still crash looping after the fix: {', '.join(looping)}" if looping else None


def _disable_unit_gate(
    host: str, outcome: dict[str, Any], pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    unit = str(xv.get("fleetops_unit", ""))
    return _unit_still_looping(post, [unit if "." in unit else unit + ".service"])


def _fix_gate(
    host: str, outcome: dict[str, Any], pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    todo = (xv.get("fleetops_fix_plan") or {}).get(host, {})
    return _unit_still_looping(post, list(todo.get("disable_units", []))) or _set_env_still_leaking(
        post, [entry["unit"] for entry in todo.get("set_env", [])]
    )


def _reboot_gate(
    host: str, outcome: dict[str, Any], pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    before = (outcome.get("before") or {}).get("boot_id")
    after = (outcome.get("after") or {}).get("boot_id")
    if not before or not after:
        return "gate: could not read the boot id before and after the reboot"
    if before == after:
        return "gate: boot id unchanged: the host did not reboot"
    return None


def _reboot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reboot-timeout", type=int, default=600, metavar="S", help="seconds to wait for a host to come back"
    )
    p.add_argument(
        "--pre-hook",
        metavar="CMD",
        help="command run on the controller before each host's reboot, no shell ({host}: the inventory "
        "name, {node}: the k8s_node_name hostvar, else the inventory name); failing, the host fails "
        "and is not rebooted",
    )
    p.add_argument(
        "--post-hook",
        metavar="CMD",
        help="command run on the controller after each host came back and passed its gate (same {host}, "
        "{node}); failing, the host fails",
    )
    p.add_argument(
        "--kube-drain",
        action="store_true",
        help="before each reboot kubectl cordon + drain the host's node (--ignore-daemonsets "
        "--delete-emptydir-data; evictions respect PodDisruptionBudgets), uncordon it after the gate; "
        "skipped with a note when the controller has no kubectl or no kubeconfig; a failing drain "
        "fails the host, which is not rebooted",
    )
    p.add_argument(
        "--drain-timeout", type=int, default=600, metavar="S", help="kubectl drain --timeout (default: 600)"
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for --kube-drain (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--kubectl", default="kubectl", metavar="PATH", help="kubectl to run (default: kubectl)")


def _reboot_vars(args: argparse.Namespace) -> dict[str, Any]:
    xv: dict[str, Any] = {"fleetops_reboot_timeout": args.reboot_timeout}
    if args.pre_hook:
        xv["fleetops_pre_hook"] = args.pre_hook
    if args.post_hook:
        xv["fleetops_post_hook"] = args.post_hook
    if args.kube_drain:
        xv.update(
            fleetops_kube_drain=True,
            fleetops_drain_timeout=args.drain_timeout,
            fleetops_kubectl=args.kubectl,
        )
        if args.kubeconfig:
            xv["fleetops_kubeconfig"] = str(Path(args.kubeconfig).expanduser().resolve())
    if args.post_hook or args.kube_drain:
        xv["fleetops_phase"] = "reboot"  # uncordon and the post hook run after the gate (post_vars)
    return xv


def _reboot_post_vars(extravars: dict[str, Any]) -> dict[str, Any] | None:
    if extravars.get("fleetops_phase") == "reboot":
        return {"fleetops_phase": "post"}
    return None


def _set_env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name, value


def _set_env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit", required=True, metavar="NAME", help="the service whose environment to set")
    p.add_argument(
        "--env",
        action="append",
        type=_set_env_pair,
        required=True,
        metavar="KEY=VALUE",
        help="a variable to set (repeatable); names and values are validated on the host",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="restart the service when its environment changed (the batches stagger the restarts)",
    )
    p.add_argument(
        "--drop-in",
        default="50-fleetops-env.conf",
        metavar="FILE",
        help="the drop-in under /etc/systemd/system/UNIT.d/ (default: 50-fleetops-env.conf)",
    )


def _set_env_vars(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "fleetops_unit": args.unit,
        "fleetops_env": dict(args.env),
        "fleetops_restart": bool(args.restart),
        "fleetops_drop_in": args.drop_in,
    }


def _set_env_ucx_fix_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ucx-fix",
        choices=("hooks-off", "rcache-bound"),
        default="hooks-off",
        help="the environment fix for services running UCX with leaking memory hooks: "
        "UCX_MEM_MMAP_HOOK_MODE=none (hooks-off, default) or UCX_RCACHE_MAX_UNRELEASED=1024 (rcache-bound)",
    )


def _set_env_plan_text(todo: dict[str, Any]) -> str:
    return "".join(
        f"; set-env {entry['unit']} {' '.join(f'{k}={v}' for k, v in entry['env'].items())} (restart)"
        for entry in todo.get("set_env", [])
    )


def _set_env_still_leaking(post: dict[str, Any], units: list[str]) -> str | None:
    leaking = [
        f["summary"]
        for f in post.get("findings", [])
        if f.get("check") == "ucx_mmap_hooks"
        and f.get("severity") in ("warning", "critical")
        and (f.get("data") or {}).get("unit") in units
    ]
    return f"gate: still running UCX with the leaking setup: {'; '.join(leaking)}" if leaking else None


def _set_env_gate(
    host: str, outcome: dict[str, Any], pre: dict[str, Any] | None, post: dict[str, Any], xv: dict[str, Any]
) -> str | None:
    if not xv.get("fleetops_restart"):
        return None  # without a restart the running processes keep their old environment
    unit = str(xv.get("fleetops_unit", ""))
    return _set_env_still_leaking(post, [unit if "." in unit else unit + ".service"])


REMEDIATIONS: dict[str, Remediation] = {
    r.name: r
    for r in (
        Remediation(
            name="disable-unit",
            playbook="fleetops.node.remediate_disable_unit",
            actions=("fleetops.node.disable_unit",),
            help="stop, disable and mask a unit (and remove its container)",
            add_args=_disable_unit_args,
            extravars=_disable_unit_vars,
            gate=_disable_unit_gate,
        ),
        Remediation(
            name="reclaim",
            playbook="fleetops.node.remediate_reclaim",
            actions=("fleetops.node.reclaim_memcg",),
            help="free zombie memory cgroups by dropping the page cache that pins them",
            add_args=_reclaim_args,
            extravars=_reclaim_vars,
        ),
        Remediation(
            name="fix",
            playbook="fleetops.node.remediate_fix",
            actions=("fleetops.node.disable_unit", "fleetops.node.reclaim_memcg", "fleetops.node.set_env"),
            help="scan, then fix what was found: turn off crash-looping units, set the UCX fix, reclaim zombie memcgs",
            add_args=_fix_args,
            extravars=_fix_vars,
            prepare=_fix_prepare,
            gate=_fix_gate,
        ),
        Remediation(
            name="reboot",
            playbook="fleetops.node.rolling_reboot",
            actions=("ansible.builtin.reboot",),
            help="reboot hosts a few at a time; each must come back with a new boot id",
            add_args=_reboot_args,
            extravars=_reboot_vars,
            gate=_reboot_gate,
            probe_vars={"fleetops_probe_only": True},
            post_vars=_reboot_post_vars,
            cooldown=10.0,
        ),
        Remediation(
            name="set-env",
            playbook="fleetops.node.remediate_set_env",
            actions=("fleetops.node.set_env",),
            help="set environment variables of a service (a systemd drop-in), restart it if asked",
            add_args=_set_env_args,
            extravars=_set_env_vars,
            gate=_set_env_gate,
        ),
    )
}


@dataclass(frozen=True)
class FailureBudget:
    """--max-failures: failed hosts tolerated, as a count or a percent of the planned hosts (rounded down)."""

    count: int | None = None
    percent: Fraction | None = None

    @classmethod
    def parse(cls, text: str) -> FailureBudget:
        raw = text.strip()
        try:
            if raw.endswith("%"):
                pct = Fraction(raw[:-1].strip())
                if not 0 <= pct <= 100:
                    raise ValueError
                return cls(percent=pct)
            count = int(raw)
            if count < 0:
                raise ValueError
            return cls(count=count)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(
                f"not a host count >= 0 or a percentage 0-100%: {text!r}"
            ) from None

    def tolerated(self, hosts: int) -> int:
        if self.count is not None:
            return self.count
        return math.floor((self.percent or Fraction(0)) * hosts / 100)


def _resolve_targets(
    args: argparse.Namespace, remediation: Remediation, console: Console
) -> dict[str, Any] | None:
    """Extra vars for the rollout, narrowing args.limit to the hosts that need it; None: nothing to do."""
    extravars = remediation.extravars(args)
    if remediation.prepare is not None:
        extravars, targets = remediation.prepare(args, console)
        if targets is not None:
            if not targets:
                return None
            args.limit = ",".join(targets)
    return extravars


def start_rollout(args: argparse.Namespace, remediation: Remediation, console: Console) -> Rollout | None:
    extravars = _resolve_targets(args, remediation, console)
    if extravars is None:
        console.print("nothing to do: no host has a finding this remediation acts on")
        return None
    if not args.inventory:
        default = paths.default_inventory()
        if default is None:
            raise UsageError("no inventory given and no fleetops checkout found: use -i INVENTORY")
        args.inventory = [default]
    hosts = load_hosts(list(args.inventory), args.limit, args.group_by)
    reasons: dict[str, str | None] = {}
    if args.apply:
        reasons = preflight(hosts, timeout=args.preflight_timeout)
        down = {h: why for h, why in reasons.items() if why}
        for host, why in down.items():
            console.print(f"[yellow]preflight: {host}: {why}[/]")
        allowed = args.preflight_max_unreachable.tolerated(len(hosts))
        if len(down) > allowed:
            raise RolloutError(
                f"Failed to start the rollout: preflight found {len(down)} of {len(hosts)} host(s) unreachable, "
                f"more than the {allowed} allowed (--preflight-max-unreachable); nothing was changed"
            )
        if down:
            args.exclude = [*args.exclude, *down]
            console.print(
                f"preflight: leaving out {len(down)} unreachable host(s); {len(hosts) - len(down)} ok"
            )
    plan, group_by = plan_from_args(args)
    rollout = new_rollout(
        action=remediation.name,
        apply=bool(args.apply),
        inventory=list(args.inventory),
        extravars=extravars,
        plan=plan_document(remediation.name, plan, group_by),
        max_failures=args.max_failures.tolerated(plan.hosts),
        cooldown=remediation.cooldown if args.cooldown is None else args.cooldown,
        gate=not args.no_gate,
        state_path=args.state,
    )
    rollout.preflight = reasons
    if "fleetops_kube_drain" in rollout.extravars:
        rollout.extravars["fleetops_rollout"] = rollout.id  # the node annotation names who cordoned it
    if args.apply and not args.no_ec2_lease:
        instances = lease_targets(h for h in hosts if h.name in rollout.hosts)
        if instances and connection_for(list(args.inventory)) is not None:
            rollout.lease = {"ttl": args.lease_ttl, "settle": args.lease_settle, "instances": instances}
    for host, reason in reasons.items():
        if reason:
            rollout.hosts[host] = HOST_SKIPPED
            rollout.results[host] = {"status": "skipped", "changed": False, "msg": f"preflight: {reason}"}
    return rollout


def execute(rollout: Rollout, remediation: Remediation, console: Console, break_lock: bool | str) -> Rollout:
    targets = [h for h, s in rollout.hosts.items() if s != HOST_SKIPPED]
    with locked(rollout, targets, break_lock, console) as guard:
        engine = Engine(
            rollout=rollout,
            playbook=remediation.playbook,
            actions=remediation.actions,
            gate_check=remediation.gate,
            console=console,
            probe_vars=remediation.probe_vars,
            post_vars=remediation.post_vars(rollout.extravars) if remediation.post_vars else None,
            guard=guard,
        )
        if rollout.apply:
            console.print(f"[dim]rollout {rollout.id}: state {rollout.state_path}[/]")
        return engine.run()


def report_document(rollout: Rollout) -> dict[str, Any]:
    """The ``fleetops.rollout.engine/v1`` report of a rollout (also what `fleetops report STATE` prints as JSON)."""
    return {
        "schema": SCHEMA,
        "id": rollout.id,
        "action": rollout.action,
        "apply": rollout.apply,
        "status": rollout.status,
        "operator": rollout.operator,
        "state": rollout.state_path,
        "plan": rollout.plan,
        "max_failures": rollout.max_failures,
        "batches": [
            {**b, "results": {h: rollout.results.get(h) for h in b["hosts"]}} for b in rollout.batches
        ],
        "hosts": rollout.hosts,
        "stopped": rollout.stopped,
        "needs_reboot": needs_reboot(rollout),
        "summary": rollout.summary(),
    }


def needs_reboot(rollout: Rollout) -> list[str]:
    """Hosts whose reclaim left zombies at or above its reboot threshold: the rolling reboot's input."""
    hosts = []
    for host, outcome in rollout.results.items():
        result = (outcome or {}).get("result") or {}
        results = result.get("tasks") if "tasks" in result else [result]
        if any(isinstance(r, dict) and r.get("needs_reboot") for r in results or []):
            hosts.append(host)
    return sorted(hosts)


def _exit_code(rollout: Rollout) -> int:
    if rollout.status == "interrupted":
        return EXIT_INTERRUPTED
    s = rollout.summary()
    return EXIT_FAILED if (s["failed"] or rollout.status != "done") else EXIT_OK


def print_summary(rollout: Rollout, console: Console) -> None:
    s = rollout.summary()
    verb = "changed" if rollout.apply else "would change"
    console.print(
        f"{rollout.action}: {s['hosts']} host(s): {s['changed']} {verb}, {s['done']} done, {s['failed']} failed, "
        f"{s['pending']} pending, {s['skipped']} skipped; status {rollout.status}"
        + ("" if rollout.apply else " (dry run: add --apply to change hosts)"),
        soft_wrap=True,  # one line whatever the console's width (CI, AWX, logs)
    )
    still = needs_reboot(rollout)
    if still:
        console.print(
            f"[yellow]{len(still)} host(s) still need a reboot (zombies the reclaim could not free): "
            f"{' '.join(still)}[/]\n  next: fleetops remediate reboot -i INVENTORY --limit {','.join(still)} --apply",
            soft_wrap=True,
        )


def cmd_remediate(args: argparse.Namespace) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # log lines unbroken (CI, AWX)
    if args.resume is not None:
        if args.remediation is not None:
            raise UsageError("--resume continues a saved rollout: give no ACTION with it")
        rollout = Rollout.load(args.resume)
        if rollout.status == "done":
            console.print(f"rollout {rollout.id} is already done")
        else:
            console.print(f"resuming rollout {rollout.id} ({rollout.action}, status {rollout.status})")
            rollout = execute(rollout, REMEDIATIONS[rollout.action], console, args.break_lock)
        fmt = args.format
    else:
        if args.remediation is None:
            raise UsageError("remediate needs an ACTION (" + ", ".join(REMEDIATIONS) + ") or --resume STATE")
        remediation = REMEDIATIONS[args.remediation]
        started = start_rollout(args, remediation, console)
        if started is None:
            if args.format == "json":
                sys.stdout.write(json.dumps({"schema": SCHEMA, "action": remediation.name, "apply": bool(args.apply),
                                             "plan": {"hosts": 0, "batches": []}, "batches": [], "stopped": None,
                                             "summary": {"hosts": 0, "changed": 0, "done": 0, "failed": 0,
                                                         "pending": 0, "skipped": 0}}, indent=2) + "\n")  # fmt: skip
            return EXIT_OK
        rollout = execute(started, remediation, console, args.break_lock)
        fmt = args.format
    if fmt == "json":
        sys.stdout.write(json.dumps(report_document(rollout), indent=2, default=str) + "\n")
    else:
        print_summary(rollout, Console(highlight=False))
    return _exit_code(rollout)


def _add_rollout_options(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("--apply", action="store_true", help="change hosts (default: dry run, check mode + diff)")
    rp.add_argument(
        "--max-failures",
        type=FailureBudget.parse,
        default=FailureBudget(count=0),
        metavar="N|P%",
        help="failed hosts tolerated before the rollout stops (default: 0)",
    )
    rp.add_argument("--cooldown", type=float, default=None, metavar="S", help="seconds between batches")
    rp.add_argument("--no-gate", action="store_true", help="skip the health gate after each batch")
    rp.add_argument(
        "--preflight-max-unreachable",
        type=FailureBudget.parse,
        default=FailureBudget(count=0),
        metavar="N|P%",
        help="unreachable hosts (ssh, host key, login) left out before the rollout refuses to start (default: 0)",
    )
    rp.add_argument("--preflight-timeout", type=float, default=5.0, metavar="S", help=argparse.SUPPRESS)
    rp.add_argument("--state", type=Path, metavar="FILE", help="where to keep the rollout state (default: under "
                    "$FLEETOPS_STATE_DIR, /var/lib/fleetops as root)")  # fmt: skip
    rp.add_argument(
        "--break-lock",
        nargs="?",
        const=True,
        default=False,
        type=rollout_id,
        metavar="ROLLOUT",
        help="take host locks and EC2 leases held by a stale rollout (any, or only ROLLOUT's); an "
        "expired EC2 lease is taken over without it",
    )
    rp.add_argument(
        "--lease-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="S",
        help="EC2 inventories: the instances' lease tag expires S seconds after its last renewal "
        f"(renewed every S/3 while the rollout runs; default: {DEFAULT_TTL_S:g})",
    )
    rp.add_argument("--lease-settle", type=float, default=DEFAULT_SETTLE_S, help=argparse.SUPPRESS)
    rp.add_argument(
        "--no-ec2-lease",
        action="store_true",
        help="do not tag EC2 instances with a lease (the local lock still holds; e.g. no ec2:CreateTags)",
    )
    rp.add_argument("--format", choices=("table", "json"), default="table")


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops remediate ACTION ...`` (one sub-command per remediation) and ``--resume STATE``."""
    p = subparsers.add_parser(
        "remediate",
        help="run a remediation in rolling batches (a dry run unless --apply)",
        description="Run a remediation batch by batch (one ansible-runner invocation per batch), planned "
        "with the same caps as `fleetops plan`, with a preflight, a health gate after each batch, a circuit "
        "breaker, host locks, an audit log and resumable state. Dry run (check mode + diff) unless --apply.",
        epilog=ROLLOUT_EPILOG,
    )
    p.add_argument("--resume", type=Path, metavar="STATE", help="continue a rollout from its state file")
    p.add_argument(
        "--break-lock",
        nargs="?",
        const=True,
        default=False,
        type=rollout_id,
        metavar="ROLLOUT",
        help="with --resume: take locks and EC2 leases held by a stale rollout (any, or only ROLLOUT's)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    sub = p.add_subparsers(dest="remediation", metavar="ACTION", parser_class=type(p))
    for remediation in REMEDIATIONS.values():
        rp = sub.add_parser(
            remediation.name, help=remediation.help, description=remediation.help, epilog=ROLLOUT_EPILOG
        )
        remediation.add_args(rp)
        add_target_args(rp)
        add_rollout_args(rp)
        _add_rollout_options(rp)
        rp.set_defaults(resume=None)
    p.set_defaults(func=cmd_remediate, remediation=None)


def register_report[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """``fleetops report STATE``: what a rollout did (batches, hosts, failures, what is left)."""
    p = subparsers.add_parser("report", help="summarise a rollout from its state file")
    p.add_argument("state", type=Path, metavar="STATE")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    rollout = Rollout.load(args.state)
    if args.format == "json":
        sys.stdout.write(json.dumps(report_document(rollout), indent=2, default=str) + "\n")
        return 0
    console = Console(highlight=False)
    console.print(f"[bold]rollout {rollout.id}[/]: {rollout.action}, {'apply' if rollout.apply else 'dry run'}, "
                  f"by {rollout.operator}, status {rollout.status}")  # fmt: skip
    table = Table()
    for col in ("batch", "hosts", "started", "took", "results"):
        table.add_column(col)
    for b in rollout.batches:
        took = f"{b['finished'] - b['started']:.1f}s" if b.get("finished") else "(cut short)"
        results = ", ".join(f"{h}:{rollout.hosts.get(h)}" for h in b["hosts"])
        started = time.strftime("%H:%M:%S", time.localtime(b["started"]))
        table.add_row(str(b.get("index", "")), str(len(b["hosts"])), started, took, results)
    console.print(table)
    for host, outcome in rollout.results.items():
        if rollout.hosts.get(host) in (HOST_FAILED, HOST_SKIPPED):
            console.print(f"  [red]{host}[/]: {outcome.get('gate') or outcome.get('msg')}")
    if rollout.stopped:
        console.print(
            f"[bold red]stopped[/] after batch {rollout.stopped['after_batch']}: {rollout.stopped['reason']}"
        )
        console.print(f"pending ({len(rollout.stopped['pending'])}): {' '.join(rollout.stopped['pending'])}")
    print_summary(rollout, console)
    return 0 if rollout.status == "done" and not rollout.failures() else EXIT_FAILED
