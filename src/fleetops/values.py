"""Value parsers: text -> a checked value, ``ValueError`` with a one-line message otherwise.

The library declares its parameters with these (``fleetops.remediations``); the CLI turns each into an
argparse type with ``fleetops.cli.args.argtype`` (the one adapter), so a value means the same whether it
comes from a command line, a policy or the API.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fleetops.util import DAY_S, HOUR_S


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (None: no upper bound)."""

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ValueError(f"must be {bound}: {text!r}")
        return value

    return integer


def whole_seconds(low: int = 1, high: int = DAY_S) -> Callable[[str], int]:
    """Whole seconds from ``low`` to ``high``."""
    parse = int_range(low, high)

    def seconds(text: str) -> int:
        return parse(text)

    return seconds


def seconds_range(low: float = 0.0, high: float = DAY_S, *, above: bool = False) -> Callable[[str], float]:
    """A finite number of seconds from ``low`` (``above``: more than ``low``, where ``low`` would mean
    never or forever) to ``high``."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds: {text!r}")
        if (value <= low if above else value < low) or value > high:
            bound = f"more than {low:g}" if above else f"at least {low:g}"
            raise ValueError(f"must be {bound} and at most {high:g}: {text!r}")
        return value

    return seconds


def sample_seconds(text: str) -> float:
    """A finite number of seconds from 0 to an hour (the scan's ``--sample-seconds``)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= HOUR_S:
        raise ValueError(f"must be between 0 and {HOUR_S}: {text!r}")
    return value


def percent(text: str) -> float:
    """A percentage from 0 to 100 (a trailing ``%`` allowed)."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise ValueError(f"not a percentage: {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise ValueError(f"must be between 0 and 100: {text!r}")
    return value


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may be empty or hold ``=``)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return name, value
