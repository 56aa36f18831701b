"""What one ``remediate auto`` pass did: each action's run (:class:`ActionRun`) and the pass's
result (:class:`PassResult`), its document (``fleetops.auto/v1``) and its exit code."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetops.errors import FleetopsError
from fleetops.exitcodes import AUTO_FAIL_ON_DEFAULT, ExitCode
from fleetops.policy import (
    Decision,
)

AUTO_SCHEMA = "fleetops.auto/v1"
# A rollout ended by Ctrl-C, SIGTERM or SIGHUP: the pass starts no further action and exits with it.
SIGNAL_CODES = frozenset({ExitCode.INTERRUPTED, ExitCode.TERMINATED, ExitCode.HANGUP})

Say = Callable[[str, str], None]  # (text, style)


class PassLockedError(FleetopsError):
    """Another ``remediate auto`` pass holds this state directory."""

    exit_code = ExitCode.LOCKED


@dataclass(frozen=True)
class ActionRun:
    """What one action's rollout did: the hosts it attempted and the hosts it finished (verified)."""

    action: str
    hosts: tuple[str, ...]
    params: Mapping[str, Any]
    attempted: frozenset[str] = frozenset()
    done: frozenset[str] = frozenset()
    exit_code: ExitCode = ExitCode.OK
    error: str | None = None
    document: Mapping[str, Any] | None = None  # the rollout's report (fleetops.rollout.engine/v1)
    stop_requested: str | None = None  # the kill switch stopped the rollout: why (the pass ends too)
    # the remediation found nothing to do on these hosts (``fix``'s own scan: a protected unit, a fault
    # gone by then): the rung could not act; it counts as tried, so the ladder climbs after its clear time
    cannot_act: frozenset[str] = frozenset()
    # a host its action replaced (replace) -> its new instance (id, region): the spent tag goes there too,
    # as the old instance is gone and an inventory of running instances never lists it again
    replacements: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # host -> when it was acted on (its batch's start, the rollout's ``batches``): its budget is spent from
    # then; a host attempted but not here is counted from when the run returned (never earlier than the act)
    acted: Mapping[str, float] = field(default_factory=dict)


# (action, hosts, params) -> ActionRun; the API runs it through the rollout engine
RunAction = Callable[[str, Sequence[str], Mapping[str, Any]], ActionRun]


@dataclass
class PassResult:
    decisions: list[Decision]
    runs: list[ActionRun]
    apply: bool
    policy: str
    tag_writes: dict[str, str | None] = field(default_factory=dict)  # host -> new ladder tag (None: deleted)
    spent_writes: dict[str, str | None] = field(default_factory=dict)  # host -> new spent tag (None: deleted)
    # with apply, every EC2 host's two tags as this pass leaves them (written or already so)
    tags_after: dict[str, dict[str, str | None]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # hosts whose ladder or spent tag could not be written: another controller would not see what this
    # pass did there (the pass fails; the state directory has it)
    tag_failures: list[str] = field(default_factory=list)
    carried: dict[str, str] = field(default_factory=dict)  # new instance id -> the spent tag written on it
    # "host: tag key" of each tag that did not parse: never overwritten (what it holds may be another
    # controller's record), and the pass fails so that a person mends or deletes it
    malformed_tags: list[str] = field(default_factory=list)
    # with a shared store: where it is; why a batch was not started (pause, lease lost, store failed)
    store: str | None = None
    held: str | None = None
    paused: str | None = None  # the pause in force (fleetops pause): nothing acted from then on
    store_failure: str | None = None  # the store could not be read or written: nothing more acted
    recovered: list[str] = field(default_factory=list)  # a dead pass's reservations, counted as attempted
    malformed_store: list[str] = field(default_factory=list)  # store items that did not parse (kept)
    finished: list[str] = field(default_factory=list)  # actions a dead pass left half done, finished now
    unfinished: list[str] = field(default_factory=list)  # ... that could not be finished (the pass fails)
    would_finish: list[str] = field(default_factory=list)  # ... held by a pause: what would be finished
    # ... left unfinished too long: each needs a person (fleetops.journal.stranded's records)
    stranded: list[dict[str, Any]] = field(default_factory=list)
    # the groups a capacity floor judged: size, unavailable hosts and why, taken, kept, held back
    capacity: list[dict[str, Any]] = field(default_factory=list)
    # the storm brakes in force: rule -> {"why", "since", "new"} (new: tripped by this pass)
    brakes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the hosts the scan could not reach, and how many of them the policy lets a pass have without failing
    unreachable: list[str] = field(default_factory=list)
    unreachable_limit: int = 0
    # hosts whose node takes no new work (cordoned, drained, down) -> its state; backends not readable
    nodes_out: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_failures: list[str] = field(default_factory=list)
    # the fleet record (fleetops.auto.seen): what did not parse (kept; the pass fails), and per group the
    # hosts outside this pass it has no recent record of (their capacity unknown)
    malformed_record: list[str] = field(default_factory=list)
    unrecorded: dict[str, list[str]] = field(default_factory=dict)
    # a what-if (remediate auto --from FILE): the saved scan report decided against; nothing ran
    what_if: str | None = None
    # remediate auto --fail-on (fleetops.exitcodes.AUTO_FAIL_ON): "human" makes hosts that wait for a
    # person exit 1; "never" leaves them to the JSON, the audit log and the alerts (the pass did not fail)
    fail_on: str = AUTO_FAIL_ON_DEFAULT

    @property
    def waiting_for_person(self) -> list[str]:
        """The hosts that wait for a person: a ladder at its ``human`` rung or run out."""
        return sorted({d.host for d in self.decisions if d.status in ("human", "exhausted")})

    @property
    def tolerated(self) -> frozenset[str]:
        """The unreachable hosts that do not fail the pass: every one within the policy's share, else none."""
        if len(self.unreachable) <= self.unreachable_limit:
            return frozenset(self.unreachable)
        return frozenset()

    @property
    def exit_code(self) -> ExitCode:
        signalled = next((r.exit_code for r in self.runs if r.exit_code in SIGNAL_CODES), None)
        if signalled is not None:
            return signalled
        if (
            any(
                (d.status == "not_scanned" and d.host not in self.tolerated) or d.blind
                for d in self.decisions
            )
            or any(r.exit_code != ExitCode.OK or r.cannot_act for r in self.runs)
            or self.tag_failures
            or self.malformed_tags
            or self.store_failure
            or self.malformed_store
            or self.unfinished
            or self.node_failures
            or self.malformed_record
        ):
            return ExitCode.FAILED
        if self.paused is not None:
            return ExitCode.PAUSED
        if self.fail_on == "human" and (self.waiting_for_person or self.brakes):
            return ExitCode.FINDINGS  # a person must act: a ladder at its end, or a storm brake to lift
        return ExitCode.OK  # hosts may wait for a person: the pass did not fail (the document names them)

    def document(self) -> dict[str, Any]:
        doc = self._document()
        if self.tag_failures:  # absent when none: the documents of passes before it, unchanged
            doc["tag_failures"] = sorted(set(self.tag_failures))
        if self.carried:
            doc["spent_tags_carried"] = dict(self.carried)
        if self.malformed_tags:
            doc["malformed_tags"] = list(self.malformed_tags)
        if self.brakes:
            doc["brakes"] = {r: dict(b) for r, b in sorted(self.brakes.items())}
        if self.waiting_for_person or self.brakes:  # absent when none: the documents before it, unchanged
            doc["waiting_for_person"] = {
                "hosts": self.waiting_for_person,
                "brakes": sorted(self.brakes),
                "fail_on": self.fail_on,  # human: they made the exit code 1; never: they did not
            }
        if self.capacity:
            doc["capacity"] = [dict(c) for c in self.capacity]
        if self.nodes_out or self.node_failures:
            doc["nodes"] = {"out": dict(self.nodes_out), "failures": list(self.node_failures)}
        if self.malformed_record or self.unrecorded:
            doc["fleet_record"] = {
                "malformed": list(self.malformed_record),
                "unrecorded": dict(self.unrecorded),
            }
        if self.unreachable:
            doc["unreachable"] = {
                "hosts": list(self.unreachable),
                "limit": self.unreachable_limit,
                "tolerated": bool(self.tolerated),
            }
        if self.store is None and (self.finished or self.unfinished or self.would_finish or self.stranded):
            # without a store: what dead passes marked in flight on their instances (fleetops.auto.marks)
            doc["in_flight"] = {
                "finished": list(self.finished),
                "unfinished": list(self.unfinished),
                "would_finish": list(self.would_finish),
                "stranded": [dict(s) for s in self.stranded],
            }
        if self.store is not None:
            doc["store"] = {
                "where": self.store,
                "paused": self.paused,
                "failure": self.store_failure,
                "recovered": list(self.recovered),
                "finished": list(self.finished),
                "unfinished": list(self.unfinished),
                "malformed": list(self.malformed_store),
            }
            if self.would_finish:  # absent when none: the documents of passes before it, unchanged
                doc["store"]["would_finish"] = list(self.would_finish)
            if self.stranded:
                doc["store"]["stranded"] = [dict(s) for s in self.stranded]
        return doc

    def _document(self) -> dict[str, Any]:
        doc = self._pass_document()
        if self.what_if is not None:  # absent in a pass: the documents of passes before it, unchanged
            doc["what_if"] = {"from": self.what_if}
            for d in doc["decisions"]:
                if d.get("action"):
                    d["what_if"] = True
        return doc

    def _pass_document(self) -> dict[str, Any]:
        return {
            "schema": AUTO_SCHEMA,
            "apply": self.apply,
            "policy": self.policy,
            "decisions": [d.to_dict() for d in self.decisions],
            "actions": [
                {
                    "action": r.action,
                    "hosts": list(r.hosts),
                    "params": dict(r.params),
                    "done": sorted(r.done),
                    "attempted": sorted(r.attempted),
                    "exit_code": int(r.exit_code),
                    "error": r.error,
                    "rollout": r.document,
                }
                for r in self.runs
            ],
            "ladder_tags": dict(self.tag_writes),
            "spent_tags": dict(self.spent_writes),
            "warnings": list(self.warnings),
            "exit_code": int(self.exit_code),
        }
