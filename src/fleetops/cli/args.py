"""Arguments every command shares: the parser class, -i/-l, --format and value types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from fleetops.exitcodes import ExitCode

INVENTORY_HELP = "inventory file or directory (repeatable; default: the localhost inventory)"


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_target_args(p: argparse.ArgumentParser, inventory_help: str = INVENTORY_HELP) -> None:
    """-i/--inventory and -l/--limit: which hosts. No -i: the localhost inventory, resolved once, in
    the library (``fleetops.paths.resolve_inventories``)."""
    p.add_argument("-i", "--inventory", action="append", type=Path, metavar="INV", help=inventory_help)
    p.add_argument("-l", "--limit", help="further limit the hosts (ansible --limit pattern)")


def add_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default: table)"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100: {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600: {text!r}")
    return value


def from_library[T](parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a library parser that raises ValueError (its message kept)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert
