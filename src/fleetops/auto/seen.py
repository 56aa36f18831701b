"""The fleet record: what each pass saw of each host, for the passes that see less.

A pass limited to a few hosts (``-l``, an alert's pass) scans only those, but its storm brake and its
floors are the whole fleet's. So every applying pass, full or limited, records per host what its scan
showed (when, whether the host was scanned, the rules its findings match), and every pass reads what
the others recorded for the hosts outside its own scan:

- the storm brake counts, per rule, the hosts outside the pass that matched it in their latest record;
- the floors count as unavailable the hosts outside the pass whose latest record says they were not
  scanned (unreachable, a scan that failed);
- a host outside the pass with no record within :data:`SEEN_FRESH_S` is capacity unknown: a disruptive
  rung under a floor in its group waits (unless the floor says ``unrecorded: available``), and the pass
  says so.

``fleetops scan`` records what it saw the same way (:func:`record_scan`), unless ``--no-record``. A scan
that looked at some checks only (``--checks``, or a detector that failed on the host) records only what it
looked at: a rule it could not have matched (every check of the rule left out) keeps what an earlier
sighting recorded, with that sighting's time (``earlier``), so it is never recorded "clean".

With a shared store the record is one item per group (``seen#<group>``: at most one write per group a
pass saw, each read again and merged, conditional on the version read); without one, ``seen.json`` in the
state directory (read again, merged and written whole, atomically, under its own lock). Of two sightings
of a host the newer wins. A record that does not parse is kept as found and never written; its hosts'
capacity is unknown and the pass fails (exit 3), so that a person mends or deletes it. A dry run reads
the record and writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.policy import CHECKS, NO_GROUP, Policy, StateError, file_lock, fmt_duration
from fleetops.util import atomic_write

# How long what a pass saw stands for a host it did not scan: twice the shipped schedule's 15 minutes
# (awx/configure.yml), so that one late or failed scheduled pass does not make the fleet unknown.
SEEN_FRESH_S = 1800.0
SEEN_KEEP_S = 86400.0  # a sighting older than this is dropped when its record is written
SEEN_FILE = "seen.json"
SEEN_SCHEMA = "fleetops.auto.seen/v1"
SEEN_PREFIX = "seen#"
SEEN_LOCK_TIMEOUT_S = 5.0
SEEN_PUT_TRIES = 3  # a group item another writer changed meanwhile is read again and merged this often

# rule -> the checks it matches (None: a rule this policy does not know)
RuleChecks = Callable[[str], Collection[str] | None]


def rule_checks(policy: Policy) -> RuleChecks:
    checks = {r.name: frozenset(m.check for m in r.match) for r in policy.rules}
    return checks.get


@dataclass(frozen=True)
class Sighting:
    """One host in one scan: when, its scan status (``ok``, ``unreachable``, ...), the rules its findings
    matched; ``checks``: the checks looked at (None: every one); ``earlier``: rule -> when, the rules an
    earlier sighting matched that this one could not have (all their checks left out)."""

    at: float
    status: str
    rules: tuple[str, ...] = ()
    checks: tuple[str, ...] | None = None
    earlier: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Any) -> Sighting:
        """ValueError when ``raw`` is not one."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("rules", []), list):
            raise ValueError("not a sighting")
        checks, earlier = raw.get("checks"), raw.get("earlier", {})
        if (checks is not None and not isinstance(checks, list)) or not isinstance(earlier, Mapping):
            raise ValueError("not a sighting")
        at = float(raw["at"])
        times = {str(r): float(t) for r, t in earlier.items()}
        if not all(math.isfinite(t) for t in (at, *times.values())):
            raise ValueError("not a time")
        return cls(
            at,
            str(raw["status"]),
            tuple(str(r) for r in raw.get("rules", [])),
            None if checks is None else tuple(str(c) for c in checks),
            times,
        )

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"at": self.at, "status": self.status, "rules": list(self.rules)}
        if self.checks is not None:
            doc["checks"] = list(self.checks)
        if self.earlier:
            doc["earlier"] = dict(sorted(self.earlier.items()))
        return doc

    def says(self, now: float) -> str:
        return f"{self.status} in the fleet record of {fmt_duration(max(0, int(now - self.at)))} ago"

    def matched(self) -> dict[str, float]:
        """rule -> when the latest look at it matched it."""
        return {**self.earlier, **dict.fromkeys(self.rules, self.at)}

    def matching(self, since: float) -> set[str]:
        """The rules it matched at ``since`` or later."""
        return {r for r, at in self.matched().items() if at >= since}


def combine(a: Sighting | None, b: Sighting | None, checks_of: RuleChecks) -> Sighting | None:
    """The newer of two sightings of a host (of two as new, ``a``); when it looked at some checks only, with the rules the older
    matched that it could not have (every check of the rule left out; a rule of unknown checks is kept)."""
    if a is None or b is None:
        return a if b is None else b
    newer, older = (a, b) if a.at >= b.at else (b, a)
    if newer.checks is None:
        return newer
    looked = set(newer.checks)

    def left_out(rule: str) -> bool:
        checks = checks_of(rule)
        return checks is None or not set(checks) <= looked

    carried = {
        r: at
        for r, at in older.matched().items()
        if r not in newer.rules and left_out(r) and at >= newer.at - SEEN_KEEP_S
    }
    return dataclasses.replace(newer, earlier={**carried, **newer.earlier})


@dataclass
class FleetRecord:
    """The record as a pass read it: host -> its latest sighting; the groups whose record did not parse
    (``None`` among them: the whole record), kept as found."""

    hosts: dict[str, Sighting] = field(default_factory=dict)
    unreadable: set[str | None] = field(default_factory=set)
    malformed: list[str] = field(default_factory=list)

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
        for host, s in parsed.items():  # a host in two groups' items (another grouping): the newer
            if host not in self.hosts or s.at > self.hosts[host].at:
                self.hosts[host] = s


def sightings(
    scan_hosts: Mapping[str, Any], policy: Policy, now: float, checks: Collection[str] | None = None
) -> dict[str, Sighting]:
    """What a scan saw: each host, its status and the rules of ``policy`` its findings matched (the first
    rule that takes each finding, as the pass decides). ``checks``: the checks the scan ran (None: all);
    a check whose detector failed on a host, and every check of a host not scanned, was not looked at."""
    out = {}
    for host, e in scan_hosts.items():
        status = str(e.get("status") or "not scanned") if isinstance(e, Mapping) else "not scanned"
        if status != "ok":
            out[host] = Sighting(now, status, (), ())
            continue
        rules = {
            rule.name
            for f in e.get("findings") or []
            if isinstance(f, Mapping) and (rule := policy.rule_for(f)) is not None
        }
        failed = {str(x.get("check")) for x in e.get("errors") or [] if isinstance(x, Mapping)}
        looked = (
            None
            if checks is None and not failed
            else tuple(sorted(set(CHECKS if checks is None else checks) - failed))
        )
        out[host] = Sighting(now, status, tuple(sorted(rules)), looked)
    return out


def _merged(
    current: Mapping[str, Sighting], seen: Mapping[str, Sighting], checks_of: RuleChecks, now: float
) -> dict[str, Sighting]:
    both = {h: combine(seen.get(h), current.get(h), checks_of) for h in {*current, *seen}}  # a tie: seen
    return {h: s for h, s in sorted(both.items()) if s is not None and s.at >= now - SEEN_KEEP_S}


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


def save_dir(
    state_dir: Path,
    seen: Mapping[str, Sighting],
    now: float,
    checks_of: RuleChecks,
    warn: Callable[[str], None],
) -> None:
    """``seen`` merged into the record as it is now (read again under its lock: a scan or another pass
    may have written it since); sightings older than a day are dropped. Never over a record that does
    not parse."""
    if not seen:
        return
    path = state_dir / SEEN_FILE
    try:
        with file_lock(path, SEEN_LOCK_TIMEOUT_S):
            record = load_dir(state_dir)
            if None in record.unreadable:
                return
            hosts = _merged(record.hosts, seen, checks_of, now)
            doc = {"schema": SEEN_SCHEMA, "hosts": {h: s.to_dict() for h, s in hosts.items()}}
            atomic_write(path, json.dumps(doc, sort_keys=True) + "\n", mode=0o600, mkdir=True)
    except StateError as exc:
        warn(f"the fleet record was not written: {exc}")


# ---- with a store: one item per group


def load_store(store: Any) -> FleetRecord:
    """``store``: a :class:`fleetops.store.Store` (StoreFailure when it cannot be read)."""
    record = FleetRecord()
    for item in store.call(store.backend.items, SEEN_PREFIX):
        record._group(item.key, item.key[len(SEEN_PREFIX) :], item.doc)
    return record


def save_store(
    store: Any,
    seen: Mapping[str, Sighting],
    group_of: Callable[[str], str | None],
    now: float,
    checks_of: RuleChecks,
    warn: Callable[[str], None],
) -> None:
    """Per group this scan saw a host of: its item read again, ``seen`` merged in (its other hosts'
    sightings kept), written conditional on the version read; one another writer changed meanwhile is read
    and merged again. A group whose item does not parse is never written. StoreFailure when the store
    cannot be reached."""
    conflict = module_utils("store").Conflict
    by_group: dict[str, dict[str, Sighting]] = {}
    for host, s in seen.items():
        by_group.setdefault(group_of(host) or NO_GROUP, {})[host] = s
    for group, mine in sorted(by_group.items()):
        key = SEEN_PREFIX + group
        for attempt in range(SEEN_PUT_TRIES):
            item = store.call(store.backend.get, key)
            record = FleetRecord()
            if item is not None:
                record._group(key, group, item.doc)
                if record.unknown(group):
                    break  # kept as found: the passes that read it say so
            hosts = _merged(record.hosts, mine, checks_of, now)
            doc = {"schema": SEEN_SCHEMA, "group": group, "hosts": {h: s.to_dict() for h, s in hosts.items()}}
            try:
                store.call(store.backend.put, key, doc, item.version if item is not None else None)
                break
            except conflict as exc:
                if attempt == SEEN_PUT_TRIES - 1:
                    warn(
                        f"the fleet record of group {group} kept changing under this write ({exc}): not written"
                    )


def save(
    seen: Mapping[str, Sighting],
    *,
    store: Any,
    state_dir: Path,
    group_of: Callable[[str], str | None],
    now: float,
    checks_of: RuleChecks,
    warn: Callable[[str], None],
) -> str:
    """``seen`` into the fleet record: the shared store's when there is one, else the state directory's.
    Where it went."""
    if store is not None:
        save_store(store, seen, group_of, now, checks_of, warn)
        return str(store.where())
    save_dir(state_dir, seen, now, checks_of, warn)
    return str(state_dir / SEEN_FILE)


def record_scan(
    report: Mapping[str, Any],
    policy: Policy,
    checks: Collection[str] | None,
    *,
    store: Any,
    state_dir: Path,
    group_of: Callable[[str], str | None],
    now: float,
    warn: Callable[[str], None],
) -> str:
    """``fleetops scan``'s record: what it saw of each host, as a pass records it (a host an interrupted
    scan never reached is left out: the scan, not the host, stopped). Where it went ('' when nothing)."""
    hosts = {
        h: e
        for h, e in (report.get("hosts") or {}).items()
        if not (report.get("interrupted") and isinstance(e, Mapping) and e.get("status") == "not_scanned")
    }
    seen = sightings(hosts, policy, now, checks)
    if not seen:
        return ""
    return save(
        seen,
        store=store,
        state_dir=state_dir,
        group_of=group_of,
        now=now,
        checks_of=rule_checks(policy),
        warn=warn,
    )
