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
from fleetops.cli.args import SUMMARY_ABOVE, add_all_arg, add_format_arg, add_target_args, argtype
from fleetops.cli.helptext import epilog
from fleetops.planner import MaxParallel, Plan, PlanError, limiting_cap
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
        epilog=epilog("plan"),
    )
    p.add_argument("action", metavar="ACTION", help="the remediation to plan (e.g. reboot, disable-unit)")
    add_target_args(p)
    add_rollout_args(p)
    add_format_arg(p)
    add_all_arg(p, "the first and last batches, the rest counted")
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
        console = Console(highlight=False, soft_wrap=True)
        render_plan(args.action, result.plan, result.group_by, console, show_all=args.all_rows)
    return 0


def estimate_text(action: str, batches: int) -> str:
    """The rollout's longest duration at the action's defaults: every batch may take its host timeout,
    with the cooldown between batches; each batch's gate scan comes on top (``""``: not a remediation)."""
    from fleetops.cli.progress import duration_text
    from fleetops.remediations import REMEDIATIONS

    remediation = REMEDIATIONS.get(action)
    if remediation is None or not batches:
        return ""
    worst = batches * remediation.host_timeout + (batches - 1) * remediation.cooldown
    return (
        f"duration: at most about {duration_text(worst)} at the action's defaults ({batches:,} batch(es) x "
        f"--host-timeout {remediation.host_timeout} s + {max(0, batches - 1):,} x --cooldown "
        f"{remediation.cooldown:g} s), plus each batch's gate scan"
    )


# a batch's hosts cell without --all: its first few names (a 150-host batch was 75 wrapped lines of names)
HOSTS_NAMED = 6


def render_plan(
    action: str, result: Plan, group_by: str, console: Console, *, show_all: bool = False
) -> None:
    """The summary first (hosts, batches, the cap that sets their number, the longest duration, the
    groups); then a row a batch, up to SUMMARY_ABOVE batches (or with ``show_all``), else the first and
    last few with the rest counted."""
    from rich.markup import escape
    from rich.table import Table

    if not console.is_terminal:  # piped or captured: no width to honour, as the scan's table
        console.width = max(console.width, 160)
    caps = result.caps
    per_group = "no cap" if caps.per_group_max is None else str(caps.per_group_max)
    console.print(
        f"[bold]Plan for {escape(action)}[/]: {result.hosts:,} host(s) in {len(result.batches):,} batch(es) "
        f"(fewest possible: {result.lower_bound:,})"
    )
    for line in (limiting_cap(result), estimate_text(action, len(result.batches))):
        if line:
            console.print(line)
    groups = list(result.groups.items())
    shown_groups = groups if show_all or len(groups) <= SUMMARY_ABOVE else groups[:SUMMARY_ABOVE]
    console.print(
        f"caps: max parallel {caps.max_parallel} = {caps.max_parallel_hosts:,} host(s), "
        f"per group {per_group}, canary {caps.canary}; {len(groups):,} group(s) by {escape(group_by)}: "
        + ", ".join(f"{escape(g)} ({len(h):,})" for g, h in shown_groups)
        + (f", ... {len(groups) - len(shown_groups):,} more" if len(shown_groups) < len(groups) else "")
    )
    for note in result.notes:
        console.print(f"[yellow]note: {escape(note)}[/]")
    if result.excluded:
        console.print(f"excluded ({len(result.excluded)}): {escape(', '.join(result.excluded))}")
    if not result.batches:
        console.print("nothing to do: every targeted host is excluded")
        return
    group_of = {h: g for g, hosts in result.groups.items() for h in hosts}
    table = Table(show_lines=False)
    table.add_column("batch", justify="right")
    table.add_column("size", justify="right")
    table.add_column("per group")
    table.add_column("hosts")
    numbered = list(enumerate(result.batches, start=1))
    head = tail = len(numbered)
    if not show_all and len(numbered) > SUMMARY_ABOVE:
        head, tail = SUMMARY_ABOVE // 2, SUMMARY_ABOVE // 5
    named = None if show_all else HOSTS_NAMED
    for i, batch in numbered[:head]:
        _batch_row(table, i, batch, group_of, canary=i == 1 and result.has_canary, named=named)
    if head < len(numbered):
        skipped = numbered[head : len(numbered) - tail]
        hosts = sum(len(b) for _, b in skipped)
        table.add_row(
            f"{skipped[0][0]}-{skipped[-1][0]}", f"{hosts:,}", "", f"[dim]{len(skipped):,} more batches[/]"
        )
        for i, batch in numbered[len(numbered) - tail :]:
            _batch_row(table, i, batch, group_of, canary=False, named=named)
    console.print(table)
    if head < len(numbered):
        console.print(
            f"[dim]summarised: {len(numbered):,} batches (more than {SUMMARY_ABOVE}); --all lists every batch, "
            "--format json gives them all[/]"
        )
    elif named is not None and any(len(b) > named for b in result.batches):
        console.print(f"[dim]each batch names its first {named} hosts; --all names every host[/]")


def _batch_row(
    table: Any, i: int, batch: list[str], group_of: dict[str, str], *, canary: bool, named: int | None
) -> None:
    """One batch's row; its hosts cell names the first ``named`` of them (None: all) and counts the rest."""
    from rich.markup import escape

    counts: dict[str, int] = {}
    for host in batch:
        counts[group_of[host]] = counts.get(group_of[host], 0) + 1
    table.add_row(
        f"{i} (canary)" if canary else str(i),
        str(len(batch)),
        escape(" ".join(f"{g}:{n}" for g, n in counts.items())),
        escape(" ".join(batch[:named]))
        + (
            f" [dim]... and {len(batch) - named:,} more[/]"
            if named is not None and len(batch) > named
            else ""
        ),
    )
