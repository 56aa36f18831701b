"""The state files of ``remediate auto`` and their lock: per host, where each ladder stands
(:class:`LadderState`, ``ladder.json``), and the budgeted actions taken (:class:`BudgetLedger`,
``ledger.json``).

Both are JSON (``fleetops.policy.ladder/v1``, ``fleetops.policy.ledger/v1``), written atomically,
0600; ``locked(path)`` loads one under an exclusive lock on a side file (:func:`file_lock`) and saves
it on a normal exit, so two controllers sharing the files never both spend the last of a budget.
Each also reads and writes its EC2 tag (``tag_value``, ``merge_tag``) through
:mod:`fleetops.policy.tags`. The ledger only records: budgets are counted against it in one place,
:class:`fleetops.policy.decide.Spending`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetops.documents import (  # the one-line DocumentError every document of fleetops uses
    DocumentError,
    raise_validation,
    read_json,
)
from fleetops.errors import FleetopsError
from fleetops.policy.language import MAX_WINDOW_S
from fleetops.policy.records import LedgerEntry, RungRecord
from fleetops.policy.tags import (
    CLOCK_SKEW_S,
    FROM_TAG,
    ladder_tag_value,
    parse_ladder_tag,
    parse_spent_tag,
    spent_tag_value,
)
from fleetops.schemas import MAX_EPOCH
from fleetops.util import atomic_write

LADDER_SCHEMA = "fleetops.policy.ladder/v1"
LEDGER_SCHEMA = "fleetops.policy.ledger/v1"
LOCK_TIMEOUT_S = 30.0


class StateError(FleetopsError):
    """A state file could not be locked in time."""


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive lock on ``.<name>.lock`` beside ``path`` (created 0600, never through a link),
    waited for at most ``timeout`` seconds."""
    lock = path.with_name(f".{path.name}.lock")
    os.makedirs(lock.parent, 0o700, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    raise StateError(
                        f"{path}: another controller holds its lock (waited {timeout:g} s)"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


class _StateDoc(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH)]


class _RungRecordDoc(_StateDoc):
    check: str
    rung: Annotated[int, Field(ge=0)]
    action: str
    first_tried: Epoch
    last_tried: Epoch
    tries: Annotated[int, Field(ge=1)] = 1
    quarantined: bool = False


class _LadderDoc(_StateDoc):
    model_config = ConfigDict(title=LADDER_SCHEMA)
    schema_: Literal["fleetops.policy.ladder/v1"] = Field(alias="schema")
    hosts: dict[str, dict[str, _RungRecordDoc]]


class _LedgerEntryDoc(_StateDoc):
    id: str
    action: str
    host: str
    group: str
    at: Epoch
    controller: str = ""
    reserved: bool = False


class _LedgerDoc(_StateDoc):
    model_config = ConfigDict(title=LEDGER_SCHEMA)
    schema_: Literal["fleetops.policy.ledger/v1"] = Field(alias="schema")
    entries: list[_LedgerEntryDoc]


def _validated(model: type[BaseModel], data: Any, source: str) -> None:
    if not isinstance(data, dict):
        raise DocumentError(
            source, f"not a {model.model_config.get('title')} document: a JSON object was expected"
        )
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise_validation(exc, source)


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


@dataclass
class LadderState:
    """Per host, per rule (a rule names one fault; its findings share one ladder): the rung tried."""

    hosts: dict[str, dict[str, RungRecord]] = field(default_factory=dict)

    def get(self, host: str, rule: str) -> RungRecord | None:
        return self.hosts.get(host, {}).get(rule)

    def rules(self, host: str) -> list[str]:
        return sorted(self.hosts.get(host, {}))

    def record(self, host: str, rule: str, check: str, rung: int, action: str, now: float) -> RungRecord:
        """Rung ``rung`` (``action``) of ``rule`` was taken on ``host`` at ``now``."""
        old = self.get(host, rule)
        rec = RungRecord(
            check=check,
            rung=rung,
            action=action,
            first_tried=old.first_tried if old is not None else now,
            last_tried=now,
            tries=old.tries + 1 if old is not None else 1,
            quarantined=(old is not None and old.quarantined) or action == "quarantine",
        )
        self.hosts.setdefault(host, {})[rule] = rec
        return rec

    def reset(self, host: str, rule: str) -> None:
        rules = self.hosts.get(host)
        if rules is not None:
            rules.pop(rule, None)
            if not rules:
                del self.hosts[host]

    def tag_value(self, host: str) -> str | None:
        """``host``'s ladders as the value of the EC2 tag ``TAG_KEY`` (at most 256 characters: the
        most recently tried first, what does not fit left out); None: no ladder (delete the tag).

        ``rule=rung:action:first_tried:last_tried:tries:quarantined:check`` joined by ``;``. Write it
        after every pass (and delete it when None) so another controller's ``merge_tag`` sees this one's."""
        return ladder_tag_value(self.hosts.get(host, {}))

    def merge_tag(self, host: str, value: str, source: str) -> None:
        """Take in the ladders a host's tag holds (``tag_value``'s format): per rule, the record
        tried last wins. DocumentError (one line, naming ``source``) when the value is not of it."""
        for rule, rec in parse_ladder_tag(value, source).items():
            mine = self.get(host, rule)
            if mine is None or rec.last_tried > mine.last_tried:
                self.hosts.setdefault(host, {})[rule] = rec

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": LADDER_SCHEMA,
            "hosts": {
                host: {rule: vars(rec).copy() for rule, rec in sorted(rules.items())}
                for host, rules in sorted(self.hosts.items())
            },
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> LadderState:
        _validated(_LadderDoc, data, source)
        return cls(
            hosts={
                host: {
                    rule: RungRecord(
                        check=r["check"],
                        rung=r["rung"],
                        action=r["action"],
                        first_tried=float(r["first_tried"]),
                        last_tried=float(r["last_tried"]),
                        tries=r.get("tries", 1),
                        quarantined=r.get("quarantined", False),
                    )
                    for rule, r in rules.items()
                }
                for host, rules in data["hosts"].items()
            }
        )

    @classmethod
    def load(cls, path: Path) -> LadderState:
        """The state at ``path``; an empty state when there is no file yet (the first pass)."""
        if not path.exists() and not path.is_symlink():
            return cls()
        return cls.from_json(read_json(path), str(path))

    def save(self, path: Path) -> None:
        atomic_write(path, _dump(self.to_json()), mode=0o600, mkdir=True)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[LadderState]:
        """Load under an exclusive lock, yield, save on a normal exit (not on an exception)."""
        with file_lock(path, timeout):
            state = cls.load(path)
            yield state
            state.save(path)


def controller_id() -> str:
    """``<hostname>:<pid>``: who took an action (ledger entries name it)."""
    return f"{os.uname().nodename}:{os.getpid()}"


@dataclass
class BudgetLedger:
    """The actions taken (when, on which host, in which group): what budgets are counted against."""

    entries: list[LedgerEntry] = field(default_factory=list)
    # record_once's index, (host, action) -> times: valid while `entries` is the list it was built from
    # (held here, so no other list can take its address) and has the length it had
    _times: dict[tuple[str, str], list[float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _indexed: tuple[list[LedgerEntry] | None, int] = field(
        default=(None, -1), init=False, repr=False, compare=False
    )

    def record(self, action: str, host: str, group: str, now: float, controller: str = "") -> LedgerEntry:
        entry = LedgerEntry(action=action, host=host, group=group, at=now, controller=controller)
        self.entries.append(entry)
        return entry

    def record_once(self, action: str, host: str, group: str, at: float, controller: str = "") -> bool:
        """``record`` unless the ledger already has ``action`` on ``host`` within a second of ``at``
        (the same action read back from an EC2 tag, whose times are whole seconds); True if recorded.
        O(1) per call: a pass merges every host's tags, and a fleet's thousands of entries made a
        scan of the whole ledger per entry quadratic (7,500 hosts: 5.6 s)."""
        if self._indexed[0] is not self.entries or self._indexed[1] != len(self.entries):
            self._times = {}
            for e in self.entries:
                self._times.setdefault((e.host, e.action), []).append(e.at)
        times = self._times.setdefault((host, action), [])
        if any(abs(t - at) < 1.0 for t in times):
            self._indexed = (self.entries, len(self.entries))
            return False
        self.record(action, host, group, at, controller)
        times.append(at)
        self._indexed = (self.entries, len(self.entries))
        return True

    def tag_value(self, host: str, windows: Mapping[str, float], now: float) -> str | None:
        """The actions taken on ``host`` that a budget still counts (``windows``: action -> its
        budget's window, seconds) as the value of the EC2 tag ``SPENT_TAG_KEY``: ``action:epoch``
        joined by ``;``, the most recent first, at most TAG_MAX characters (the oldest left out).
        None: nothing to carry (delete the tag). It outlives the host's ladder: a stop-start that
        cleared the fault resets the ladder, but spent the budget for the whole window."""
        return spent_tag_value(self.entries, host, windows, now)

    def merge_tag(self, host: str, group: str, value: str, source: str, now: float) -> int:
        """Count the actions a host's ``SPENT_TAG_KEY`` tag holds (``tag_value``'s format) that the
        ledger does not have yet (the same action on the same host within a second), in ``group``;
        returns how many were added. An entry up to CLOCK_SKEW_S ahead of ``now`` (another
        controller's clock) counts as taken now; one further ahead, or older than any window, is
        left out. DocumentError (one line, naming ``source``) when the value is not of the format:
        then nothing of it is counted."""
        added = 0
        for action, at in parse_spent_tag(value, source):
            if at > now + CLOCK_SKEW_S or now - at > MAX_WINDOW_S:
                continue
            added += self.record_once(action, host, group, min(at, now), controller=FROM_TAG)
        return added

    def reserve(self, action: str, host: str, group: str, now: float, controller: str = "") -> LedgerEntry:
        """``action`` on ``host`` before its batch starts: spent from now until ``settle`` or ``release``."""
        entry = LedgerEntry(
            action=action, host=host, group=group, at=now, controller=controller, reserved=True
        )
        self.entries.append(entry)
        return entry

    def settle(self, acted: Mapping[str, float], now: float) -> None:
        """The reserved entries ``acted`` names (entry id -> when its host was acted on: its batch's
        start) are spent from then, no later than ``now``: a budget's window counts from the act."""
        self.entries = [
            replace(e, at=min(acted[e.id], now), reserved=False) if e.id in acted and e.reserved else e
            for e in self.entries
        ]

    def release(self, entry_ids: Collection[str]) -> None:
        """Give back the reservations ``entry_ids`` (their hosts were not acted on)."""
        self.entries = [e for e in self.entries if not (e.reserved and e.id in entry_ids)]

    def prune(self, now: float, keep: float = MAX_WINDOW_S) -> None:
        """Forget entries older than any budget window (never one still reserved)."""
        self.entries = [e for e in self.entries if e.reserved or e.at > now - keep]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": LEDGER_SCHEMA,
            "entries": [
                {k: v for k, v in vars(e).items() if k != "reserved" or v}  # written only while reserved
                for e in sorted(self.entries, key=lambda e: e.at)
            ],
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> BudgetLedger:
        _validated(_LedgerDoc, data, source)
        return cls(
            entries=[
                LedgerEntry(
                    action=e["action"],
                    host=e["host"],
                    group=e["group"],
                    at=float(e["at"]),
                    controller=e.get("controller", ""),
                    id=e["id"],
                    reserved=e.get("reserved", False),
                )
                for e in data["entries"]
            ]
        )

    @classmethod
    def load(cls, path: Path) -> BudgetLedger:
        """The ledger at ``path``; an empty one when there is no file yet."""
        if not path.exists() and not path.is_symlink():
            return cls()
        return cls.from_json(read_json(path), str(path))

    def save(self, path: Path, now: float | None = None) -> None:
        """Write the ledger (entries older than the longest window dropped when ``now`` is given)."""
        if now is not None:
            self.prune(now)
        atomic_write(path, _dump(self.to_json()), mode=0o600, mkdir=True)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[BudgetLedger]:
        """Load under an exclusive lock, yield, save on a normal exit (not on an exception): decide
        and record inside it, so two controllers never spend the same budget."""
        with file_lock(path, timeout):
            ledger = cls.load(path)
            yield ledger
            ledger.save(path)
