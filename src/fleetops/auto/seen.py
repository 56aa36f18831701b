"""The fleet record: what each pass saw of each host, for the passes that see less.

A pass limited to a few hosts (``-l``, an alert's pass) scans only those, but its storm brake and its
floors are the whole fleet's. So every applying pass, full or limited, records per host what its scan
showed (when, whether the host was scanned, the rules its findings match), and every pass reads what
the others recorded for the hosts outside its own scan:

- the storm brake counts, per rule, the hosts outside the pass that matched it in their latest record;
- the floors count as unavailable the hosts outside the pass whose latest record says they were not
  scanned (unreachable, a scan that failed);
- a host outside the pass with no record within :data:`SEEN_FRESH_S` is capacity unknown: a disruptive
  rung under a floor in its group waits, and the pass says so.

With a shared store the record is one item per group (``seen#<group>``: at most one write per group a
pass saw, conditional on the version read); without one, ``seen.json`` in the state directory (written
whole, atomically, under the pass lock). A record that does not parse is kept as found and never
written; its hosts' capacity is unknown and the pass fails (exit 3), so that a person mends or deletes
it. A dry run reads the record and writes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.policy import NO_GROUP, fmt_duration
from fleetops.util import atomic_write

# How long what a pass saw stands for a host it did not scan: twice the shipped schedule's 15 minutes
# (awx/configure.yml), so that one late or failed scheduled pass does not make the fleet unknown.
SEEN_FRESH_S = 1800.0
SEEN_FILE = "seen.json"
SEEN_SCHEMA = "fleetops.auto.seen/v1"
SEEN_PREFIX = "seen#"


@dataclass(frozen=True)
class Sighting:
    """One host in one pass's scan: when, its scan status (``ok``, ``unreachable``, ...), the rules its
    findings matched."""

    at: float
    status: str
    rules: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> Sighting:
        """ValueError when ``raw`` is not one."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("rules", []), list):
            raise ValueError("not a sighting")
        at = float(raw["at"])
        if not math.isfinite(at):
            raise ValueError("not a time")
        return cls(at, str(raw["status"]), tuple(str(r) for r in raw.get("rules", [])))

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "status": self.status, "rules": list(self.rules)}

    def says(self, now: float) -> str:
        return f"{self.status} in the fleet record of {fmt_duration(max(0, int(now - self.at)))} ago"


@dataclass
class FleetRecord:
    """The record as a pass read it: host -> its latest sighting; the groups whose record did not parse
    (``None`` among them: the whole record), kept as found; per group, the store item's version."""

    hosts: dict[str, Sighting] = field(default_factory=dict)
    unreadable: set[str | None] = field(default_factory=set)
    malformed: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)

    def fresh(self, now: float) -> dict[str, Sighting]:
        return {h: s for h, s in self.hosts.items() if s.at >= now - SEEN_FRESH_S}

    def unknown(self, group: str) -> bool:
        return None in self.unreadable or group in self.unreadable

    def _group(self, source: str, group: str | None, raw: Any) -> None:
        hosts = raw.get("hosts") if isinstance(raw, Mapping) and raw.get("schema") == SEEN_SCHEMA else None
        try:
            if not isinstance(hosts, Mapping):
                raise ValueError("no hosts")
            parsed = {str(h): Sighting.parse(s) for h, s in hosts.items()}
        except (KeyError, TypeError, ValueError):
            self.unreadable.add(group)
            self.malformed.append(
                f"{source}: not a {SEEN_SCHEMA} document (kept, never written): "
                + ("every host's" if group is None else f"group {group}'s")
                + " capacity is unknown to the passes that do not scan it"
            )
            return
        self.hosts.update(parsed)


def sightings(
    scan_hosts: Mapping[str, Any], rules_of: Mapping[str, Iterable[str]], now: float
) -> dict[str, Sighting]:
    """What this pass saw: each host of its scan, its status and the rules its findings matched."""
    return {
        h: Sighting(
            now,
            str(e.get("status") or "not scanned") if isinstance(e, Mapping) else "not scanned",
            tuple(sorted(set(rules_of.get(h, ())))),
        )
        for h, e in scan_hosts.items()
    }


# ---- without a store: the state directory


def load_dir(state_dir: Path) -> FleetRecord:
    record = FleetRecord()
    path = state_dir / SEEN_FILE
    if not path.exists() and not path.is_symlink():
        return record
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        record.unreadable.add(None)
        record.malformed.append(f"{path}: {exc} (kept, never written): every host's capacity is unknown")
        return record
    record._group(str(path), None, raw)
    return record


def save_dir(state_dir: Path, record: FleetRecord, seen: Mapping[str, Sighting], now: float) -> None:
    """The record with this pass's sightings; entries older than a day are dropped. Never over a record
    that did not parse."""
    if None in record.unreadable or not seen:
        return
    hosts = {h: s for h, s in {**record.hosts, **seen}.items() if s.at >= now - 86400}
    doc = {"schema": SEEN_SCHEMA, "hosts": {h: s.to_dict() for h, s in sorted(hosts.items())}}
    atomic_write(state_dir / SEEN_FILE, json.dumps(doc, sort_keys=True) + "\n", mode=0o600, mkdir=True)


# ---- with a store: one item per group


def load_store(store: Any) -> FleetRecord:
    """``store``: a :class:`fleetops.store.Store` (StoreFailure when it cannot be read)."""
    record = FleetRecord()
    for item in store.call(store.backend.items, SEEN_PREFIX):
        group = item.key[len(SEEN_PREFIX) :]
        record.versions[group] = item.version
        record._group(item.key, group, item.doc)
    return record


def save_store(
    store: Any,
    record: FleetRecord,
    seen: Mapping[str, Sighting],
    group_of: Callable[[str], str | None],
    now: float,
    warn: Callable[[str], None],
) -> None:
    """One conditional write per group this pass saw a host of (its other hosts' sightings kept); a group
    whose item did not parse is never written; one that changed since it was read (another pass or scan
    wrote it) is left to the newer writer, said."""
    by_group: dict[str, dict[str, Sighting]] = {}
    for host, s in record.hosts.items():
        by_group.setdefault(group_of(host) or NO_GROUP, {})[host] = s
    touched = {group_of(h) or NO_GROUP for h in seen}
    for host, s in seen.items():
        by_group.setdefault(group_of(host) or NO_GROUP, {})[host] = s
    for group in sorted(touched):
        if record.unknown(group):
            continue
        hosts = {h: s for h, s in by_group[group].items() if s.at >= now - 86400}
        doc = {
            "schema": SEEN_SCHEMA,
            "group": group,
            "hosts": {h: s.to_dict() for h, s in sorted(hosts.items())},
        }
        try:
            item = store.call(store.backend.put, SEEN_PREFIX + group, doc, record.versions.get(group))
        except module_utils("store").Conflict as exc:
            warn(
                f"the fleet record of group {group} changed under this pass ({exc}): left as the newer pass wrote it"
            )
            continue
        record.versions[group] = item.version
