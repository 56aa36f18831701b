"""`fleetops drift`: one scan (or a saved scan report), the facts that differ between hosts that
should be identical, grouped by AZ, AMI, kernel and instance type. See ``fleetops.drift``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fleetops.cli.args import add_format_arg, add_target_args, int_range
from fleetops.cli.helptext import epilog
from fleetops.drift import DIMENSIONS
from fleetops.util import DAY_S


def _group_by(text: str) -> list[str]:
    dims = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in dims if d not in DIMENSIONS]
    if bad or not dims:
        raise argparse.ArgumentTypeError(f"choose from {','.join(DIMENSIONS)}: {text!r}")
    return list(dict.fromkeys(dims))


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops drift`` to the CLI's subcommands."""
    p = subparsers.add_parser(
        "drift",
        help="compare hosts that should be identical (by AZ, AMI, kernel, instance type)",
        description="From one scan, the facts that differ between hosts that should be identical: "
        "enabled units, Environment= of key services, kernel, OS, UCX version, zombie memcg level "
        "(by order of magnitude). For each fact: the majority value and the hosts that differ, "
        "fleet-wide and within each group; and the facts whose majority differs between groups.",
        epilog=epilog("drift"),
    )
    add_target_args(
        p,
        inventory_help="inventory (repeatable; default: the localhost inventory). With --from: only for the "
        "AZ / AMI / instance type hostvars (ec2_az, ec2_image_id, ec2_instance_type; fleetops_az ...)",
    )
    p.add_argument(
        "--group-by",
        type=_group_by,
        default=list(DIMENSIONS),
        metavar="DIMS",
        help=f"comma-separated dimensions (default: {','.join(DIMENSIONS)})",
    )
    p.add_argument(
        "--from",
        dest="from_report",
        type=Path,
        metavar="SCAN",
        help="read a saved fleetops.scan/v1 report (fleetops scan -o FILE) instead of scanning",
    )
    add_format_arg(p)
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="also write the JSON drift report to FILE"
    )
    p.add_argument(
        "--host-timeout",
        type=int_range(0, DAY_S),
        default=120,
        metavar="S",
        help=f"per-host timeout of the scan (0..{DAY_S}; 0: no limit; default: 120)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_drift)


def cmd_drift(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api
    from fleetops.cli.render import host_line, render_drift

    err = Console(stderr=True, highlight=False)

    def on_host(host: str, entry: dict[str, Any]) -> None:
        if not args.quiet:
            err.print(host_line(host, entry))

    request = api.DriftRequest(
        inventory=list(args.inventory or []),
        limit=args.limit,
        group_by=args.group_by,
        from_report=args.from_report,
        output=args.output,
        host_timeout=args.host_timeout,
    )
    result = api.drift(request, on_host=on_host)
    if args.format == "json":
        sys.stdout.write(result.json() + "\n")
    else:
        render_drift(result.document, Console(highlight=False, soft_wrap=True))
    return result.exit_code
