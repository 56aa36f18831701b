"""``fleetops brake lift RULE``: lift a storm brake of the ``remediate auto`` passes (``fleetops.api.lift_brake``).

A storm brake holds a rule's disruptive rungs fleet-wide once too many hosts had its finding at once
(``fleetops.auto.guards``); a person finds the common cause, then lifts it here. ``remediate auto
--lift-brake RULE`` did the same before; it is kept, deprecated, for one release.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetops.cli.args import add_reason_arg, add_state_dir_arg
from fleetops.cli.helptext import epilog

if TYPE_CHECKING:
    from rich.console import Console


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops brake`` (its verb: ``lift``) to the CLI's subcommands."""
    group = subparsers.add_parser(
        "brake",
        help="lift a storm brake of the remediate auto passes (audited)",
        description="The storm brakes of 'remediate auto': a rule whose finding too many hosts had at once "
        "has its disruptive rungs held fleet-wide (the FleetopsAutoStormBrake alert) until a person lifts it.",
        epilog=epilog("brake"),
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    lift_p = verbs.add_parser(
        "lift",
        help="lift the storm brake on RULE (audited; no pass runs)",
        description="Lift the storm brake on RULE: in the shared store when the inventory names one, and in "
        "this controller's state directory; written to the audit log with who and why. The next pass may "
        "climb the rule's ladders again.",
        epilog=epilog("brake lift"),
    )
    lift_p.add_argument("rule", metavar="RULE", help="the policy rule whose brake to lift")
    lift_p.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        default=[],
        metavar="INVENTORY",
        help="an inventory whose fleetops.node.ec2 source names the shared store (store_table): lift the "
        "brake there too (default: this controller's state directory only)",
    )
    add_state_dir_arg(lift_p, "the auto passes' state directory, as remediate auto's")
    add_reason_arg(lift_p, "why it is lifted (kept in the audit log)")
    lift_p.set_defaults(func=cmd_lift)


def lift(
    rule: str, inventory: Sequence[Path] | None, state_dir: Path | None, reason: str, console: Console
) -> int:
    """Lift the brake on ``rule``; its lines on ``console``; the exit code."""
    from fleetops import api

    lifted = api.lift_brake(
        api.LiftBrakeRequest(rule=rule, inventory=list(inventory or ()), state_dir=state_dir, reason=reason)
    )
    for line in lifted.lines:
        console.print(line, markup=False)
    return int(lifted.exit_code)


def cmd_lift(args: argparse.Namespace) -> int:
    from rich.console import Console

    return lift(
        args.rule,
        args.inventory,
        args.state_dir,
        args.reason or "",
        Console(stderr=True, highlight=False, soft_wrap=True),
    )
