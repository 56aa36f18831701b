"""`fleetops merge A.json B.json ...`: shard reports (``scan --shard I/N``) joined into one scan's report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetops.cli.args import add_all_arg, add_format_arg
from fleetops.cli.helptext import epilog


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops merge REPORT...`` to the CLI's subcommands."""
    p = subparsers.add_parser(
        "merge",
        help="join shard scan reports (scan --shard I/N) into one report",
        description="Join the reports of `fleetops scan --shard I/N -o FILE`, one per shard, into the report "
        "one scan of all their hosts would have written, exit code included. A shard killed before it "
        "wrote its report: give its FILE.partial (its hosts without an answer are not_scanned). Refused "
        "(exit 2): different schema versions, options or shard counts, shards of different selections "
        "(inventory, --limit, the hosts selected), a missing or repeated shard, a host in two reports.",
        epilog=epilog("merge"),
    )
    p.add_argument(
        "reports", type=Path, nargs="+", metavar="REPORT", help="a shard's report, or its .partial"
    )
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="also write the merged JSON report to FILE"
    )
    add_format_arg(p)
    add_all_arg(p, "counts per check and severity, the worst hosts")
    p.add_argument("-q", "--quiet", action="store_true", help="no notes on stderr")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from fleetops import api
    from fleetops.cli.args import check_all_arg
    from fleetops.cli.render import render_scan

    check_all_arg(args)
    result = api.merge(api.MergeRequest(reports=list(args.reports), output=args.output))
    if not args.quiet:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        for note in result.notes:
            err.print(f"[yellow]note:[/] {escape(note)}")
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
    else:
        render_scan(result.report, Console(highlight=False, soft_wrap=True), show_all=args.all_rows)
    return result.exit_code
