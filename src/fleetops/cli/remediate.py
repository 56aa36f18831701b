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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops.cli.args import (
    add_format_arg,
    add_quiet_arg,
    add_target_args,
    argtype,
    collection_default,
    lease_settle,
    lease_ttl,
    rollout_id,
    seconds_range,
)
from fleetops.cli.helptext import epilog
from fleetops.cli.plan import add_rollout_args, targets_and_caps
from fleetops.cli.rollout_args import add_param, host_timeout, max_unhealthy, not_after
from fleetops.errors import UsageError
from fleetops.remediations import MAX_HOST_TIMEOUT_S, REMEDIATIONS, Remediation
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
    "While it runs: progress on stderr (a live line on a terminal, plain 'progress:' lines otherwise; -q: "
    "only warnings, errors and failed hosts). "
    "Ctrl-C stops after the current batch with the state saved (a second Ctrl-C, SIGTERM or SIGHUP aborts "
    "the batch at once; --resume probes its hosts first). `fleetops stop` stops it after its current batch."
)
_failure_budget = argtype(FailureBudget.parse)
# a dry run's status in its summary line: a dry run that went through every host is "checked", not "done"
DRY_RUN_STATUS = {"done": "every host checked"}


def add_params(p: argparse.ArgumentParser, remediation: Remediation) -> None:
    """One option per parameter of ``remediation`` (its declaration), the parameter's name as dest."""
    for param in remediation.parameters:
        add_param(p, param)


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
    rest = f"{s['failed']} failed, {s['pending']} pending, {s['skipped']} skipped"
    if rollout.apply:
        counts, status = f"{s['changed']} changed, {s['done']} done, {rest}", f"status {rollout.status}"
    else:  # a dry run did nothing: its hosts were checked, and would change or not (never "done")
        counts = f"{s['done']} checked ({s['changed']} would change), {rest}"
        status = DRY_RUN_STATUS.get(rollout.status, f"status {rollout.status}")
        status += " (dry run: add --apply to change hosts)"
    console.print(
        f"{rollout.action}: {s['hosts']} host(s): {counts}; {status}",
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
    from fleetops.cli.observer import ConsoleObserver, QuietObserver

    console = Console(stderr=True, highlight=False, soft_wrap=True)  # log lines unbroken (CI, AWX)
    observer = (QuietObserver if args.quiet else ConsoleObserver)(console)
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


def _waits_text(remediation: Remediation) -> str:
    """ ", which must exceed --reboot-timeout plus --drain-timeout" for a remediation that waits."""
    labels = [label for p in remediation.parameters for label, _var in p.wait_labels()]
    return f", which must exceed {' plus '.join(labels)}" if labels else ""


def _lease_defaults() -> tuple[float, float]:
    """The lease's TTL and settle time (module_utils/lease.py's, read from its source)."""
    from fleetops.rollout.lease import DEFAULT_SETTLE_S, DEFAULT_TTL_S

    return DEFAULT_TTL_S, DEFAULT_SETTLE_S


def _add_rollout_options(rp: argparse.ArgumentParser, remediation: Remediation) -> None:
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
        help=f"seconds between batches (0..{DAY_S}; default: {remediation.cooldown:g})",
    )
    rp.add_argument(
        "--host-timeout",
        type=host_timeout,
        default=None,
        metavar="S",
        help=f"time limit of each remediation task on a host, 1-{MAX_HOST_TIMEOUT_S} s (default: "
        f"{remediation.host_timeout}{_waits_text(remediation)}); a host past it fails 'timed out after S s' and "
        "counts for --max-failures",
    )
    rp.add_argument(
        "--max-unhealthy",
        type=max_unhealthy,
        default=None,
        metavar="N|P%",
        help="capacity floor: a batch does not start while more than N hosts (or P%% of its group in the "
        "whole inventory, rounded down; N,P%%: the smaller) of its group are unhealthy (preflight-unreachable, "
        "failed, timed out, failed gate, or a node cordoned, drained or down by anyone, read before each "
        "batch); the rollout stops (exit 3), the rest pending for --resume "
        f"(default: {(remediation.max_unhealthy or 'none').replace('%', '%%')})",
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
    rp.add_argument("--state", type=Path, metavar="STATE", help="where to keep the rollout state (default: under "
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
    add_quiet_arg(rp, inherited=True)


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops remediate ACTION ...`` (one sub-command per remediation) and ``--resume STATE``."""
    p = subparsers.add_parser(
        "remediate",
        help="run a remediation in rolling batches (a dry run unless --apply)",
        description="Run a remediation batch by batch (one ansible-runner invocation per batch), planned "
        "with the same caps as `fleetops plan`, with a preflight, a health gate after each batch, a circuit "
        "breaker, host locks, an audit log and resumable state. Dry run (check mode + diff) unless --apply.",
        epilog=epilog("remediate", before=ROLLOUT_EPILOG),
    )
    add_quiet_arg(p)
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
            remediation.name,
            help=remediation.help,
            description=remediation.help,
            epilog=epilog("remediate ACTION", remediation.examples, before=ROLLOUT_EPILOG),
        )
        add_params(rp, remediation)
        add_target_args(rp)
        add_rollout_args(rp)
        _add_rollout_options(rp, remediation)
        rp.set_defaults(resume=None)
    from fleetops.cli.auto import register_auto

    register_auto(sub)
    p.set_defaults(func=cmd_remediate, remediation=None)
