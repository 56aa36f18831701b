"""The shared store on the controller: the pause, the auto pass's lease, the ladders and the budget
ledger, in one DynamoDB table with compare-and-swap (the collection's ``module_utils/store.py``).

Configured beside the ``fleetops.node.ec2`` inventory source (``store_table``, ``store_region``,
``store_endpoint_url``; the region defaults to the source's first, the endpoint and credentials to
the source's), so ``-i`` is all a command needs. A source without ``store_table`` has no store and
every command behaves as before it (state directory + EC2 tags).

What it holds (keys; every document is versioned, every write conditional on the version read):

- ``pause``: ``fleetops pause`` (who, when, why). While it is there no auto pass acts, and every
  running rollout stops after its current batch (the engine asks before each batch, as it asks the
  kill switch). ``fleetops unpause`` deletes it. Both are audited (``audit#<time>#<id>``).
- ``auto#lease``: the auto pass that may act now (pass id, operator, since, expires), renewed by a
  thread every third of its TTL. A second pass on any controller is refused (exit 4) while it is
  live; an expired one (a pass killed with SIGKILL) is taken over. The versions of the ledger and
  ladder items are the fencing tokens: a pass that lost its lease unnoticed finds its next write
  refused (``Conflict``) and starts nothing more.
- ``ledger#<action>``: the budgeted actions taken (``fleetops.store.ledger/v1``), each entry also a
  journal record: ``reserved`` by a pass before its batch starts (spent whatever its time), then
  ``done`` (attempted; its time moved to when its host was acted on, its batch's start) or removed
  (not attempted) after. A ``reserved`` entry the next pass finds was left by a pass that died
  mid-batch: it counts as attempted (``in_doubt``), its ladder climbs as if the rung ran, and the
  budget stays spent, from when that pass found it. Entries that do not parse are kept as they are, never deleted. Entries
  leave after the longest budget window, except one a later pass must still finish (``pending``):
  that stays until finished, or closed by a person (``fleetops store forget``, :mod:`fleetops.journal`).
- ``ladder#<host>``: where each ladder of the host stands (``fleetops.store.ladder/v1``).
- ``seeded``: the store was seeded from the EC2 tags and the state directory (the upgrade path: the
  first pass with a store reads them once; afterwards the tags are a mirror the pass writes).

Timestamps are the controller's clock checked against the store's (its answers' ``Date``): a
controller more than ``MAX_SKEW_S`` off refuses to act (exit 3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible.collection import constant, module_utils
from fleetops.ansible.runner import ec2_sources
from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.policy import BudgetLedger, LadderState
from fleetops.policy.language import MAX_WINDOW_S
from fleetops.policy.records import LedgerEntry, RungRecord
from fleetops.rollout.lease import Ec2Connection
from fleetops.rollout.pause import PauseRecord, reason_line
from fleetops.util import dead_here, iso_utc, process_id

PAUSE_KEY: str = constant("store", "PAUSE_KEY")
LEASE_KEY = "auto#lease"
SEEDED_KEY = "seeded"
AUDIT_PREFIX = "audit#"
BRAKE_PREFIX = "brake#"
LADDER_PREFIX = "ladder#"
LEDGER_PREFIX = "ledger#"
LADDER_SCHEMA = "fleetops.store.ladder/v1"
LEDGER_SCHEMA = "fleetops.store.ledger/v1"
PASS_LEASE_TTL_S = 120.0  # a killed pass holds the store this long at most; renewed every third of it
MAX_SKEW_S: float = constant("store", "MAX_SKEW_S")
DEFAULT_TABLE: str = constant("store", "DEFAULT_TABLE")
# journal states of a ledger entry
RESERVED, DONE, IN_DOUBT = "reserved", "done", "in_doubt"


def _mu() -> Any:
    return module_utils("store")


class StoreFailure(FleetopsError):
    """The store could not be read or written (unreachable, throttled past the retries, clock skew, a
    write refused because another pass took over): nothing disruptive is done without it."""

    exit_code = ExitCode.FAILED


class StoreLockedError(FleetopsError):
    """Another auto pass holds the store's lease."""

    exit_code = ExitCode.LOCKED


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class StoreConfig:
    table: str
    region: str
    connection: Ec2Connection  # credentials and retry budget; endpoint_url is the store's
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> StoreConfig | None:
        """The store a fleetops.node.ec2 source names (its options, else their environment variables,
        module_utils/store.py's OPTIONS); None when it names none."""
        ec2 = Ec2Connection.from_config(config, source=source)
        try:
            found = _mu().resolve(config, ec2.regions, ec2.endpoint_url)
        except ValueError as exc:
            raise UsageError(f"{source}: {exc}") from None
        if found is None:
            return None
        table, region, endpoint = found
        return cls(table, region, dataclasses.replace(ec2, endpoint_url=endpoint), source)


def config_for(inventories: Iterable[Path]) -> StoreConfig | None:
    """The store of the (first) fleetops.node.ec2 source; None when there is none or it names none."""
    found = next(ec2_sources(inventories), None)
    if found is None:
        return None
    path, config = found
    return StoreConfig.from_config(config, source=str(path))


def open_store(inventories: Iterable[Path], clock: Callable[[], float] = time.time) -> Store | None:
    config = config_for(inventories)
    if config is None:
        return None
    backend = _mu().DynamoStore(config.connection.settings(), config.table, config.region, clock=clock)
    return Store(backend, clock=clock)


# ------------------------------------------------------------------------------ the store


class Store:
    """The controller's calls on the store. ``backend``: module_utils/store.py's DynamoStore or
    MemoryStore. Every failure is a StoreFailure (one line)."""

    def __init__(self, backend: Any, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.clock = clock
        self._ready = False

    def where(self) -> str:
        return str(self.backend.where())

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        mu = _mu()
        try:
            return func(*args)
        except mu.Conflict:
            raise
        except mu.StoreError as exc:
            raise StoreFailure(f"Failed to use the shared store: {exc}") from None

    def ready(self) -> None:
        """The table exists (created on first use) and this controller's clock agrees with the store's."""
        if not self._ready:
            self.call(self.backend.ensure)
            self._ready = True
        self.check_clock()

    def check_clock(self) -> None:
        if self.backend.skew is None:
            self.call(self.backend.get, PAUSE_KEY)  # any answer carries the store's Date
        try:
            _mu().check_skew(self.backend.skew, MAX_SKEW_S)
        except _mu().StoreError as exc:
            raise StoreFailure(str(exc)) from None

    # ---- audit and pause

    def audit(self, event: str, operator: str, **data: Any) -> None:
        now = self.clock()
        key = f"{AUDIT_PREFIX}{iso_utc(now)}#{secrets.token_hex(4)}"
        doc = {"event": event, "operator": operator, "at": now, **data}
        self.call(self.backend.put, key, doc, None)

    def paused(self) -> PauseRecord | None:
        """The pause in force, or None. An unreadable pause item still means paused."""
        return self._pause_record(self.call(self.backend.get, PAUSE_KEY))

    def _pause_record(self, item: Any) -> PauseRecord | None:
        if item is None:
            return None
        doc = item.doc if isinstance(item.doc, dict) else {}
        try:
            return PauseRecord(str(doc["operator"]), float(doc["since"]), str(doc.get("reason") or ""))
        except (KeyError, TypeError, ValueError):
            return PauseRecord("unknown", 0.0, f"unreadable pause item in {self.where()} (still paused)")

    def pause(self, operator: str, reason: str) -> tuple[PauseRecord, bool]:
        """Pause (audited); ``(the pause in force, whether this call set it)``."""
        self.ready()
        record = PauseRecord(operator, self.clock(), reason_line(reason))
        mu = _mu()
        try:
            self.call(
                self.backend.put,
                PAUSE_KEY,
                {"operator": record.operator, "since": record.since, "reason": record.reason},
                None,
            )
        except mu.Conflict:
            current = self.paused()
            return (current or record), False
        self.audit("pause", operator, reason=record.reason)
        return record, True

    def unpause(self, operator: str, reason: str) -> PauseRecord | None:
        """Lift the pause (audited); the pause lifted, or None when there was none."""
        return self._pause_record(self._lift(PAUSE_KEY, "the pause", "unpause", operator, reason))

    def _lift(self, key: str, what: str, event: str, operator: str, reason: str, **data: Any) -> Any:
        """Delete ``key`` at the version read (read again when it changed meanwhile) and audit ``event``;
        the item deleted, or None when there was none."""
        self.ready()
        for _ in range(5):
            item = self.call(self.backend.get, key)
            if item is None:
                return None
            try:
                self.call(self.backend.delete, key, item.version)
            except _mu().Conflict:
                continue  # set again meanwhile: read again
            self.audit(event, operator, **data, reason=reason_line(reason))
            return item
        raise StoreFailure(f"Failed to lift {what} in {self.where()}: it kept changing")

    # ---- storm brakes

    def brakes(self) -> dict[str, dict[str, Any]]:
        """The storm brakes in force: rule -> {since, why, operator}. An unreadable one still holds."""
        out: dict[str, dict[str, Any]] = {}
        for item in self.call(self.backend.items, BRAKE_PREFIX):
            rule = item.key[len(BRAKE_PREFIX) :]
            doc = item.doc if isinstance(item.doc, dict) else {}
            out[rule] = {
                "since": doc.get("since"),
                "why": str(doc.get("why") or "unreadable brake item: still held"),
            }
        return out

    def trip_brake(self, rule: str, why: str, operator: str) -> bool:
        """Set the storm brake on ``rule`` (audited); False when another controller set it first."""
        now = self.clock()
        try:
            self.call(
                self.backend.put, BRAKE_PREFIX + rule, {"since": now, "why": why, "operator": operator}, None
            )
        except _mu().Conflict:
            return False
        self.audit("brake", operator, rule=rule, why=why)
        return True

    def lift_brake(self, rule: str, operator: str, reason: str) -> bool:
        """Lift the storm brake on ``rule`` (audited); False when none was set."""
        lifted = self._lift(
            BRAKE_PREFIX + rule, f"the storm brake on {rule}", "lift-brake", operator, reason, rule=rule
        )
        return lifted is not None

    def rollout_leases(self, now: float) -> list[tuple[Any, list[str]]]:
        """The rollouts' leases held in the store (module_utils/lease.py's ``store_leases``): ``[(LeaseRecord,
        [instance ids])]``, live or not."""
        leases: list[tuple[Any, list[str]]] = self.call(module_utils("lease").store_leases, self.backend, now)
        return leases

    def audit_trail(self) -> list[dict[str, Any]]:
        return [i.doc for i in self.call(self.backend.items, AUDIT_PREFIX) if isinstance(i.doc, dict)]


# ------------------------------------------------------------------------------ the auto pass's lease


@dataclass
class PassLease:
    """The store's ``auto#lease`` held by one pass: ``take``, a renewing thread, ``release``; ``lost``
    says why it is no longer held (checked before every batch)."""

    store: Store
    pass_id: str
    operator: str
    ttl: float = PASS_LEASE_TTL_S
    version: int = 0
    lost: str | None = None
    took_over: str | None = None  # whose live lease was taken over, and why (its pass is dead)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _doc(self, since: float) -> dict[str, Any]:
        now = self.store.clock()
        return {
            "pass": self.pass_id,
            "operator": self.operator,
            "controller": process_id(),
            "since": since,
            "expires": now + self.ttl,
        }

    def take(self) -> None:
        mu = _mu()
        store = self.store
        item = store.call(store.backend.get, LEASE_KEY)
        now = store.clock()
        if item is not None:
            doc = item.doc if isinstance(item.doc, dict) else {}
            expires = doc.get("expires")
            live = not isinstance(expires, (int, float)) or expires > now  # unreadable: held
            if not live and doc.get("pass") not in (None, self.pass_id):
                self.took_over = f"pass {doc.get('pass')}'s lease had expired (its controller died or hung)"
            if live and doc.get("pass") != self.pass_id and dead_here(doc.get("controller")):
                self.took_over = (
                    f"pass {doc.get('pass', '?')} of this controller ({doc.get('controller')}) is dead"
                )
                live = False
            if live and doc.get("pass") != self.pass_id:
                left = f", expires {iso_utc(expires)}" if isinstance(expires, (int, float)) else ""
                raise StoreLockedError(
                    f"another 'fleetops remediate auto' pass holds the shared store ({self.store.where()}): "
                    f"pass {doc.get('pass', '?')} by {doc.get('operator', '?')}{left}"
                )
        try:
            new = store.call(store.backend.put, LEASE_KEY, self._doc(now), item.version if item else None)
        except mu.Conflict:
            raise StoreLockedError(
                f"another 'fleetops remediate auto' pass took the shared store's lease at the same time "
                f"({self.store.where()})"
            ) from None
        self.version = new.version
        self._since = now
        self._thread = threading.Thread(target=self._renew_loop, name="fleetops-store-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        mu = _mu()
        with self._lock:
            if self.lost is not None:
                return
            try:
                new = self.store.call(self.store.backend.put, LEASE_KEY, self._doc(self._since), self.version)
                self.version = new.version
            except mu.Conflict:
                self.lost = "another pass took the shared store's lease (this one's had expired)"
            except StoreFailure as exc:
                if self.store.clock() > self._since + self.ttl:  # cannot tell any more: assume lost
                    self.lost = f"the lease could not be renewed: {exc}"

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.lost is None and self.version:
                try:
                    self.store.call(self.store.backend.delete, LEASE_KEY, self.version)
                except (_mu().Conflict, StoreFailure):
                    pass  # taken over or unreachable: it expires on its own
            self.lost = self.lost or "released"


# ------------------------------------------------------------------------------ ladders and ledger


def pending(journal: Mapping[str, Any] | None) -> bool:
    """A journal record a later pass must still finish (an instance left half done, a batch to run
    again) and nobody has closed (``finished``: by a pass, or ``fleetops store forget``): never pruned."""
    return (
        journal is not None
        and journal.get("state") in (RESERVED, IN_DOUBT)
        and not journal.get("finished")
        and (isinstance(journal.get("instance"), str) or isinstance(journal.get("rerun"), dict))
    )


def _entry_doc(e: LedgerEntry, journal: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": e.id,
        "host": e.host,
        "group": e.group,
        "at": e.at,
        "controller": e.controller,
        **journal,
    }


@dataclass
class StoredState:
    """The ladders and the ledger as one pass reads them from the store, and writes them back
    (each item conditional on the version read). ``journal``: entry id -> its journal fields
    (state, pass, rule, rung, check); ``kept``: per action, entries that did not parse (kept)."""

    store: Store
    ladder: LadderState = field(default_factory=LadderState)
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    journal: dict[str, dict[str, Any]] = field(default_factory=dict)
    ladder_versions: dict[str, int] = field(default_factory=dict)
    ledger_versions: dict[str, int] = field(default_factory=dict)
    kept: dict[str, list[Any]] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)  # "key: why" of items that did not parse
    written_ladders: dict[str, str] = field(default_factory=dict)  # host -> the JSON last written/read
    written_ledgers: dict[str, str] = field(default_factory=dict)
    seeded: bool = True

    def load(self) -> None:
        store = self.store
        for item in store.call(store.backend.items, LADDER_PREFIX):
            host = item.key[len(LADDER_PREFIX) :]
            self.ladder_versions[host] = item.version
            doc = item.doc
            try:
                rules = {r: RungRecord(**rec) for r, rec in doc["rules"].items()}
            except (KeyError, TypeError, AttributeError):
                self.malformed.append(f"{item.key}: not a {LADDER_SCHEMA} document (kept, never written)")
                self.ladder_versions[host] = -1  # never written
                continue
            if rules:
                self.ladder.hosts[host] = rules
            self.written_ladders[host] = self._ladder_json(host)
        for item in store.call(store.backend.items, LEDGER_PREFIX):
            action = item.key[len(LEDGER_PREFIX) :]
            self.ledger_versions[action] = item.version
            entries = item.doc.get("entries") if isinstance(item.doc, dict) else None
            if not isinstance(entries, list):
                self.malformed.append(f"{item.key}: not a {LEDGER_SCHEMA} document (kept, never written)")
                self.ledger_versions[action] = -1  # never written
                continue
            for raw in entries:
                try:
                    entry = LedgerEntry(
                        action=action,
                        host=str(raw["host"]),
                        group=str(raw["group"]),
                        at=float(raw["at"]),
                        controller=str(raw.get("controller", "")),
                        id=str(raw["id"]),
                        reserved=raw.get("state") == RESERVED,
                    )
                except (KeyError, TypeError, ValueError):
                    self.kept.setdefault(action, []).append(raw)  # not ours to judge: kept as it is
                    continue
                self.ledger.entries.append(entry)
                self.journal[entry.id] = {
                    k: v for k, v in raw.items() if k not in ("id", "host", "group", "at", "controller")
                }
            self.written_ledgers[action] = self._ledger_json(action)
        self.seeded = store.call(store.backend.get, SEEDED_KEY) is not None

    def _ladder_json(self, host: str) -> str:
        rules = self.ladder.hosts.get(host, {})
        return json.dumps({r: vars(rec) for r, rec in sorted(rules.items())}, sort_keys=True)

    def _ledger_docs(self, action: str) -> list[dict[str, Any]]:
        docs = [
            _entry_doc(e, self.journal.get(e.id, {}))
            for e in sorted(self.ledger.entries, key=lambda e: (e.at, e.id))
            if e.action == action
        ]
        return docs + list(self.kept.get(action, []))

    def _ledger_json(self, action: str) -> str:
        return json.dumps(self._ledger_docs(action), sort_keys=True)

    def flush(self, now: float | None = None) -> None:
        """Write every ladder and ledger item that changed, each conditional on the version read.
        StoreFailure when one is refused (another pass wrote it: this one has lost the store)."""
        mu = _mu()
        store = self.store
        if now is not None:  # by age, but never a step a dead pass left unfinished (``pending``)
            keep = {
                e.id
                for e in self.ledger.entries
                if e.at > now - MAX_WINDOW_S or pending(self.journal.get(e.id))
            }
            self.ledger.entries = [e for e in self.ledger.entries if e.id in keep]
        try:
            for host in sorted(set(self.ladder.hosts) | set(self.written_ladders)):
                text = self._ladder_json(host)
                if self.written_ladders.get(host) == text or self.ladder_versions.get(host, 0) < 0:
                    continue
                version = self.ladder_versions.get(host)
                key = LADDER_PREFIX + host
                if host not in self.ladder.hosts:
                    if version:
                        store.call(store.backend.delete, key, version)
                        del self.ladder_versions[host]
                else:
                    doc = {"schema": LADDER_SCHEMA, "host": host, "rules": json.loads(text)}
                    self.ladder_versions[host] = store.call(store.backend.put, key, doc, version).version
                self.written_ladders[host] = text
            actions = {e.action for e in self.ledger.entries} | set(self.written_ledgers)
            for action in sorted(actions):
                text = self._ledger_json(action)
                if self.written_ledgers.get(action) == text or self.ledger_versions.get(action, 0) < 0:
                    continue
                doc = {"schema": LEDGER_SCHEMA, "action": action, "entries": self._ledger_docs(action)}
                version = self.ledger_versions.get(action)
                self.ledger_versions[action] = store.call(
                    store.backend.put, LEDGER_PREFIX + action, doc, version
                ).version
                self.written_ledgers[action] = text
        except mu.Conflict as exc:
            raise StoreFailure(
                f"the shared store changed under this pass ({exc}): another pass has taken over; "
                "this one starts nothing more"
            ) from None

    def mark_seeded(self, operator: str) -> None:
        # Conflict: another controller seeded it first (the same tags, merged the same way)
        with contextlib.suppress(_mu().Conflict):
            self.store.call(
                self.store.backend.put, SEEDED_KEY, {"operator": operator, "at": self.store.clock()}, None
            )
        self.seeded = True

    # ---- the journal: reserve before a batch, settle after, finish what a dead pass left

    def reserve(
        self,
        pass_id: str,
        action: str,
        picks: Iterable[tuple[str, str, str, int, str]],
        controller: str,
        now: float,
        instances: Mapping[str, tuple[str, str]] | None = None,
        records: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, str]:
        """Record ``action`` on each pick ``(host, group, rule, rung, check)`` as ``reserved`` by
        ``pass_id`` and write it before anything runs; {host: entry id}. ``instances``: host -> (EC2
        instance id, region), kept with the entry so a later pass can finish the action on an instance no
        inventory lists any more; ``records``: host -> what else a later pass needs to finish it (a
        replace: the instance's Auto Scaling group and its instances; a quarantine with evict: ``rerun``,
        the parameters to run it again with). StoreFailure: not reserved, so the batch must not start."""
        ids: dict[str, str] = {}
        for host, group, rule, rung, check in picks:
            entry = self.ledger.reserve(action, host, group, now, controller)
            journal: dict[str, Any] = {
                "state": RESERVED,
                "pass": pass_id,
                "rule": rule,
                "rung": rung,
                "check": check,
            }
            if instances and host in instances:
                journal["instance"], journal["region"] = instances[host]
            journal.update((records or {}).get(host) or {})
            self.journal[entry.id] = journal
            ids[host] = entry.id
        self.flush()
        return ids

    def restamp(self, entry_ids: Iterable[str], now: float) -> None:
        """Move the entries ``entry_ids`` to ``now`` and write them (a batch that starts later than it
        was reserved spends its budget from when it starts)."""
        ids = set(entry_ids)
        self.ledger.entries = [
            dataclasses.replace(e, at=now) if e.id in ids else e for e in self.ledger.entries
        ]
        self.flush()

    def settle(
        self,
        reserved: Mapping[str, str],
        attempted: Iterable[str],
        action: str,
        now: float,
        acted: Mapping[str, float] | None = None,
    ) -> None:
        """After the batch: each attempted host's entry is ``done``, spent from when its host was acted
        on (``acted``: host -> its batch's start; ``now`` where the run did not say), and its ladder
        records the rung (its clear time starts ``now``); a host not attempted gives its reservation back."""
        tried, when = set(attempted), dict(acted or {})
        gone, spent = set(), {}
        for host, entry_id in reserved.items():
            journal = self.journal.get(entry_id, {})
            if host in tried:
                journal["state"] = DONE
                spent[entry_id] = when.get(host, now)
                self.ladder.record(
                    host, str(journal["rule"]), str(journal["check"]), int(journal["rung"]), action, now
                )
            else:
                gone.add(entry_id)
                self.journal.pop(entry_id, None)
        self.ledger.settle(spent, now)
        self.ledger.release(gone)
        self.flush()

    def recover(self, pass_id: str, now: float | None = None) -> list[str]:
        """Entries another pass reserved and never settled (it died mid-batch): each counts as
        attempted (``in_doubt``), its ladder records the rung at the entry's time (unless the ladder has
        a later one), and its budget stays spent, from ``now`` when given (its host may have been acted
        on any time before: never counted from earlier than the act). One line each; written at once."""
        lines = []
        found: dict[str, float] = {}
        for e in sorted(self.ledger.entries, key=lambda e: (e.at, e.id)):
            journal = self.journal.get(e.id)
            if not journal or journal.get("state") != RESERVED or journal.get("pass") == pass_id:
                continue
            journal["state"] = IN_DOUBT
            found[e.id] = e.at if now is None else max(e.at, now)
            rule, check, rung = journal.get("rule"), journal.get("check"), journal.get("rung")
            if isinstance(rule, str) and isinstance(check, str) and isinstance(rung, int):
                current = self.ladder.get(e.host, rule)
                if current is None or current.last_tried < e.at:
                    self.ladder.record(e.host, rule, check, rung, e.action, e.at)
            lines.append(
                f"{e.host}: {e.action} reserved at {iso_utc(e.at)} by pass {journal.get('pass')} "
                f"({e.controller or '?'}), which ended before settling it: counted as attempted"
            )
        if lines:
            self.ledger.settle(found, max(found.values()))
            self.flush()
        return lines

    def busy(self, actions: Iterable[str], half_done: Iterable[str] = ()) -> dict[str, str]:
        """Hosts an action of ``actions`` is on now, as far as the store knows: host -> why. A ``reserved``
        entry is a batch running (or one a dead pass left, not yet found); an ``in_doubt`` entry of an
        action that can be left half done (``half_done``: a stop-start stopped and never started) that no
        pass has finished yet is still out. Counted by a rollout's capacity floor, whichever controller's
        pass took them."""
        wanted, left = set(actions), set(half_done)
        out: dict[str, str] = {}
        for e in sorted(self.ledger.entries, key=lambda e: (e.at, e.id)):
            journal = self.journal.get(e.id) or {}
            state = journal.get("state")
            stranded = state == IN_DOUBT and e.action in left and not journal.get("finished")
            if e.action not in wanted or not (state == RESERVED or stranded):
                continue
            out[e.host] = (
                f"{e.action} in a batch of {journal.get('pass') or 'a pass'}"
                if state == RESERVED
                else f"{e.action} left half done by {journal.get('pass') or 'a dead pass'}"
            )
        return out

    def reruns(self, unsettled: bool = False) -> list[tuple[LedgerEntry, dict[str, Any]]]:
        """The in-doubt entries reserved with the parameters to run them again (``rerun``), not yet
        finished: a dead pass may have cut their batch off (a drain). ``unsettled``: the ``reserved`` ones
        too (a dry run, which does not recover, shows what an applying pass would find)."""
        states = {IN_DOUBT, RESERVED} if unsettled else {IN_DOUBT}
        out = []
        for e in sorted(self.ledger.entries, key=lambda e: (e.at, e.id)):
            journal = self.journal.get(e.id) or {}
            if (
                journal.get("state") in states
                and isinstance(journal.get("rerun"), dict)
                and not journal.get("finished")
            ):
                out.append((e, journal))
        return out

    def unfinished(self, actions: Iterable[str]) -> list[tuple[LedgerEntry, dict[str, Any]]]:
        """The in-doubt entries of ``actions`` (those a pass can finish) on an EC2 instance, not yet
        finished: a dead pass may have left their instance half done."""
        wanted = set(actions)
        out = []
        for e in sorted(self.ledger.entries, key=lambda e: (e.at, e.id)):
            journal = self.journal.get(e.id) or {}
            if (
                e.action in wanted
                and journal.get("state") == IN_DOUBT
                and isinstance(journal.get("instance"), str)
                and not journal.get("finished")
            ):
                out.append((e, journal))
        return out
