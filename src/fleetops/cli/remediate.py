"""`fleetops remediate ACTION`: the argparse side of the rollouts (see ``fleetops.remediations`` for what
each remediation does and ``fleetops.api.remediate`` for how it runs).

One batch = one ansible-runner invocation limited to that batch's hosts. A dry run (check mode +
diff) unless ``--apply``. A circuit breaker stops the rollout once failed hosts pass
``--max-failures`` (exactly that many are tolerated; one more stops it): hosts of later batches
stay untouched and are reported as pending.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops.ansible import facts
from fleetops.cli.args import (
    add_format_arg,
    add_target_args,
    argtype,
    collection_default,
    int_range,
    lease_settle,
    lease_ttl,
    rollout_id,
    seconds,
    seconds_range,
    shown,
    whole_seconds,
)
from fleetops.cli.plan import add_rollout_args, targets_and_caps
from fleetops.cli.rollout_args import add_kubectl_args, host_timeout, max_unhealthy, not_after
from fleetops.errors import UsageError
from fleetops.remediations import MAX_HOST_TIMEOUT_S, REMEDIATIONS
from fleetops.rollout.budget import FailureBudget
from fleetops.util import DAY_S

if TYPE_CHECKING:
    from rich.console import Console

    from fleetops import api
    from fleetops.rollout.state import Rollout


def __getattr__(name: str) -> Any:
    if name == "SCHEMA":  # api.ROLLOUT_SCHEMA, without importing the api before a command runs
        from fleetops import api

        return api.ROLLOUT_SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ROLLOUT_EPILOG = (
    "While it runs: progress on stderr (a live line on a terminal, plain 'progress:' lines otherwise). "
    "Ctrl-C stops after the current batch with the state saved (a second Ctrl-C, SIGTERM or SIGHUP aborts "
    "the batch at once; --resume probes its hosts first). `fleetops stop` stops it after its current batch. "
    "Exit codes: 0 done (every host verified), 2 usage error, 3 a host failed, timed out, was skipped or is "
    "in doubt, or the rollout stopped (breaker, kill switch, deadline, capacity floor), 4 hosts locked (lock "
    "file or EC2 lease) by another rollout, 130 interrupted, 143 SIGTERM, 129 SIGHUP."
)
_failure_budget = argtype(FailureBudget.parse)


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


def _reclaim_args(p: argparse.ArgumentParser) -> None:
    # for the help only: unset, the module's default applies
    warning = collection_default(facts.zombie_warning_default)
    p.add_argument(
        "--min-zombies",
        type=int_range(0),
        default=None,
        metavar="N",
        help=f"do nothing on hosts with fewer zombies (>= 0; default: the module's{shown(warning)}, the scan's "
        "warning level: dropping the page cache costs every workload on the host its cached files)",
    )
    p.add_argument(
        "--reboot-threshold",
        type=int_range(0),
        default=None,
        metavar="N",
        help="zombies left after the reclaim that mark a host as needing a reboot "
        f"(>= 0; default: the module's{shown(warning)})",
    )
    _reclaim_method_arg(p)


def _reclaim_method_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        choices=("drop_caches", "memory_reclaim", "both"),
        default=None,
        help="how to reclaim: drop_caches (default, the module's): every clean page cache page on the host; "
        "memory_reclaim (cgroup v2, Linux >= 5.19): memory.reclaim of the cgroups the zombies hang under, what "
        "they pin and little else; both: memory_reclaim, then drop_caches where zombies remain (README: "
        "memory.reclaim)",
    )


def _fix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample-seconds",
        type=seconds,
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
    warning = collection_default(facts.zombie_warning_default)
    p.add_argument(
        "--min-zombies",
        type=int_range(0),
        default=None,
        metavar="N",
        help=f"reclaim only on hosts with at least N zombies, as reclaim does (>= 0; default: the module's"
        f"{shown(warning)}, the scan's warning level)",
    )
    p.add_argument(
        "--reboot-threshold",
        type=int_range(0),
        default=None,
        metavar="N",
        help=f"see reclaim (>= 0; default: the module's{shown(warning)})",
    )
    _reclaim_method_arg(p)
    _set_env_ucx_fix_arg(p)


def _set_env_ucx_fix_arg(p: argparse.ArgumentParser) -> None:
    fixes = collection_default(facts.ucx_fixes)  # None without the collection: the command then says so
    fix = collection_default(facts.ucx_default_fix) or "the module's"
    p.add_argument(
        "--ucx-fix",
        choices=None if fixes is None else tuple(fixes),
        default=None,
        help="the environment fix for services running UCX with leaking memory hooks: "
        f"UCX_RCACHE_MAX_UNRELEASED=1024 (rcache-bound) or UCX_MEM_MMAP_HOOK_MODE=none (hooks-off; it also turns "
        f"the registration cache off); default: {fix} (README: the UCX fix)",
    )


def _reboot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reboot-timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help=f"seconds to wait for a host to come back (1..{DAY_S}; default: 600)",
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
        "--drain-timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help=f"kubectl drain --timeout (1..{DAY_S}; 0 would mean forever; default: 600)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for --kube-drain (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--kubectl", default="kubectl", metavar="PATH", help="kubectl to run (default: kubectl)")


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
    p.add_argument(
        "--show-values",
        action="store_true",
        help="keep the values as given in results, state, audit log and reports (default: only a digest, "
        "sha256:<12 hex>, as they may be secrets; a rollout without them cannot be resumed: run it again)",
    )


def _quarantine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--finding",
        required=True,
        metavar="CHECK",
        help="the finding's check name (e.g. crashloop_unit): the taint's value and the annotation's check",
    )
    p.add_argument("--reason", default="", metavar="TEXT", help="why, kept in the node's annotation")
    p.add_argument(
        "--evict",
        action="store_true",
        help="also kubectl drain the node (--ignore-daemonsets --delete-emptydir-data; evictions respect "
        "PodDisruptionBudgets); a drain that does not finish in --drain-timeout fails the host, which stays "
        "quarantined",
    )
    p.add_argument(
        "--drain-timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help=f"kubectl drain --timeout with --evict (1..{DAY_S}; default: 600)",
    )
    add_kubectl_args(p)


def _unquarantine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample-seconds",
        type=seconds,
        default=10.0,
        metavar="S",
        help="the scan first (a host it still finds failing its quarantine's check is refused): "
        "seconds between its two samples (default: 10)",
    )
    add_kubectl_args(p)


def _stop_start_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stop-timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help=f"seconds to wait for an instance to be stopped (1..{DAY_S}; default: 600)",
    )
    p.add_argument(
        "--start-timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help=f"seconds to wait for it to be running again, and then for ssh (1..{DAY_S}; default: 600)",
    )
    p.add_argument(
        "--finding",
        metavar="CHECK",
        help="the check the stop-start should clear (e.g. gpu_health): the gate fails a host whose scan still "
        "finds it at warning or critical (the boot id and scheduled EC2 events are always checked)",
    )


def _replace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=whole_seconds(1, DAY_S),
        default=600,
        metavar="S",
        help="seconds to wait for the group to be back at its desired capacity with the new instance InService "
        f"and Healthy, and then for the new instance to answer ssh (1..{DAY_S}; default: 600)",
    )
    p.add_argument(
        "--method",
        choices=("terminate", "unhealthy"),
        default="terminate",
        help="terminate (default): TerminateInstanceInAutoScalingGroup without lowering the desired capacity; "
        "unhealthy: SetInstanceHealth Unhealthy, the group replaces it on its next health check",
    )


# remediation -> the options it takes; their argparse dests are the remediation's params
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "disable-unit": _disable_unit_args,
    "reclaim": _reclaim_args,
    "fix": _fix_args,
    "reboot": _reboot_args,
    "set-env": _set_env_args,
    "quarantine": _quarantine_args,
    "unquarantine": _unquarantine_args,
    "stop-start": _stop_start_args,
    "replace": _replace_args,
}


def remediation_request(args: argparse.Namespace) -> api.RemediationRequest:
    """The library request for ``fleetops remediate ACTION ...``."""
    from fleetops import api
    from fleetops.rollout.lease import validate_ttl

    remediation = REMEDIATIONS[args.remediation]
    params = {name: getattr(args, name) for name in remediation.params if hasattr(args, name)}
    return api.RemediationRequest(
        action=remediation.name,
        **targets_and_caps(args),
        params=params,
        apply=bool(args.apply),
        max_failures=args.max_failures,
        cooldown=args.cooldown,
        gate=not args.no_gate,
        preflight_max_unreachable=args.preflight_max_unreachable,
        preflight_timeout=args.preflight_timeout,
        state=args.state,
        break_lock=args.break_lock,
        lease_ttl=validate_ttl(args.lease_ttl, args.lease_settle),  # the pair: TTL above the settle time
        lease_settle=args.lease_settle,
        ec2_lease=not args.no_ec2_lease,
        host_timeout=args.host_timeout,
        max_unhealthy=args.max_unhealthy,
        not_after=args.not_after,
    )


def print_summary(rollout: Rollout, console: Console) -> None:
    from fleetops import api

    s = rollout.summary()
    verb = "changed" if rollout.apply else "would change"
    console.print(
        f"{rollout.action}: {s['hosts']} host(s): {s['changed']} {verb}, {s['done']} done, {s['failed']} failed, "
        f"{s['pending']} pending, {s['skipped']} skipped; status {rollout.status}"
        + ("" if rollout.apply else " (dry run: add --apply to change hosts)"),
        soft_wrap=True,  # one line whatever the console's width (CI, AWX, logs)
    )
    still = api.needs_reboot(rollout)
    if still:
        console.print(
            f"[yellow]{len(still)} host(s) still need a reboot (zombies the reclaim could not free): "
            f"{' '.join(still)}[/]\n  next: fleetops remediate reboot -i INVENTORY --limit {','.join(still)} --apply",
            soft_wrap=True,
        )


def cmd_remediate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api
    from fleetops.cli.progress import ConsoleObserver

    console = Console(stderr=True, highlight=False, soft_wrap=True)  # log lines unbroken (CI, AWX)
    observer = ConsoleObserver(console)
    if args.resume is not None:
        if args.remediation is not None:
            raise UsageError("--resume continues a saved rollout: give no ACTION with it")
        request = api.ResumeRequest(
            state=args.resume,
            break_lock=args.break_lock,
            not_after=args.resume_not_after,
            max_unhealthy=args.resume_max_unhealthy,
        )
        result = api.resume(request, observer)
    else:
        if args.resume_not_after is not None or args.resume_max_unhealthy is not None:
            raise UsageError(
                "--not-after / --max-unhealthy before ACTION are --resume's: give them after ACTION"
            )
        if args.remediation is None:
            raise UsageError("remediate needs an ACTION (" + ", ".join(REMEDIATIONS) + ") or --resume STATE")
        result = api.remediate(remediation_request(args), observer)
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
    elif result.rollout is not None:
        print_summary(result.rollout, Console(highlight=False))
    return result.exit_code


def _lease_defaults() -> tuple[float, float]:
    """The lease's TTL and settle time (module_utils/lease.py's, read from its source)."""
    from fleetops.rollout.lease import DEFAULT_SETTLE_S, DEFAULT_TTL_S

    return DEFAULT_TTL_S, DEFAULT_SETTLE_S


def _add_rollout_options(rp: argparse.ArgumentParser) -> None:
    ttl, settle = collection_default(_lease_defaults) or (None, None)
    ttl_text = "the collection's" if ttl is None else f"{ttl:g}"
    rp.add_argument("--apply", action="store_true", help="change hosts (default: dry run, check mode + diff)")
    rp.add_argument(
        "--max-failures",
        type=_failure_budget,
        default=FailureBudget(count=0),
        metavar="N|P%",
        help="failed hosts tolerated before the rollout stops (default: 0)",
    )
    rp.add_argument(
        "--cooldown",
        type=seconds_range(0, DAY_S),
        default=None,
        metavar="S",
        help=f"seconds between batches (0..{DAY_S}; default: the remediation's)",
    )
    rp.add_argument(
        "--host-timeout",
        type=host_timeout,
        default=None,
        metavar="S",
        help=f"time limit of each remediation task on a host, 1-{MAX_HOST_TIMEOUT_S} s (default: 1800 for reboot, which "
        "must exceed --reboot-timeout plus --drain-timeout; 600 for the others); a host past it fails "
        "'timed out after S s' and counts for --max-failures",
    )
    rp.add_argument(
        "--max-unhealthy",
        type=max_unhealthy,
        default=None,
        metavar="N|P%",
        help="capacity floor: a batch does not start while more than N hosts (or P%% of its group, "
        "rounded down; N,P%%: the smaller) of its group are unhealthy (preflight-unreachable, failed, "
        "timed out, failed gate); the rollout stops (exit 3), the rest pending for --resume "
        "(default: 10%% for reboot, none for the others)",
    )
    rp.add_argument(
        "--not-after",
        type=not_after,
        default=None,
        metavar="TIME",
        help="deadline: no batch starts at or after TIME (ISO 8601, a naive time is local; or a duration "
        "from now: 90m, 2h, 1h30m); the rollout then stops (exit 3), the rest pending for --resume",
    )
    rp.add_argument("--no-gate", action="store_true", help="skip the health gate after each batch")
    rp.add_argument(
        "--preflight-max-unreachable",
        type=_failure_budget,
        default=FailureBudget(count=0),
        metavar="N|P%",
        help="unreachable hosts (ssh, host key, login) left out before the rollout refuses to start (default: 0)",
    )
    rp.add_argument(
        "--preflight-timeout",
        type=seconds_range(0, 300, above=True),
        default=5.0,
        metavar="S",
        help=argparse.SUPPRESS,
    )
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
        type=lease_ttl,
        default=ttl,
        metavar="S",
        help="EC2 inventories: the instances' lease tag expires S seconds after its last renewal "
        f"(renewed every S/3 while the rollout runs; default: {ttl_text})",
    )
    rp.add_argument("--lease-settle", type=lease_settle, default=settle, help=argparse.SUPPRESS)
    rp.add_argument(
        "--no-ec2-lease",
        action="store_true",
        help="do not tag EC2 instances with a lease (the local lock still holds; e.g. no ec2:CreateTags)",
    )
    add_format_arg(rp)


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
        "--not-after",
        dest="resume_not_after",
        type=not_after,
        default=None,
        metavar="TIME",
        help="with --resume: a new deadline for the rest (default: the saved one)",
    )
    p.add_argument(
        "--max-unhealthy",
        dest="resume_max_unhealthy",
        type=max_unhealthy,
        default=None,
        metavar="N|P%",
        help="with --resume: a new capacity floor for the rest (default: the saved one)",
    )
    p.add_argument(
        "--break-lock",
        nargs="?",
        const=True,
        default=False,
        type=rollout_id,
        metavar="ROLLOUT",
        help="with --resume: take locks and EC2 leases held by a stale rollout (any, or only ROLLOUT's)",
    )
    add_format_arg(p)
    sub = p.add_subparsers(dest="remediation", metavar="ACTION", parser_class=type(p))
    for remediation in REMEDIATIONS.values():
        rp = sub.add_parser(
            remediation.name, help=remediation.help, description=remediation.help, epilog=ROLLOUT_EPILOG
        )
        ARGUMENTS[remediation.name](rp)
        add_target_args(rp)
        add_rollout_args(rp)
        _add_rollout_options(rp)
        rp.set_defaults(resume=None)
    from fleetops.cli.auto import register_auto

    register_auto(sub)
    p.set_defaults(func=cmd_remediate, remediation=None)
