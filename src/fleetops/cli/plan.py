"""`fleetops plan ACTION`: show the batches a rollout would run, without touching any host.

The JSON form is the contract ``fleetops.plan/v1``: ``{"schema", "action", "batches": [[host, ...],
...], "excluded", "caps", "lower_bound", "groups": {group: [host, ...]}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from fleetops.ansible.inventory import DEFAULT_GROUP_VARS
from fleetops.cli.args import add_format_arg, add_target_args, argtype
from fleetops.planner import MaxParallel, Plan, PlanError
from fleetops.util import PLAN_SCHEMA

if TYPE_CHECKING:
    from rich.console import Console

    from fleetops import api


SCHEMA = PLAN_SCHEMA


_max_parallel = argtype(MaxParallel.parse, errors=(PlanError,))


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _hosts(text: str) -> list[str]:
    """``--exclude a,b``: the names, blanks refused (an empty part would exclude nothing, silently)."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"an empty host name in {text!r}")
    return names


def _group_cap(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (or 'none'): {text!r}")
    return value


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops plan`` to the CLI's subcommands.

    Generic over the parser class: ``build_parser``'s subparsers are ``_SubParsersAction[_Parser]``,
    which a plain ``_SubParsersAction[ArgumentParser]`` parameter would reject (the type is invariant).
    """
    p = subparsers.add_parser(
        "plan",
        help="plan the rollout batches for a remediation (changes nothing)",
        description="Plan rolling batches: at most --max-parallel hosts at once, at most "
        "--per-group-max per group (AZ) while groups proceed in parallel, a canary batch first, "
        "and the fewest batches those caps allow.",
    )
    p.add_argument("action", metavar="ACTION", help="the remediation to plan (e.g. reboot, disable-unit)")
    add_target_args(p)
    add_rollout_args(p)
    add_format_arg(p)
    p.set_defaults(func=cmd_plan)


def add_rollout_args(p: argparse.ArgumentParser) -> None:
    """The rollout's caps: --max-parallel, --per-group-max, --group-by, --canary, --exclude."""
    p.add_argument(
        "--max-parallel",
        type=_max_parallel,
        default=MaxParallel.parse("10%"),
        metavar="N|P%",
        help="hosts per batch: a count, or a percent of the targeted hosts, rounded down, at least 1 "
        "(default: 10%%)",
    )
    p.add_argument(
        "--per-group-max",
        type=_group_cap,
        default=1,
        metavar="N",
        help="hosts per group per batch, or 'none' (default: 1)",
    )
    p.add_argument(
        "--group-by",
        metavar="VAR",
        help=f"hostvar that groups hosts (default: {DEFAULT_GROUP_VARS[0]}, else {DEFAULT_GROUP_VARS[1]}; "
        "hosts without it form the group 'ungrouped')",
    )
    p.add_argument(
        "--canary",
        type=_count,
        default=1,
        metavar="N",
        help="hosts in the first batch, spread over groups; 0: no canary (default: 1)",
    )
    p.add_argument(
        "--exclude",
        action="extend",  # one value per use, split at commas: it never takes the ACTION after it
        type=_hosts,
        default=[],
        metavar="HOST[,HOST...]",
        help="host names or shell patterns (lab-1*) to leave out, comma-separated (repeatable); each must "
        "match a host",
    )


def targets_and_caps(args: argparse.Namespace) -> dict[str, Any]:
    """The targets and caps given on the command line, as the keywords of the one request built from
    them (``plan``, ``remediate ACTION`` and ``remediate auto`` share them: ``api.RolloutCaps``)."""
    return {
        "inventory": list(args.inventory or []),
        "limit": args.limit,
        "group_by": args.group_by,
        "max_parallel": args.max_parallel,
        "per_group_max": args.per_group_max,
        "canary": args.canary,
        "exclude": list(args.exclude),
    }


def plan_request(args: argparse.Namespace, action: str) -> api.PlanRequest:
    """The library request for ``fleetops plan``."""
    from fleetops import api

    return api.PlanRequest(action=action, **targets_and_caps(args))


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api

    result = api.plan(plan_request(args, args.action))
    if args.format == "json":
        sys.stdout.write(json.dumps(result.document, indent=2) + "\n")
    else:
        render_plan(args.action, result.plan, result.group_by, Console(highlight=False, soft_wrap=True))
    return 0


def render_plan(action: str, result: Plan, group_by: str, console: Console) -> None:
    from rich.table import Table

    caps = result.caps
    per_group = "no cap" if caps.per_group_max is None else str(caps.per_group_max)
    console.print(
        f"[bold]Plan for {action}[/]: {result.hosts} host(s) in {len(result.batches)} batch(es) "
        f"(fewest possible: {result.lower_bound})"
    )
    console.print(
        f"caps: max parallel {caps.max_parallel} = {caps.max_parallel_hosts} host(s), "
        f"per group {per_group}, canary {caps.canary}; groups by {group_by}: "
        + ", ".join(f"{g} ({len(h)})" for g, h in result.groups.items())
    )
    for note in result.notes:
        console.print(f"[yellow]note: {note}[/]")
    if result.excluded:
        console.print(f"excluded ({len(result.excluded)}): {', '.join(result.excluded)}")
    if not result.batches:
        console.print("nothing to do: every targeted host is excluded")
        return
    group_of = {h: g for g, hosts in result.groups.items() for h in hosts}
    table = Table(show_lines=False)
    table.add_column("batch", justify="right")
    table.add_column("size", justify="right")
    table.add_column("per group")
    table.add_column("hosts")
    for i, batch in enumerate(result.batches, start=1):
        counts: dict[str, int] = {}
        for host in batch:
            counts[group_of[host]] = counts.get(group_of[host], 0) + 1
        label = f"{i} (canary)" if i == 1 and result.has_canary else str(i)
        table.add_row(
            label, str(len(batch)), " ".join(f"{g}:{n}" for g, n in counts.items()), " ".join(batch)
        )
    console.print(table)
