"""`fleetops report STATE`: what a rollout did (batches, hosts, failures, what is left)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fleetops.cli.args import add_format_arg


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops report STATE`` to the CLI's subcommands."""
    p = subparsers.add_parser("report", help="summarise a rollout from its state file")
    p.add_argument("state", type=Path, metavar="STATE")
    add_format_arg(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fleetops import api
    from fleetops.cli.remediate import print_summary
    from fleetops.rollout.state import HOST_FAILED, HOST_RUNNING, HOST_SKIPPED

    result = api.report(args.state)
    rollout = result.rollout
    assert rollout is not None  # a report always has its rollout
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
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
    # every host that keeps the exit code non-zero, and why (failed, timed out, skipped, in doubt)
    for host, state in rollout.hosts.items():
        outcome = rollout.results.get(host)
        why = (outcome.gate or outcome.msg) if outcome is not None else None
        if state in (HOST_FAILED, HOST_SKIPPED):
            console.print(f"  [red]{host}[/]: {state}: {escape(why or 'no reason recorded')}")
        elif state == HOST_RUNNING:
            console.print(f"  [red]{host}[/]: in doubt (caught mid-batch; --resume probes it before acting)")
    if rollout.stopped:
        console.print(
            f"[bold red]stopped[/] after batch {rollout.stopped['after_batch']}: {escape(str(rollout.stopped['reason']))}"
        )
        console.print(f"pending ({len(rollout.stopped['pending'])}): {' '.join(rollout.stopped['pending'])}")
    print_summary(rollout, console)
    return result.exit_code
