"""The EC2 tag codec: a host's ladders (``TAG_KEY``) and the budgets spent on it (``SPENT_TAG_KEY``)
as tag values of at most ``TAG_MAX`` characters, and back.

Encoding is pure (what fits, most recent first); decoding refuses, with a one-line DocumentError
naming its source, a value longer than any EC2 tag or any entry not of the format, and then yields
nothing of it. What a decoded value means for the state (the record tried last wins; an action
counted once, within its window) is :mod:`fleetops.policy.state`'s to say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fleetops.documents import DocumentError
from fleetops.policy.language import ACTIONS, CHECKS, HUMAN, MAX_WINDOW_S, RULE_NAME
from fleetops.policy.records import LedgerEntry, RungRecord
from fleetops.schemas import MAX_EPOCH

FROM_TAG = "tag"  # LedgerEntry.controller of an entry read from a host's spent tag (another controller's)
FROM_LADDER_TAG = "ladder-tag"  # ... of one inferred from a rung in a host's ladder tag (not carried on)
TAG_KEY = "fleetops.io/ladder"  # the EC2 tag that carries a host's ladders (LadderState.tag_value)
TAG_MAX = 256  # EC2's limit on a tag value
SPENT_TAG_KEY = "fleetops.io/spent"  # the budgeted actions taken on a host (BudgetLedger.tag_value)
CLOCK_SKEW_S = 300  # a spent tag's entry this far ahead of this controller's clock still counts (as now)


def check_tag_length(value: str, source: str) -> None:
    """DocumentError unless ``value`` fits an EC2 tag value (TAG_MAX characters): a longer one came
    from no EC2 tag (a hand-written inventory's ``ec2_tags``), and is not parsed at all."""
    if len(value) > TAG_MAX:
        raise DocumentError(source, f"{len(value)} characters: longer than an EC2 tag value ({TAG_MAX})")


def ladder_tag_value(rules: Mapping[str, RungRecord]) -> str | None:
    """One host's ladders (rule -> record) as the value of ``TAG_KEY``: the ladders that quarantined
    the host first (dropping one would forget the quarantine, and its taint would never be released),
    then the most recently tried; what does not fit in TAG_MAX characters left out; None: no ladder
    (delete the tag).

    ``rule=rung:action:first_tried:last_tried:tries:quarantined:check`` joined by ``;``."""
    parts: list[str] = []
    for rule, rec in sorted(rules.items(), key=lambda kv: (not kv[1].quarantined, -kv[1].last_tried, kv[0])):
        part = (
            f"{rule}={rec.rung}:{rec.action}:{int(rec.first_tried)}:{int(rec.last_tried)}:{rec.tries}:"
            f"{int(rec.quarantined)}:{rec.check}"
        )
        if len(";".join([*parts, part])) <= TAG_MAX:
            parts.append(part)
    return ";".join(parts) or None


def parse_ladder_tag(value: str, source: str) -> dict[str, RungRecord]:
    """The ladders a ``TAG_KEY`` value holds (``ladder_tag_value``'s format), by rule (a rule given
    twice: the later entry); DocumentError (one line, naming ``source``) when it is not of it."""
    check_tag_length(value, source)
    parsed: dict[str, RungRecord] = {}
    for i, part in enumerate(value.split(";") if value else []):
        rule, eq, rest = part.partition("=")
        fields = rest.split(":")
        if (
            not eq
            or not re.fullmatch(RULE_NAME, rule)
            or len(fields) != 7
            or not all(f.isdigit() for f in (*fields[0:1], *fields[2:6]))
            or fields[1] not in ACTIONS
            or fields[5] not in ("0", "1")
            or fields[6] not in CHECKS
            or int(fields[4]) < 1
            or not int(fields[2]) <= int(fields[3]) <= MAX_EPOCH
        ):
            raise DocumentError(source, f"entry {i + 1} is not rule=rung:action:first:last:tries:quarantined:check: "
                                        f"{part[:60]!r}")  # fmt: skip
        parsed[rule] = RungRecord(
            check=fields[6], rung=int(fields[0]), action=fields[1], first_tried=float(fields[2]),
            last_tried=float(fields[3]), tries=int(fields[4]), quarantined=fields[5] == "1",
        )  # fmt: skip
    return parsed


def spent_tag_value(
    entries: Iterable[LedgerEntry], host: str, windows: Mapping[str, float], now: float
) -> str | None:
    """The actions taken on ``host`` that a budget still counts (``windows``: action -> its budget's
    window, seconds) as the value of ``SPENT_TAG_KEY``: ``action:epoch`` joined by ``;``, the most
    recent first, one per action and second, at most TAG_MAX characters (the oldest left out); then
    the entries another controller's tag brought (``FROM_TAG``) for actions this policy does not budget,
    kept up to MAX_WINDOW_S: that controller budgets them, and rewriting the tag must not erase them.
    None: nothing to carry (delete the tag)."""
    seen: set[tuple[str, int]] = set()
    counted: list[LedgerEntry] = []
    carried: list[LedgerEntry] = []
    for e in sorted(entries, key=lambda e: (-e.at, e.action)):
        key = (e.action, int(e.at))
        if e.host != host or key in seen:
            continue
        window = windows.get(e.action)
        if window is not None and now - window < e.at <= now:
            counted.append(e)
        elif window is None and e.controller == FROM_TAG and now - MAX_WINDOW_S < e.at <= now:
            carried.append(e)
        else:
            continue
        seen.add(key)
    parts: list[str] = []
    for e in [*counted, *carried]:
        part = f"{e.action}:{int(e.at)}"
        if len(";".join([*parts, part])) > TAG_MAX:
            break
        parts.append(part)
    return ";".join(parts) or None


def parse_spent_tag(value: str, source: str) -> list[tuple[str, float]]:
    """The (action, epoch) pairs a ``SPENT_TAG_KEY`` value holds (``spent_tag_value``'s format), in
    its order; DocumentError (one line, naming ``source``) when it is not of it."""
    check_tag_length(value, source)
    parsed: list[tuple[str, float]] = []
    for i, part in enumerate(value.split(";") if value else []):
        name, colon, epoch = part.partition(":")
        if not colon or name not in ACTIONS or name == HUMAN or not epoch.isdigit() or int(epoch) > MAX_EPOCH:
            raise DocumentError(source, f"entry {i + 1} is not action:epoch: {part[:60]!r}")
        parsed.append((name, float(epoch)))
    return parsed
