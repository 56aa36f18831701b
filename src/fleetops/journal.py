"""The shared store's journal, kept honest: what it never forgets, when a step left unfinished needs a
person, how a person closes it, and the sweep of the rollouts' stale lease items.

- A journal record a later pass must still finish (``store.pending``: a stop-start's stopped instance, a
  replace not done, a drain to run again) is never pruned by age; it leaves when a pass finishes it or a
  person closes it.
- A step still unfinished ``STRANDED_AFTER_S`` after the dead pass reserved it, that a pass has tried and
  failed to finish, is **stranded**: the pass reports it as needing a person (``store.stranded`` in its
  document, the ``fleetops_auto_stranded`` gauge, alert ``FleetopsAutoStranded``) with the cause of its
  last failed attempt; its host still counts against its group's floor.
- ``fleetops store forget ENTRY --reason TEXT`` (:func:`forget`) closes a record a person has handled:
  marked finished and forgotten (who, why, when), audited in the store. An unknown or already closed
  entry is a usage error (exit 2).
- :func:`release_dead`, when a pass has finished what a dead pass left on an instance: the lease the
  dead pass's rollout still holds on that instance (its ``lease#`` item and its ``fleetops:lease:<rollout>``
  mirror tag) is released, so that a controller reading the tags alone is not refused the instance until
  the lease expires; only a rollout the store's own rules say is dead (its item expired, or its process on
  this controller gone: ``plan_store_take``), never a live one's.
- :func:`sweep`, during every applying pass and ``fleetops store status``: the ``rollout#`` items of
  rollouts whose lease expired more than ``SWEEP_AFTER_S`` ago, and the ``lease#`` items of rollouts that
  are gone, are deleted, each conditional on the version read (a rollout renewing or taking meanwhile
  keeps its item).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from fleetops.ansible.collection import module_utils
from fleetops.errors import UsageError
from fleetops.policy import LedgerEntry, fmt_duration
from fleetops.store import Store, StoredState, pending
from fleetops.util import dead_here

# An hour: four of the schedule's 15-minute passes (or a burst of alert passes) have had their chance
# to finish the step; then it is a person's.
STRANDED_AFTER_S = 3600.0
# A day: a rollout lease expired this long ago belongs to a controller that is not coming back for it.
SWEEP_AFTER_S = 86400.0
CAUSE_MAX = 200  # the cause kept in the journal and shown in the alert


class UnknownEntry(UsageError):
    """``fleetops store forget`` names no open journal record."""


def failed_attempt(journal: dict[str, Any], cause: str) -> None:
    """Count a pass's failed attempt to finish the record, and why (kept in the journal)."""
    journal["attempts"] = int(journal.get("attempts") or 0) + 1
    journal["cause"] = cause[:CAUSE_MAX]


def stranded(entry: LedgerEntry, journal: Mapping[str, Any], now: float) -> dict[str, Any] | None:
    """The stranded record (host, entry, action, instance, since, attempts, cause) or None: still
    pending ``STRANDED_AFTER_S`` after it was reserved, with at least one failed attempt to finish it."""
    if not pending(journal) or not journal.get("attempts") or now - entry.at < STRANDED_AFTER_S:
        return None
    return {
        "host": entry.host,
        "entry": entry.id,
        "action": entry.action,
        "instance": str(journal.get("instance") or ""),
        "since": entry.at,
        "attempts": int(journal["attempts"]),
        "cause": str(journal.get("cause") or ""),
    }


def stranded_line(record: Mapping[str, Any], now: float) -> str:
    where = f"{record['host']} ({record['instance']})" if record["instance"] else str(record["host"])
    return (
        f"{where}: the {record['action']} a dead pass left is still not finished "
        f"{fmt_duration(int(now - record['since']))} later ({record['attempts']} failed attempt(s): "
        f"{record['cause']}): it needs a person, and counts against its group's floor until then; once "
        f"handled, 'fleetops store forget {record['entry']} --reason TEXT' closes it"
    )


def open_records(shared: Store) -> list[str]:
    """One line per journal record a later pass must still finish (for ``fleetops store status``)."""
    state = StoredState(shared)
    state.load()
    now = shared.clock()
    lines = []
    for e in sorted(state.ledger.entries, key=lambda e: (e.at, e.id)):
        journal = state.journal.get(e.id)
        if not pending(journal):
            continue
        assert journal is not None
        on = f" ({journal['instance']})" if isinstance(journal.get("instance"), str) else ""
        tried = (
            f"; {journal['attempts']} failed attempt(s): {journal.get('cause')}"
            if journal.get("attempts")
            else ""
        )
        lines.append(
            f"unfinished: entry {e.id}: {e.action} on {e.host}{on}, {journal.get('state')} since "
            f"{fmt_duration(int(now - e.at))} ago{tried}"
        )
    return lines


def forget(shared: Store, entry_id: str, operator: str, reason: str) -> str:
    """Close the open journal record ``entry_id`` (a person finished or undid the step): finished, with
    who, why and when, written conditionally and audited. UnknownEntry (exit 2) when no open record has
    that id."""
    state = StoredState(shared)
    state.load()
    entry = next((e for e in state.ledger.entries if e.id == entry_id), None)
    journal = state.journal.get(entry_id) if entry is not None else None
    if entry is None or journal is None or not pending(journal):
        raise UnknownEntry(
            f"{entry_id}: no unfinished journal record has this id in {shared.where()} "
            "('fleetops store status' lists them); nothing was done"
        )
    now = shared.clock()
    journal["finished"] = True
    journal["forgotten"] = {"operator": operator, "reason": reason, "at": now}
    state.flush()
    shared.audit(
        "forget",
        operator,
        entry=entry_id,
        host=entry.host,
        action=entry.action,
        instance=journal.get("instance"),
        reason=reason,
    )
    return f"entry {entry_id} ({entry.action} on {entry.host}) closed by {operator}: {reason}"


def sweep(shared: Store, now: float) -> list[str]:
    """Delete the ``rollout#`` items expired more than ``SWEEP_AFTER_S`` ago and the ``lease#`` items of
    rollouts that are gone, each conditional on the version read; one line per rollout swept, one for
    the instance items. The lease items are read first: one that names a rollout read then had that
    rollout's item (a take writes both in one transaction), so it is left over only if the rollout is
    gone by the second read."""
    lease, mu = module_utils("lease"), module_utils("store")
    backend = shared.backend
    instances = shared.call(backend.items, lease.INSTANCE_ITEM)
    rollouts = shared.call(backend.items, lease.ROLLOUT_ITEM)
    lines, kept = [], set()
    for item in rollouts:
        rid = item.key[len(lease.ROLLOUT_ITEM) :]
        record = lease.rollout_record(rid, item)
        if record.expires >= now - SWEEP_AFTER_S:  # live, recent, or unreadable (never expires)
            kept.add(rid)
            continue
        with contextlib.suppress(mu.Conflict):
            shared.call(backend.delete, item.key, item.version)
            lines.append(
                f"swept the store's item of rollout {rid} ({record.operator}), its lease expired "
                f"{fmt_duration(int(now - record.expires))} ago"
            )
            continue
        kept.add(rid)
    left = 0
    for item in instances:
        holder = lease.holder_of(item)
        if holder is None or holder in kept:  # unreadable: a person breaks it (--break-lock)
            continue
        with contextlib.suppress(mu.Conflict):
            shared.call(backend.delete, item.key, item.version)
            left += 1
    if left:
        lines.append(f"swept {left} instance lease item(s) of rollouts that are gone")
    return lines


def release_dead(
    shared: Store, tags: Any, instance: str, now: float, dead: Callable[[object], bool] = dead_here
) -> list[str]:
    """Release, on ``instance`` alone, the lease of the rollout that holds it (its ``lease#`` item) when
    the store's own rules say that rollout is dead: its ``rollout#`` item expired, or it names a process
    of this controller that is gone (``dead``: fleetops.util.dead_here; module_utils/lease.py's
    ``plan_store_take`` breaks it on the same grounds). Its mirror tag goes where it still has the value
    read (``tags``: module_utils/lease.py's Ec2Tags over the instance, read only then; None: no mirror),
    then its ``lease#`` item, then its ``rollout#`` item once no other instance is held by it, each
    conditional on the version read. A live rollout's lease, an unreadable one, a ``lease#`` item whose
    rollout is gone (free to any taker) and a tag of a rollout the store does not know (a controller of
    tags alone) are left as they are. The lines said (one, or none). StoreFailure, or aws.AwsError from
    the tags, when a call fails."""
    lease, mu = module_utils("lease"), module_utils("store")
    backend = shared.backend
    item = shared.call(backend.get, lease.INSTANCE_ITEM + instance)
    holder = lease.holder_of(item) if item is not None else None
    theirs = shared.call(backend.get, lease.ROLLOUT_ITEM + holder) if holder is not None else None
    if item is None or holder is None or theirs is None:
        return []
    record = lease.rollout_record(holder, theirs)
    doc = theirs.doc if isinstance(theirs.doc, dict) else {}
    if record.live(now) and not dead(doc.get("controller")):
        return []
    if tags is not None:
        tagged = tags.read().get(instance, {}).get(holder)
        if tagged is not None:
            tags.delete([instance], lease.KEY_PREFIX + holder, tagged.value)
    with contextlib.suppress(mu.Conflict):  # taken meanwhile: the taker's now
        shared.call(backend.delete, item.key, item.version)
    if not any(lease.holder_of(i) == holder for i in shared.call(backend.items, lease.INSTANCE_ITEM)):
        with contextlib.suppress(mu.Conflict):  # renewed or taken meanwhile: left as it is
            shared.call(backend.delete, theirs.key, theirs.version)
    why = "its process on this controller is gone" if record.live(now) else "its lease had expired"
    return [f"released the lease of rollout {holder} ({record.operator}) on {instance}: {why}"]
