"""``fleetops policy check FILE...``: refuse a policy that cannot work (``fleetops.policy.lint``).

``python -m fleetops.policy --check FILE...`` is the same check (an alias).
"""

from __future__ import annotations

import argparse

from fleetops.cli.helptext import epilog


def register[P: argparse.ArgumentParser](subparsers: argparse._SubParsersAction[P]) -> None:
    """Add ``fleetops policy`` (its verb: ``check``) to the CLI's subcommands."""
    group = subparsers.add_parser(
        "policy",
        help="check a remediation policy (fleetops.policy/v1) before a pass uses it",
        description="Remediation policies (the rules and ladders of 'remediate auto').",
        epilog=epilog("policy"),
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    check = verbs.add_parser(
        "check",
        help="validate policy files and refuse rules that can never match",
        description="Validate each FILE as a fleetops.policy/v1 policy, then refuse what loads but can never "
        "match: a data key no finding of the rule's check holds (the keys the detectors declare), and a match "
        "entry an earlier rule always takes first (same check, no narrower match). One line per problem, "
        "naming the file, the field and the rule; nothing is scanned or run.",
        epilog=epilog("policy check"),
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="a policy file (YAML or JSON)")
    check.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from fleetops.policy.schema import check_files

    return check_files([str(f) for f in args.files])
