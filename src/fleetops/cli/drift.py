"""`fleetops drift`: one scan (or a saved scan report), the facts that differ between hosts that
should be identical, grouped by AZ, AMI, kernel and instance type. See ``fleetops.drift``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from fleetops import paths
from fleetops.drift import DIMENSIONS, DRIFT_CHECKS, build_drift, exit_code, render_drift
from fleetops.errors import UsageError

EPILOG = (
    "Exit codes: 0 no drift, 1 drift found (a host differs from the majority, or groups differ), "
    "2 usage error, 3 a host unreachable or failed (not compared)."
)


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
        epilog=EPILOG,
    )
    p.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        metavar="INV",
        help="inventory (repeatable; default: the localhost inventory). With --from: only for the "
        "AZ / AMI / instance type hostvars (ec2_az, ec2_image_id, ec2_instance_type; fleetops_az ...)",
    )
    p.add_argument("-l", "--limit", help="further limit the hosts (ansible --limit pattern)")
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
        metavar="REPORT",
        help="read a saved fleetops.scan/v1 report (fleetops scan -o FILE) instead of scanning",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="default: table")
    p.add_argument("-o", "--output", type=Path, help="also write the JSON drift report to this file")
    p.add_argument(
        "--host-timeout",
        type=int,
        default=120,
        metavar="S",
        help="per-host timeout of the scan (default: 120)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_drift)


def _read_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a scan report")
    return data


def cmd_drift(args: argparse.Namespace) -> int:
    from fleetops.ansible.inventory import load_hosts

    inventories: list[Path] = list(args.inventory or [])
    if not inventories and args.from_report is None:
        default = paths.default_inventory()
        if default is None:
            raise UsageError("no inventory given and no fleetops checkout found: use -i INVENTORY")
        inventories = [default]
    if args.output is not None and not args.output.parent.is_dir():
        raise UsageError(f"cannot write {args.output}: no such directory {args.output.parent}")
    hostvars = {h.name: h.hostvars for h in load_hosts(inventories, args.limit)} if inventories else {}
    if args.from_report is not None:
        report = _read_report(args.from_report)
        if args.limit and hostvars:
            report = {
                **report,
                "hosts": {h: e for h, e in (report.get("hosts") or {}).items() if h in hostvars},
            }
    else:
        from fleetops.cli.render import host_line
        from fleetops.scan import ScanOptions, run_scan

        err = Console(stderr=True, highlight=False)

        def on_host(host: str, entry: dict[str, Any]) -> None:
            if not args.quiet:
                err.print(host_line(host, entry))

        opts = ScanOptions(
            inventory=inventories, limit=args.limit, checks=list(DRIFT_CHECKS), host_timeout=args.host_timeout
        )
        report = run_scan(opts, on_host=on_host)
    if not report.get("hosts"):
        raise UsageError("no hosts matched the inventory and limit")
    drift = build_drift(report, hostvars, args.group_by)
    text = json.dumps(drift, indent=2)
    if args.output is not None:
        from fleetops.scan import write_report

        write_report(args.output, text + "\n")
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        render_drift(drift, Console(highlight=False, soft_wrap=True))
    return exit_code(drift)
