"""`fleetops plan ACTION`: show the batches a rollout would run, without touching any host.

The JSON form is the contract ``fleetops.plan/v1``: ``{"schema", "action", "batches": [[host, ...],
...], "excluded", "caps", "lower_bound", "groups": {group: [host, ...]}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetops import paths
from fleetops.ansible.inventory import DEFAULT_GROUP_VARS, load_hosts
from fleetops.errors import UsageError
from fleetops.planner import MaxParallel, Plan, PlanError, plan

SCHEMA = "fleetops.plan/v1"


def _max_parallel(text: str) -> MaxParallel:
    try:
        return MaxParallel.parse(text)
    except PlanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


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
    p.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default: table)"
    )
    p.set_defaults(func=cmd_plan)


def add_target_args(p: argparse.ArgumentParser) -> None:
    """-i/--inventory and --limit: which hosts (shared by plan and remediate)."""
    p.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        metavar="INV",
        help="inventory file or directory (repeatable; default: the localhost inventory)",
    )
    p.add_argument("-l", "--limit", help="further limit the hosts (ansible --limit pattern)")


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
        action="extend",
        nargs="+",
        default=[],
        metavar="HOST",
        help="host names or shell patterns (lab-1*) to leave out; each must match a host",
    )


def plan_from_args(args: argparse.Namespace) -> tuple[Plan, str]:
    """Load the targeted hosts and plan them with the caps given on the command line."""
    inventories: list[Path] = list(args.inventory or [])
    if not inventories:
        default = paths.default_inventory()
        if default is None:
            raise UsageError("no inventory given and no fleetops checkout found: use -i INVENTORY")
        inventories = [default]
        args.inventory = inventories
    hosts = load_hosts(inventories, args.limit, args.group_by)
    if not hosts:
        raise UsageError("no hosts matched the inventory and limit")
    result = plan(
        hosts,
        max_parallel=args.max_parallel,
        per_group_max=args.per_group_max,
        canary=args.canary,
        exclude=args.exclude,
    )
    return result, args.group_by or "|".join(DEFAULT_GROUP_VARS)


def cmd_plan(args: argparse.Namespace) -> int:
    result, group_by = plan_from_args(args)
    if args.format == "json":
        sys.stdout.write(json.dumps(plan_document(args.action, result, group_by), indent=2) + "\n")
    else:
        render_plan(args.action, result, group_by, Console(highlight=False, soft_wrap=True))
    return 0


def plan_document(action: str, result: Plan, group_by: str) -> dict[str, Any]:
    """The ``fleetops.plan/v1`` document."""
    return {
        "schema": SCHEMA,
        "action": action,
        "batches": result.batches,
        "excluded": result.excluded,
        "caps": {
            "max_parallel": result.caps.max_parallel,
            "max_parallel_hosts": result.caps.max_parallel_hosts,
            "per_group_max": result.caps.per_group_max,
            "canary": result.caps.canary,
        },
        "lower_bound": result.lower_bound,
        "groups": result.groups,
        "group_by": group_by,
        "hosts": result.hosts,
        "notes": result.notes,
    }


def render_plan(action: str, result: Plan, group_by: str, console: Console) -> None:
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
