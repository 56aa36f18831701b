"""The EC2 ladder and spent tags: merged into the ladders and the ledger when read, written as the record
(without a store) or as a mirror people read (with one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetops.ansible.collection import module_utils
from fleetops.documents import DocumentError
from fleetops.policy import (
    FROM_LADDER_TAG,
    HUMAN,
    MAX_WINDOW_S,
    NO_GROUP,
    SPENT_TAG_KEY,
    TAG_KEY,
    BudgetLedger,
    LadderState,
)
from fleetops.rollout.lease import Ec2Connection


def merge_tags(
    ladder: LadderState,
    ledger: BudgetLedger,
    tags: Mapping[str, str],
    group_of: Callable[[str], str | None],
    now: float,
    warn: Callable[[str], None],
    spent: Mapping[str, str] | None = None,
) -> set[tuple[str, str]]:
    """Merge each host's ``TAG_KEY`` value into ``ladder`` and count its rungs (tried within the
    ledger's longest window, not already in the ledger) against the budgets; count the actions each
    host's ``SPENT_TAG_KEY`` value (``spent``) records too. A malformed tag is left out with a
    warning (one instance's bad tag must not stop the pass for the fleet); returns the (host, tag key)
    of each, which the pass leaves as it found it."""
    malformed: set[tuple[str, str]] = set()
    for host, value in sorted((spent or {}).items()):
        try:
            ledger.merge_tag(host, group_of(host) or NO_GROUP, value, f"{host}: tag {SPENT_TAG_KEY}", now)
        except DocumentError as exc:
            warn(f"{exc}: ignored, and left as it is for a person to mend or delete")
            malformed.add((host, SPENT_TAG_KEY))
    for host, value in sorted(tags.items()):
        try:
            ladder.merge_tag(host, value, source=f"{host}: tag {TAG_KEY}")
        except DocumentError as exc:
            warn(f"{exc}: ignored, and left as it is for a person to mend or delete")
            malformed.add((host, TAG_KEY))
            continue
        # a host whose spent tag was read has its budgeted actions from there, each at its act; its ladder
        # records a rung when the action finished (the clear time's start), later than the act by the
        # rollout's length: counting it too would spend one action twice. Only a host without a spent tag
        # (an older controller wrote ladders alone) has its rungs counted from the ladder.
        if host in (spent or {}) and (host, SPENT_TAG_KEY) not in malformed:
            continue
        for rec in ladder.hosts.get(host, {}).values():
            if rec.action == HUMAN or now - rec.last_tried > MAX_WINDOW_S or rec.last_tried > now:
                continue
            ledger.record_once(rec.action, host, group_of(host) or NO_GROUP, rec.last_tried, FROM_LADDER_TAG)
    return malformed


@dataclass(frozen=True)
class TagTarget:
    instance: str
    region: str
    value: str | None  # the ladder tag's value the inventory showed (None: no tag)
    spent: str | None = None  # the spent tag's value the inventory showed (None: no tag)

    def shown(self, key: str) -> str | None:
        return self.spent if key == SPENT_TAG_KEY else self.value


def write_tags(
    connection: Ec2Connection,
    targets: Mapping[str, TagTarget],
    new: Mapping[str, str | None],
    key: str,
    failed: Callable[[str, str], None],
) -> dict[str, str | None]:
    """Write (or delete) each host's tag ``key`` whose value changed; returns what was written. A host
    whose write fails is told to ``failed`` (host, why) and the others are still written."""
    lease_utils = module_utils("lease")
    aws = module_utils("aws")
    changed = {h: v for h, v in new.items() if h in targets and targets[h].shown(key) != v}
    if not changed:
        return {}
    regions = {targets[h].instance: targets[h].region for h in changed}
    tags = lease_utils.Ec2Tags(connection.settings(), regions, user_agent="fleetops.auto")
    written: dict[str, str | None] = {}
    for host, value in sorted(changed.items()):
        t = targets[host]
        old = t.shown(key)
        try:
            if value is None:
                if old is not None:
                    tags.delete([t.instance], key, old)
            else:
                tags.write([t.instance], key, value)
        except aws.AwsError as exc:
            failed(host, f"Failed to write its tag {key} ({t.instance}): {exc}")
            continue
        written[host] = value
    return written
