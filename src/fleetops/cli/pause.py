"""`fleetops pause`, `fleetops unpause` and `fleetops store {init,status}`: the shared store
(``fleetops.store``), configured by the inventory's fleetops.node.ec2 source (``store_table``).

``pause`` holds every controller: each running rollout stops after its current batch (as with
``fleetops stop``), and no ``remediate auto`` pass acts (exit 5) until ``unpause``. Both are audited in
the store with who and why. Without a store (the inventory names no ``store_table``) they pause this
controller alone, in its state directory (``fleetops.rollout.pause``), audited in its audit log.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetops.cli.args import add_reason_arg
from fleetops.cli.helptext import epilog


def _inventory(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-i",
        "--inventory",
        action="append",
        type=Path,
        default=[],
        metavar="INVENTORY",
        help="an inventory whose fleetops.node.ec2 source names the store (store_table); "
        "default: the configured inventory",
    )


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops pause``, ``unpause`` and ``store`` to the CLI's subcommands."""
    pause = subparsers.add_parser(
        "pause",
        help="hold all automation until 'fleetops unpause' (every controller with a shared store, this one without)",
        description="Pause automation: every running rollout stops after its current batch, and no "
        "'remediate auto' pass acts (exit 5) until 'fleetops unpause'. With a shared store (the inventory's "
        "store_table) it holds every controller; without one, this controller alone (a pause file in its "
        "state directory). Audited (who, why). A dry run is not held.",
        epilog=epilog("pause"),
    )
    _inventory(pause)
    add_reason_arg(pause, "why (shown by every held pass)")
    pause.set_defaults(func=cmd_store, verb="pause")
    unpause = subparsers.add_parser(
        "unpause",
        help="lift 'fleetops pause'",
        description="Lift the pause (the shared store's, and this controller's own): the next rollouts and "
        "auto passes act again. Audited (who, why).",
        epilog=epilog("unpause"),
    )
    _inventory(unpause)
    add_reason_arg(unpause, "why (kept in the store's audit)")
    unpause.set_defaults(func=cmd_store, verb="unpause")
    store = subparsers.add_parser(
        "store",
        help="the shared store: create its table, show whether automation is paused, close a journal record",
        description="'init' creates the store's DynamoDB table (the first auto pass does it too); "
        "'status' says whether automation is paused (exit 5 when it is: in the store or on this controller), "
        "the rollouts' leases held in the "
        "store and the journal's unfinished records (a disruptive step a dead pass left), and sweeps the "
        "lease items of rollouts expired over a day ago; 'forget ENTRY --reason TEXT' closes an unfinished "
        "record a person has handled (audited; exit 2 for an entry no unfinished record has).",
        epilog=epilog("store"),
    )
    store.add_argument("verb", choices=["init", "status", "forget"])
    store.add_argument("entry", nargs="?", default="", metavar="ENTRY", help="forget: the record's entry id")
    add_reason_arg(store, "forget: why it is closed (audited)")
    _inventory(store)
    store.set_defaults(func=cmd_store)


def cmd_store(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fleetops import api

    request = api.StoreRequest(
        inventory=args.inventory, verb=args.verb, reason=args.reason or "", entry=getattr(args, "entry", "")
    )
    result = api.store(request)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for line in result.lines:
        console.print(line, markup=False)
    return int(result.exit_code)
