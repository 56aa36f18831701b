"""Arguments every command shares: the parser class, -i/-l, --format and value types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fleetops import values
from fleetops.ansible.collection import CollectionNotFound
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.util import DAY_S

INVENTORY_HELP = "inventory file or directory (repeatable; default: the localhost inventory)"
# A table of more hosts than this is summarised (fleetops.cli.render): 50 keeps a lab's whole fleet, or a
# rack, one row a host; past it a row a host scrolls the counts out of sight. ``--all``: every row.
SUMMARY_ABOVE = 50
# A plain (not a terminal) large scan's progress line comes this often (fleetops.cli.progress): a log line
# every 10 s is 720 lines for a 2-hour scan, and says within 10 s that the scan still moves.
PLAIN_EVERY_S = 10


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2 (no usage dump), and keeps the exit codes
    and examples of an epilog as lines (``fleetops.cli.helptext``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from fleetops.cli.helptext import HelpFormatter

        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """``--version``: computed when asked (where the collection is found), not each time a parser is built."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from fleetops.ansible.install import version_text

        print(version_text())
        parser.exit(0)


def collection_default[T](read: Callable[[], T]) -> T | None:
    """A default the fleetops.node collection defines (``fleetops.ansible.facts``, read from its source),
    for an option's help or default; None when the collection is not found, so that ``--help`` still
    works (a command that needs the collection then fails on its own: one line, exit 2)."""
    try:
        return read()
    except CollectionNotFound:
        return None


def shown(value: object, spec: str = "") -> str:
    """``", 1000"`` after "default: the module's" in a help; "" when the collection is not found."""
    return "" if value is None else ", " + format(value, spec)


def add_target_args(p: argparse.ArgumentParser, inventory_help: str = INVENTORY_HELP) -> None:
    """-i/--inventory and -l/--limit: which hosts. No -i: the localhost inventory, resolved once, in
    the library (``fleetops.paths.resolve_inventories``)."""
    p.add_argument("-i", "--inventory", action="append", type=Path, metavar="INVENTORY", help=inventory_help)
    p.add_argument(
        "-l",
        "--limit",
        help="further limit the hosts (ansible --limit pattern); blank, or with a part that matches no "
        "host: refused (scan: warned)",
    )


def add_policy_arg(p: argparse.ArgumentParser, use: str = "") -> None:
    """--policy: the remediation policy (None: the one fleetops ships)."""
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help=f"the policy{use} (fleetops.policy/v1 YAML; default: the one fleetops ships, policies/default.yml)",
    )


def add_state_dir_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--state-dir: the auto passes' state directory (None: <state home>/auto)."""
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=f"{what} (default: <state home>/auto; $FLEETOPS_STATE_DIR, /var/lib/fleetops as root)",
    )


def add_format_arg(
    p: argparse.ArgumentParser, formats: tuple[str, ...] = ("table", "json"), help: str = ""
) -> None:
    p.add_argument(
        "--format", choices=formats, default="table", help=help or "output format (default: table)"
    )


def add_all_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--all``: the table lists every row even past SUMMARY_ABOVE hosts (``what`` it summarises then)."""
    p.add_argument(
        "--all",
        action="store_true",
        dest="all_rows",
        help=f"with --format table: every host's row, however many (default: a table of more than "
        f"{SUMMARY_ABOVE} hosts is summarised: {what})",
    )


def add_quiet_arg(p: argparse.ArgumentParser, help: str = "", *, inherited: bool = False) -> None:
    """``-q/--quiet``: no progress on stderr (every command that prints progress takes it). ``inherited``:
    a sub-command whose parent takes -q too (``remediate -q reboot`` and ``remediate reboot -q`` alike)."""
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS if inherited else False,
        help=help or "no progress on stderr: only warnings, errors and failed hosts",
    )


def check_all_arg(args: argparse.Namespace) -> None:
    """``--all`` with a format other than table is a usage error (exit 2), found before anything runs."""
    if getattr(args, "all_rows", False) and args.format != "table":
        raise UsageError(f"--all applies to --format table only, not {args.format}")


def argtype[T](
    parse: Callable[[str], T],
    *,
    errors: tuple[type[Exception], ...] = (ValueError,),
    name: str | None = None,
) -> Callable[[str], T]:
    """An argparse type from a library parser: the ``errors`` it raises become argparse's (exit 2),
    their message kept, less a leading ``name`` (an option's name: ``--not-after: ...``)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except errors as exc:
            message = str(exc)
            if name is not None:
                message = message.removeprefix(f"{name}: ").removeprefix(f"{name} ")
            raise argparse.ArgumentTypeError(message) from None

    convert.__name__ = name or str(getattr(parse, "__name__", "value"))
    return convert


# the library's value parsers (fleetops.values) as argparse types
positive_int = argtype(values.int_range(0))  # an integer >= 0 (the name is historical)
percent = argtype(values.percent)
seconds = argtype(values.sample_seconds)  # 0..an hour (--sample-seconds)
key_value = argtype(values.key_value)
shard = argtype(values.shard)  # I/N (--shard)
cause = argtype(values.cause)  # one printable line (every --reason and --cause: add_reason_arg)


def add_reason_arg(p: argparse.ArgumentParser, help: str, *aliases: str) -> None:
    """``--reason TEXT`` (and ``aliases``, as ``--cause``): why, written to the audit log, the store, the pause
    and stop files or tags, so checked as it is parsed (``values.cause``: one printable line of at most
    ``values.CAUSE_MAX`` characters; else exit 2 before anything is touched); ``args.reason`` None when not
    given. Every subcommand that takes a reason takes it here (tests/fleetops/test_cli_reason.py walks them)."""
    p.add_argument(
        "--reason",
        *aliases,
        dest="reason",
        type=cause,
        default=None,  # a string default would go through the check (argparse converts it)
        metavar="TEXT",
        help=f"{help} (one line, up to {values.CAUSE_MAX} characters)",
    )


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (None: no upper bound)."""
    return argtype(values.int_range(low, high))


def seconds_range(low: float = 0.0, high: float = DAY_S, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: ``fleetops.values.seconds_range``."""
    return argtype(values.seconds_range(low, high, above=above))


def whole_seconds(low: int = 1, high: int = DAY_S) -> Callable[[str], int]:
    """An argparse type: whole seconds from ``low`` to ``high``."""
    return argtype(values.whole_seconds(low, high))


# ------------------------------------------------------------------ the rollout's lock and lease


def rollout_id(text: str) -> str:
    """argparse type for ``--break-lock ROLLOUT``."""
    from fleetops.rollout.lease import ROLLOUT_ID

    if not ROLLOUT_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"not a rollout id (like 20261129T170102Z-3fa9c1): {text!r}; use --break-lock alone for any stale lock"
        )
    return text


def _number_of_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"not a number of seconds: {text!r}") from None


def _lease_ttl(text: str) -> float:
    """``--lease-ttl S`` (against the default settle time; validate_ttl for the pair)."""
    from fleetops.rollout.lease import validate_ttl

    return validate_ttl(_number_of_seconds(text), settle=0.0)


def _lease_settle(text: str) -> float:
    """``--lease-settle S``."""
    from fleetops.rollout.lease import validate_settle

    return validate_settle(_number_of_seconds(text))


lease_ttl = argtype(_lease_ttl, errors=(UsageError,))
lease_settle = argtype(_lease_settle, errors=(UsageError,))
