"""`fleetops report ROLLOUT`: what a rollout did (batches, hosts, failures, what is left); `fleetops
rollouts`: the rollouts this controller keeps (``fleetops.api.rollouts``)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from fleetops.cli.args import SUMMARY_ABOVE, add_all_arg, add_format_arg
from fleetops.cli.helptext import epilog
from fleetops.util import ROLLOUT_CUT_OFF

if TYPE_CHECKING:
    from rich.console import Console

    from fleetops.rollout.state import Rollout

# A summarised report names this many hosts that keep the exit code non-zero (the rest are counted).
NAMED_HOSTS = 20


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops report ROLLOUT`` and ``fleetops rollouts`` to the CLI's subcommands."""
    p = subparsers.add_parser(
        "report",
        help="summarise a rollout: its id (fleetops rollouts lists them) or its state file",
        description="What a rollout did: its batches, hosts, failures and what is left. Exit 0 only when "
        "it is done with every host verified, else 3.",
        epilog=epilog("report"),
    )
    p.add_argument(
        "state",
        metavar="ROLLOUT",
        help="a rollout id (20261129T170102Z-3fa9c1) or the path of its state file",
    )
    add_format_arg(p)
    add_all_arg(
        p,
        "a batch's hosts counted per state, only the batches where a host is not done listed, the first "
        f"{NAMED_HOSTS} hosts that keep the exit code non-zero named",
    )
    p.set_defaults(func=cmd_report)

    r = subparsers.add_parser(
        "rollouts",
        help="list the rollouts this controller keeps (id, action, status, hosts done/failed/pending)",
        description="The rollouts kept in this controller's state directory, newest first: a running one "
        f"whose process is gone shows as {ROLLOUT_CUT_OFF!r} (resume it with 'fleetops remediate --resume'). "
        "A dry run keeps no rollout.",
        epilog=epilog("rollouts"),
    )
    add_format_arg(r)
    r.set_defaults(func=cmd_rollouts)


def cmd_rollouts(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fleetops.api.rollouts import list_rollouts, rollouts_dir, rollouts_document

    rows = list_rollouts()
    if args.format == "json":
        sys.stdout.write(json.dumps(rollouts_document(rows), indent=2) + "\n")
        return 0
    console = Console(highlight=False, soft_wrap=True)
    if not rows:
        console.print(f"no rollouts kept in {escape(str(rollouts_dir()))}")
        return 0
    table = Table()
    for column in (
        "rollout",
        "action",
        "status",
        "started",
        "operator",
        "hosts",
        "done",
        "failed",
        "pending",
    ):
        table.add_column(
            column, justify="right" if column in ("hosts", "done", "failed", "pending") else "left"
        )
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(row.started)) if row.started else ""
        status = row.status + ("" if row.apply or row.status == "unreadable" else " (dry run)")
        table.add_row(
            row.id, escape(row.action), escape(status + (f": {row.error}" if row.error else "")), started,
            escape(row.operator), *(f"{n:,}" for n in (row.hosts, row.done, row.failed, row.pending)),
        )  # fmt: skip
    console.print(table)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api
    from fleetops.api.rollouts import resolve_rollout
    from fleetops.cli.args import check_all_arg

    check_all_arg(args)
    result = api.report(resolve_rollout(args.state))
    rollout = result.rollout
    assert rollout is not None  # a report always has its rollout
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
        return 0
    render_rollout(rollout, Console(highlight=False), show_all=args.all_rows)
    return result.exit_code


def render_rollout(rollout: Rollout, console: Console, show_all: bool = False) -> None:
    """The rollout for people: its batches, the hosts that keep the exit code non-zero and why, the
    summary. Past SUMMARY_ABOVE hosts (unless ``show_all``) a batch's hosts are counted per state, the
    batches where every host is done are counted, not listed, and NAMED_HOSTS hosts are named."""
    from collections import Counter

    from rich.markup import escape
    from rich.table import Table

    from fleetops.cli.remediate import print_summary
    from fleetops.rollout.state import HOST_DONE, HOST_FAILED, HOST_RUNNING, HOST_SKIPPED

    whole = show_all or len(rollout.hosts) <= SUMMARY_ABOVE
    console.print(f"[bold]rollout {rollout.id}[/]: {rollout.action}, {'apply' if rollout.apply else 'dry run'}, "
                  f"by {rollout.operator}, status {rollout.status}")  # fmt: skip
    table = Table()
    for col in ("batch", "hosts", "started", "took", "results"):
        table.add_column(col)
    clean = 0
    for b in rollout.batches:
        states = [rollout.hosts.get(h) for h in b["hosts"]]
        if not whole and b.get("finished") and all(st == HOST_DONE for st in states):
            clean += 1
            continue
        took = f"{b['finished'] - b['started']:.1f}s" if b.get("finished") else "(cut short)"
        if whole:
            results = ", ".join(f"{h}:{rollout.hosts.get(h)}" for h in b["hosts"])
        else:
            results = ", ".join(f"{st} {n:,}" for st, n in sorted(Counter(map(str, states)).items()))
        started = time.strftime("%H:%M:%S", time.localtime(b["started"]))
        table.add_row(str(b.get("index", "")), str(len(b["hosts"])), started, took, escape(results))
    if table.row_count:
        console.print(table)
    if clean:
        console.print(f"{clean:,} of {len(rollout.batches):,} batches: every host done (--all lists them)")
    # every host that keeps the exit code non-zero, and why (failed, timed out, skipped, in doubt)
    named = 0
    for host, state in rollout.hosts.items():
        if state not in (HOST_FAILED, HOST_SKIPPED, HOST_RUNNING):
            continue
        named += 1
        if not whole and named > NAMED_HOSTS:
            continue
        outcome = rollout.results.get(host)
        why = (outcome.gate or outcome.msg) if outcome is not None else None
        if state == HOST_RUNNING:
            console.print(
                f"  [red]{escape(host)}[/]: in doubt (caught mid-batch; --resume probes it before acting)"
            )
        else:
            console.print(f"  [red]{escape(host)}[/]: {state}: {escape(why or 'no reason recorded')}")
    if named > NAMED_HOSTS and not whole:
        console.print(
            f"  ... and {named - NAMED_HOSTS:,} more host(s) failed, skipped or in doubt (--all lists them)"
        )
    if rollout.stopped:
        console.print(
            f"[bold red]stopped[/] after batch {rollout.stopped['after_batch']}: {escape(str(rollout.stopped['reason']))}"
        )
        pending = list(rollout.stopped["pending"])
        shown = pending if whole else pending[:SUMMARY_ABOVE]
        more = f" ... and {len(pending) - len(shown):,} more" if len(shown) < len(pending) else ""
        console.print(f"pending ({len(pending):,}): {escape(' '.join(shown))}{more}")
    print_summary(rollout, console)
