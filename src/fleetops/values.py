"""Value parsers: text -> a checked value, ``ValueError`` with a one-line message otherwise.

The library declares its parameters with these (``fleetops.remediations``); the CLI turns each into an
argparse type with ``fleetops.cli.args.argtype`` (the one adapter), so a value means the same whether it
comes from a command line, a policy or the API.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

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


# characters of a --reason/--cause (why a pass runs, a pause, a stop, a lift): what the pass's JSON, the audit
# log, the pause and stop files and the store keep whole (an EC2 tag's copy is shortened to fit 256)
CAUSE_MAX = 1000
# characters of quarantine's --reason: what the node's annotation keeps (auto.actions; a Slurm drain reason is
# cut to 200 with its prefix by the module)
QUARANTINE_REASON_MAX = 200


def one_line(text: str, limit: int = CAUSE_MAX, *, empty: bool = False) -> str:
    """A person's free text in one printable line of at most ``limit`` characters (surrounding blanks dropped;
    ``empty``: none allowed): it is written into the audit log, the store, tags and node annotations as it is,
    so no newline (a forged audit line) or other control character. ValueError, one line, otherwise."""
    value = text.strip()
    if not value and not empty:
        raise ValueError("must not be empty")
    if len(value) > limit:
        raise ValueError(f"must be at most {limit} characters (got {len(value)})")
    if not value.isprintable():
        raise ValueError(f"must be one line of printable characters: {value[:80]!r}")
    return value


def printable_line(text: str, limit: int) -> str:
    """``text`` that a host wrote (a finding's summary) made one line of printable characters of at most ``limit``:
    every run of blanks and other non-printable characters (a newline, an escape, U+2028) one space, then cut.
    What ``one_line`` refuses from a person, this mends in what fleetops derives from a host."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:limit].rstrip()


def cause(text: str) -> str:
    """Why (a pass runs, automation is paused, a rollout stopped, a brake lifted, a record closed): ``one_line``
    of at most ``CAUSE_MAX``. Every ``--reason`` and ``--cause`` of the CLI (``cli.args.add_reason_arg``)."""
    return one_line(text, CAUSE_MAX)


def quarantine_reason(text: str) -> str:
    """quarantine's ``--reason`` (a remediation parameter, may be empty): ``one_line`` of at most
    ``QUARANTINE_REASON_MAX``."""
    return one_line(text, QUARANTINE_REASON_MAX, empty=True)


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


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based): the hosts whose name's SHA-256, as a number, leaves
    ``index - 1`` when divided by ``count``. A host's shard depends on its name and ``count`` only, so
    hosts joining or leaving the fleet never move another host to another shard."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"the shard count must be at least 1: {self}")
        if not 1 <= self.index <= self.count:
            raise ValueError(f"the shard index must be between 1 and {self.count}: {self}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, host: str) -> bool:
        """Whether ``host`` is in this shard."""
        return shard_of(host, self.count) == self.index

    def to_dict(self) -> dict[str, int]:
        """As a report records it: ``{"index": I, "count": N}``."""
        return {"index": self.index, "count": self.count}


def shard_of(host: str, count: int) -> int:
    """The shard (1..``count``) that holds ``host``: its name's SHA-256 modulo ``count``, plus one."""
    digest = hashlib.sha256(host.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest, "big") % count + 1


def shard(text: str) -> Shard:
    """``I/N`` (``--shard``): shard I of N, 1 <= I <= N."""
    index, sep, count = text.partition("/")
    if not sep:
        raise ValueError(f"expected I/N (shard I of N, 1 <= I <= N), got {text!r}")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"expected I/N with whole numbers I and N, got {text!r}") from None
    if n < 1:
        raise ValueError(f"the shard count N must be at least 1: {text!r}")
    if not 1 <= i <= n:
        raise ValueError(f"the shard index I must be between 1 and N ({n}): {text!r}")
    return Shard(i, n)
