"""``fleetops remediate auto``: one pass of a remediation policy (``fleetops.auto`` does the work)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetops.cli.args import (
    add_format_arg,
    add_policy_arg,
    add_quiet_arg,
    add_reason_arg,
    add_state_dir_arg,
    add_target_args,
    seconds_range,
)
from fleetops.cli.helptext import epilog
from fleetops.cli.plan import add_rollout_args, targets_and_caps
from fleetops.cli.rollout_args import add_kubectl_args, host_timeout, max_unhealthy, not_after
from fleetops.exitcodes import AUTO_FAIL_ON, AUTO_FAIL_ON_DEFAULT

if TYPE_CHECKING:
    from fleetops import api

HELP = "one pass of a remediation policy: scan, decide per host, climb each host's ladder (dry run unless --apply)"
DESCRIPTION = (
    "Scan the hosts, decide for each by the policy (fleetops.policy/v1: for each finding a ladder of "
    "actions, each rung given time to clear it, per-action budgets), run each action as a rollout (the "
    "same batches, gates, locks, EC2 lease and audit as `fleetops remediate ACTION`), and remember per "
    "host which rung was tried when (the state directory and, on EC2, the instance's fleetops.io/ladder "
    "tag, and the budgeted actions in its fleetops.io/spent tag), so that the next pass climbs and spends "
    "the same budgets. One line per host says its finding, rule, rung and the action "
    "taken or why none. A dry run unless --apply; a dry run records nothing."
)
# --lift-brake RULE is `fleetops brake lift RULE` now; the flag is kept for one release, saying so on stderr
LIFT_BRAKE_DEPRECATED = (
    "--lift-brake is deprecated and goes in the next release: use `fleetops brake lift RULE [--reason TEXT]`"
)


def register_auto[P: argparse.ArgumentParser](sub: argparse._SubParsersAction[P]) -> None:
    """Add ``remediate auto`` beside the remediations (``sub``: remediate's sub-commands)."""
    p = sub.add_parser("auto", help=HELP, description=DESCRIPTION, epilog=epilog("remediate auto"))
    add_policy_arg(p)
    p.add_argument(
        "--from",
        dest="from_report",
        type=Path,
        metavar="SCAN",
        help="a what-if: decide against this saved scan report (fleetops scan -o SCAN; fleetops.scan/v1) "
        "and print what each host's rung would do; no host is contacted, no store opened, nothing recorded "
        "(the state directory's ladders and budgets are read, never written)",
    )
    add_target_args(p)
    add_rollout_args(p)
    p.add_argument("--apply", action="store_true", help="act and record (default: dry run, nothing recorded)")
    p.add_argument(
        "--sample-seconds",
        type=seconds_range(0, 600),
        default=10.0,
        metavar="S",
        help="seconds between the scan's two samples (growth and restart rates; default: 10)",
    )
    add_state_dir_arg(
        p,
        "where the ladders, the budget ledger and the fleet record live; controllers sharing it share the "
        "budgets",
    )
    p.add_argument(
        "--no-ec2-tags",
        action="store_true",
        help="do not read or write the instances' fleetops.io/ladder and fleetops.io/spent tags "
        "(e.g. no ec2:CreateTags; a controller with another state directory then knows neither)",
    )
    p.add_argument("--host-timeout", type=host_timeout, default=None, metavar="S",
                   help="each action's --host-timeout (default: the action's)")  # fmt: skip
    p.add_argument("--max-unhealthy", type=max_unhealthy, default=None, metavar="N|P%",
                   help="each action's capacity floor (default: the action's)")  # fmt: skip
    p.add_argument("--not-after", type=not_after, default=None, metavar="TIME",
                   help="no batch of any action starts at or after TIME (ISO 8601 or 90m, 2h)")  # fmt: skip
    p.add_argument("--prometheus", type=Path, metavar="FILE", default=None,
                   help="also write the pass's state as Prometheus gauges (node_exporter's textfile directory): "
                   "hosts waiting for a human, storm brakes, budgets spent, failed rungs, paused")  # fmt: skip
    p.add_argument("--lift-brake", metavar="RULE", default=None,
                   help="deprecated: `fleetops brake lift RULE` (kept for one release; no pass runs)")  # fmt: skip
    add_reason_arg(
        p,
        "why this pass runs (an alert, a ticket): kept in the pass's JSON (as cause) and written with its "
        "decisions and rollouts as one line of the audit log (the event-driven rulebook passes the alert that "
        "started the pass; --cause is the same option)",
        "--cause",  # the event-driven path's name (playbooks/remediate_auto.yml, the rulebooks' alert)
    )
    p.add_argument(
        "--fail-on",
        choices=AUTO_FAIL_ON,
        default=AUTO_FAIL_ON_DEFAULT,
        help="never: hosts that wait for a person (a ladder at `human` or run out, a storm brake) leave the "
        "exit code 0, a scheduled job stays green and fails only when the pass fails (the JSON, the audit "
        "log and the FleetopsAutoHumanNeeded alert name them); human: they make it exit 1 "
        f"(default: {AUTO_FAIL_ON_DEFAULT})",
    )
    add_quiet_arg(p, "no progress on stderr (the pass's lines, each action's batches and hosts): only "
                  "warnings, errors and failed hosts; the decisions still go to stdout", inherited=True)  # fmt: skip
    add_kubectl_args(p)  # for the actions that act on Kubernetes nodes (quarantine, unquarantine)
    add_format_arg(p)
    p.set_defaults(func=cmd_auto, resume=None)


def auto_request(args: argparse.Namespace) -> api.AutoRequest:
    from fleetops import api
    from fleetops.remediations import REMEDIATIONS

    kube = {k: v for k, v in (("kubectl", args.kubectl), ("kubeconfig", args.kubeconfig)) if v}
    return api.AutoRequest(
        policy=args.policy,
        **targets_and_caps(args),
        apply=bool(args.apply),
        sample_seconds=args.sample_seconds,
        state_dir=args.state_dir,
        host_timeout=args.host_timeout,
        max_unhealthy=args.max_unhealthy,
        not_after=args.not_after,
        ec2_tags=not args.no_ec2_tags,
        prometheus=args.prometheus,
        action_params={r.name: kube for r in REMEDIATIONS.values() if r.kubernetes} if kube else {},
        cause=args.reason,
        from_report=args.from_report,
        fail_on=args.fail_on,
    )


def cmd_auto(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from fleetops import api
    from fleetops.cli.brake import lift
    from fleetops.cli.observer import ConsoleObserver, QuietObserver

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if args.lift_brake is not None:
        console.print(f"fleetops: warning: {LIFT_BRAKE_DEPRECATED}", markup=False)
        return lift(args.lift_brake, args.inventory, args.state_dir, args.reason or "", console)
    result = api.auto(auto_request(args), (QuietObserver if args.quiet else ConsoleObserver)(console))
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
    else:
        out = Console(highlight=False, soft_wrap=True)
        ran = {(h, r.action): r for r in result.result.runs for h in r.hosts}
        counts: dict[str, int] = {}
        for d in result.result.decisions:
            counts[d.status] = counts.get(d.status, 0) + 1
            run = ran.get((d.host, d.action or ""))
            what_if = (
                f" -> what-if: would {d.action}" if result.result.what_if is not None and d.action else ""
            )
            out.print(escape(d.line() + (_outcome(run, d.host, result.result.apply) if run else what_if)))
        told = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        out.print(
            f"auto: {len(result.result.decisions)} host(s): {told or 'none'}"
            + (
                f" (what-if against {result.result.what_if}: nothing run, nothing recorded)"
                if result.result.what_if is not None
                else ""
                if result.result.apply
                else " (dry run: nothing recorded; add --apply to act)"
            )
        )
    return result.exit_code


def _outcome(run: Any, host: str, apply: bool) -> str:
    """What the action did on ``host``: done / not done; a dry run changed nothing: what it would change."""
    if not apply:
        if host not in run.done:
            return f" -> dry run failed (exit {int(run.exit_code)})"
        results = [(b.get("results") or {}).get(host) for b in (run.document or {}).get("batches") or []]
        changed = any(r.get("changed") for r in results if r)
        return " -> would change" if changed else " -> would change nothing"
    return " -> done" if host in run.done else f" -> not done (exit {int(run.exit_code)})"
