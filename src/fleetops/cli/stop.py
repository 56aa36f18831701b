"""`fleetops stop [ROLLOUT | --all] [--reason TEXT]`: the kill switch (``fleetops.rollout.killswitch``).

A running rollout asks before every batch whether it was asked to stop; if so it stops after its
current batch (state saved, exit 3, ``--resume`` continues it) and says who stopped it and why.
On this controller a stop file does it; with ``-i EC2_INVENTORY`` the leased instances are tagged
``fleetops:stop`` too, which rollouts on any controller read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetops.cli.args import add_reason_arg, rollout_id
from fleetops.cli.helptext import epilog
from fleetops.errors import UsageError


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops stop`` to the CLI's subcommands."""
    p = subparsers.add_parser(
        "stop",
        help="ask a running rollout (or every one) to stop after its current batch",
        description="The kill switch: the rollout stops after its current batch (state saved, exit 3, "
        "--resume continues it) and reports who stopped it and why. Only rollouts running when the stop "
        "is requested are affected.",
        epilog=epilog("stop"),
    )
    p.add_argument("rollout", nargs="?", type=rollout_id, metavar="ROLLOUT", help="the rollout id to stop")
    p.add_argument("--all", action="store_true", help="stop every rollout running now")
    add_reason_arg(p, "why (shown by the stopped rollout)")
    p.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        default=[],
        metavar="INVENTORY",
        help="an inventory with a fleetops.node.ec2 source: also tag the leased instances fleetops:stop, "
        "so a rollout running on another controller stops too",
    )
    p.add_argument("--clear", action="store_true", help="remove this controller's stop request instead")
    p.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api

    if (args.rollout is None) == (not args.all):
        raise UsageError("stop needs a ROLLOUT id or --all (not both)")
    result = api.stop(
        api.StopRolloutRequest(
            rollout=args.rollout, reason=args.reason or "", inventory=args.inventory, clear=args.clear
        )
    )
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for line in result.lines:
        console.print(line)
    return int(result.exit_code)
