"""What a dead pass left: the disruptive steps it left half done on EC2 instances (finished, through the
collection module's finisher) and the batches it cut off whose action is run again when in doubt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetops import journal as journal_mod
from fleetops.ansible import facts
from fleetops.ansible.collection import load, module_utils
from fleetops.auto.actions import action_params, freeze
from fleetops.auto.context import PassBase
from fleetops.auto.marks import FIELDS, IN_FLIGHT_TAG, InFlightMarks, Mark, encode
from fleetops.auto.result import (
    SIGNAL_CODES,
)
from fleetops.fix import ACTIONABLE
from fleetops.policy import (
    NO_GROUP,
    BudgetLedger,
    Decision,
    LadderState,
    LedgerEntry,
)
from fleetops.remediations import REMEDIATIONS
from fleetops.store import RESERVED, PassLease, StoredState, StoreFailure


def in_flight_modules() -> dict[str, str]:
    """Each action a pass can finish for a dead one -> its collection module (``Remediation.in_flight``)."""
    return {name: r.in_flight for name, r in REMEDIATIONS.items() if r.in_flight}


class Finishers(PassBase):
    """What a pass finishes for the passes before it (see :mod:`fleetops.auto`)."""

    def not_finished(
        self, entry: LedgerEntry, journal: dict[str, Any], where: str, why: str, next_: str = ""
    ) -> None:
        """A record this pass could not finish: the pass fails (exit 3), the attempt and its cause are
        kept in the journal, and one left too long is reported as needing a person (``journal.stranded``)."""
        self.result.unfinished.append(where)
        self.warn(f"{where}: {why}{next_}")
        journal_mod.failed_attempt(journal, why)
        self.report_stranded(entry, journal)

    def report_stranded(self, entry: LedgerEntry, journal: dict[str, Any]) -> None:
        now = self.clock()
        record = journal_mod.stranded(entry, journal, now)
        if record is not None:
            self.result.stranded.append(record)
            self.warn(journal_mod.stranded_line(record, now))

    def hold_in_flight(self, state: StoredState) -> None:
        """While automation is paused: finish nothing a dead pass left in flight (its stopped instance stays
        stopped; a person paused to keep the fleet as it is), say what would be finished, and count each
        host against its group's floor as unfinished."""
        for entry, journal in state.unfinished(in_flight_modules()):
            line = (
                f"{entry.host} ({journal['instance']}): the {entry.action} a dead pass left half done would be "
                "finished once automation is unpaused"
            )
            self.result.would_finish.append(line)
            self.say(line, "warning")
            self.report_stranded(entry, journal)
            self.in_flight[entry.host] = f"{entry.action} left half done"

    def finish_in_flight(self, state: StoredState) -> None:
        """Finish every action a dead pass left half done on an EC2 instance (``Remediation.in_flight``: a
        stop-start stopped and never started, a replace whose group may still be launching), through the
        collection module's ``finish_instance`` — whether or not the inventory still lists the instance. A
        finisher that names new instances (a replace's) finishes only once this pass's scan has each of
        them clean; until then the journal keeps them. One that cannot be finished now fails the pass
        (exit 3) and is tried again by the next."""
        finishers = in_flight_modules()
        changed = False
        for entry, journal in state.unfinished(finishers):
            self.finish_one(entry, journal, finishers[entry.action])
            changed = True
        if changed:
            state.flush()
        for entry, _journal in state.unfinished(finishers):
            self.in_flight[entry.host] = f"{entry.action} left half done"

    def finish_one(self, entry: LedgerEntry, journal: dict[str, Any], finisher: str) -> bool:
        """Finish one record a dead pass left (``journal``: its instance, region and what the finisher
        needs; updated in place: ``finished``, ``new_instances``, the failed attempts). Whether it is
        finished; one that is not fails the pass (exit 3) and is tried again by the next."""
        result = self.result
        instance = str(journal["instance"])
        where = f"{entry.host} ({instance})"
        if self.inputs.connection is None:
            self.not_finished(
                entry,
                journal,
                where,
                f"the {entry.action} a dead pass left may be half done, and this inventory has no EC2 "
                "source to finish it with",
            )
            return False
        msg = ""
        if not isinstance(journal.get("new_instances"), list):
            regions = self.inputs.connection.regions
            record = {
                **journal,
                "region": journal.get("region") or (regions[0] if regions else "us-east-1"),
                "at": entry.at,
            }
            module = load(f"plugins.modules.{finisher}")
            try:
                done = module.finish_instance(self.inputs.connection.settings(), record)
            except Exception as exc:
                self.not_finished(
                    entry,
                    journal,
                    where,
                    f"failed to finish the {entry.action} a dead pass left: {exc}",
                    "; the next pass tries again",
                )
                return False
            msg = str(done.get("msg", "done"))
            if done.get("new_instances"):
                journal["new_instances"] = [str(i) for i in done["new_instances"]]
        why = self.not_scanned_clean(journal.get("new_instances") or [])
        if why is not None:
            told = f": {msg}; it" if msg else ""
            self.not_finished(
                entry,
                journal,
                where,
                f"the {entry.action} a dead pass left{told} is not finished: {why}",
                "; the next pass looks again",
            )
            return False
        journal["finished"] = True
        if journal.get("new_instances"):
            msg = f"{msg + '; ' if msg else ''}{', '.join(journal['new_instances'])} scanned clean"
        line = f"{where}: finished the {entry.action} a dead pass left half done: {msg or 'done'}"
        result.finished.append(line)
        self.say(line, "bold")
        self.release_dead_leases(where, instance, str(journal.get("region") or ""))
        return True

    def release_dead_leases(self, where: str, instance: str, region: str) -> None:
        """With a shared store: release the lease a dead rollout (the dead pass's) still holds on the
        instance just finished (``journal.release_dead``), so that a controller reading the tags alone
        is not refused it until the lease expires. One that cannot be released is told; it expires on
        its own."""
        shared, connection = self.inputs.store, self.inputs.connection
        if shared is None or connection is None:
            return
        region = region or (connection.regions[0] if connection.regions else "us-east-1")
        tags = module_utils("lease").Ec2Tags(connection.settings(), {instance: region}, "fleetops.auto")
        try:
            for line in journal_mod.release_dead(shared, tags, instance, self.clock()):
                self.say(f"{where}: {line}", "dim")
        except (StoreFailure, module_utils("aws").AwsError) as exc:  # it stays until it expires
            self.warn(
                f"{where}: could not release a dead rollout's lease on it (it expires on its own): {exc}"
            )

    def not_scanned_clean(self, instances: Sequence[str]) -> str | None:
        """Why this pass's scan does not show each of ``instances`` (EC2 ids) answering with no warning or
        critical finding (None: it does), the replace gate's test."""
        host_of = {t.instance: h for h, t in {**self.inputs.fleet_tags, **self.inputs.tags}.items()}
        scanned = self.inputs.scan_report.get("hosts") or {}
        for iid in instances:
            host = host_of.get(iid)
            entry = scanned.get(host) if host is not None else None
            if not isinstance(entry, Mapping):
                return (
                    f"its new instance {iid} is not in this pass's scan (not yet in the inventory, or outside "
                    "its limit)"
                )
            if not facts.answered(entry):
                status = entry.get("status") or "not scanned"
                return f"its new instance {iid} ({host}) is {status} in this pass's scan"
            bad = [
                str(f.get("summary") or f.get("check"))
                for f in entry.get("findings") or []
                if isinstance(f, Mapping) and f.get("severity") in ACTIONABLE
            ]
            if bad:
                return f"this pass's scan of its new instance {iid} ({host}) finds: {'; '.join(bad)}"
        return None

    def in_flight_records(self, action: str, instances: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
        """host -> what a later pass needs to finish ``action`` on it should this pass die mid-batch (its
        ``Remediation.in_flight`` module's ``in_flight_record``, read from EC2 before the batch starts)."""
        finisher = REMEDIATIONS[action].in_flight if action in REMEDIATIONS else None
        if finisher is None or self.inputs.connection is None or not instances:
            return {}
        module = load(f"plugins.modules.{finisher}")
        settings = self.inputs.connection.settings()
        return {
            host: module.in_flight_record(settings, region, instance)
            for host, (instance, region) in instances.items()
        }

    def rerun_records(self, action: str, decisions: Sequence[Decision]) -> dict[str, dict[str, Any]]:
        """host -> ``{"rerun": params}`` for each of ``decisions`` whose parameters turn on ``action``'s
        ``Remediation.rerun_in_doubt`` (a quarantine with evict): what a later pass runs again should this
        pass die mid-batch. The rung's own parameters and the finding's; the operator's per-action ones
        (kubectl, kubeconfig) are the later pass's own."""
        flag = REMEDIATIONS[action].rerun_in_doubt if action in REMEDIATIONS else None
        if flag is None:
            return {}
        return {
            d.host: {"rerun": action_params(d, {})}
            for d in decisions
            if action_params(d, self.inputs.extra_params).get(flag)
        }

    def rerun_in_doubt(self, state: StoredState, lease: PassLease | None, paused: bool) -> bool:
        """Run again each action whose batch a dead pass cut off with its ``Remediation.rerun_in_doubt`` on
        (a quarantine with evict: the node cordoned, its work maybe still running), with the parameters it
        was reserved with, through ``run_action`` (the rollout, locks, lease and backend hooks every action
        takes), on its host whether or not this pass's selection has it. The same attempt: no budget is
        spent, no ladder climbs. Done: the entry is finished. Not done, or the host no longer in the
        inventory: the pass fails (exit 3) and the next tries again. A dry run, or a pause, runs nothing
        and says what would run. False when the pass must act no further (a signal, the kill switch, the
        store or its lease lost)."""
        inputs, result = self.inputs, self.result

        def named(action: str) -> str:  # "quarantine (evict)"
            flag = REMEDIATIONS[action].rerun_in_doubt if action in REMEDIATIONS else None
            return f"{action} ({flag})" if flag else action

        groups: dict[tuple[str, Any], tuple[dict[str, Any], list[tuple[LedgerEntry, dict[str, Any]]]]] = {}
        for entry, journal in state.reruns(unsettled=not inputs.apply):
            remediation = REMEDIATIONS.get(entry.action)
            what = f"the {named(entry.action)} pass {journal.get('pass') or '?'} cut off"
            if remediation is None or entry.host not in self.fleet:
                why = "no such remediation" if remediation is None else "the host is not in the inventory"
                result.unfinished.append(entry.host)
                self.warn(f"{entry.host}: {what} cannot be run again: {why}; the next pass looks again")
                continue
            if not inputs.apply or paused:
                unsettled = (
                    " (if that pass is dead: its entry is not settled)"
                    if journal.get("state") == RESERVED
                    else ""
                )
                line = f"{entry.host}: {what} would be run again{unsettled}" + (
                    " once automation is unpaused" if paused else " (dry run)"
                )
                if paused:
                    result.would_finish.append(line)
                self.say(line, "warning")
                continue
            params = {k: v for k, v in inputs.extra_params.get(entry.action, {}).items()}
            params.update(journal["rerun"])
            params = {k: v for k, v in params.items() if k in remediation.params}
            group = groups.setdefault((entry.action, freeze(params)), (params, []))
            group[1].append((entry, journal))
        for (action, _key), (params, entries) in groups.items():
            if lease is not None and lease.lost is not None:
                result.store_failure = f"the shared store's lease was lost: {lease.lost}"
                self.warn(f"{action} not run again: {result.store_failure}")
                return False
            hosts = sorted({e.host for e, _j in entries})
            self.say(
                f"{named(action)} again on {len(hosts)} host(s) a dead pass cut off: {' '.join(hosts)}",
                "bold",
            )
            run = self.run_or_fail(action, hosts, params)
            result.runs.append(run)
            for entry, journal in entries:
                if entry.host in run.done:
                    journal["finished"] = True
                    line = f"{entry.host}: ran the {named(action)} a dead pass cut off again: done"
                    result.finished.append(line)
                    self.say(line, "bold")
                else:
                    result.unfinished.append(entry.host)
                    told = f": {run.error}" if run.error else ""
                    self.warn(
                        f"{entry.host}: the {named(action)} a dead pass cut off, run again, did not finish"
                        f"{told}; the next pass tries again"
                    )
            try:
                state.flush()
            except StoreFailure as exc:
                result.store_failure = str(exc)
                self.warn(str(exc))
                return False
            if run.exit_code in SIGNAL_CODES or run.stop_requested is not None:
                why = run.stop_requested or run.exit_code.name.lower()
                self.say(f"{action}: {why}; the pass starts no further action", "warning")
                return False
        return True


class MarkedFinishers(Finishers):
    """Without a shared store: the in-flight marks on the instances (:mod:`fleetops.auto.marks`), written
    around each disruptive batch and finished, by a later pass, with the store path's finishers."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.marked: dict[str, Mark] = {}  # host -> this pass's mark on its instance (the batch running)

    def marks(self) -> InFlightMarks | None:
        return InFlightMarks(self.inputs.connection) if self.inputs.connection is not None else None

    def mark_batch(self, pass_id: str, action: str, decisions: Sequence[Decision]) -> str | None:
        """Mark each instance of the batch before its first disruptive call (an action with a finisher,
        ``Remediation.in_flight``); why the batch must not start (a mark not written: a later pass could
        not find it), or None. Marks already written for the batch are removed on failure."""
        inputs = self.inputs
        if not inputs.apply or action not in in_flight_modules():
            return None
        api = self.marks()
        if api is None:
            return None
        by_host = {d.host: d for d in decisions if d.host in inputs.tags}
        instances = {h: (inputs.tags[h].instance, inputs.tags[h].region) for h in by_host}
        try:  # no in-flight record, no disruptive call: a later pass could not finish it
            records = self.in_flight_records(action, instances)
        except Exception as exc:
            why = f"{action}: could not read what a later pass would need to finish it: {exc}"
            self.result.tag_failures.append(why)
            return why
        for host, d in sorted(by_host.items()):
            instance, region = instances[host]
            record = {
                "host": host,
                "action": action,
                "pass": pass_id,
                "at": round(self.clock(), 3),
                "rule": d.rule or "",
                "rung": d.rung or 0,
                "check": d.check or "",
                **(records.get(host) or {}),
            }
            try:
                api.write(instance, region, record)
            except Exception as exc:
                why = f"{host}: Failed to write its tag {IN_FLIGHT_TAG} ({instance}): {exc}"
                self.result.tag_failures.append(why)
                self.unmark_batch()
                return f"{why}; the {action} does not start"
            self.marked[host] = Mark(instance, region, record, tuple(sorted(encode(record))))
        return None

    def unmark_batch(self) -> None:
        """The batch settled (as the store path settles its reservations): its marks are removed. One
        not removed is told (exit 3); the next pass finds its instance finished and removes it."""
        marked, self.marked = self.marked, {}
        api = self.marks() if marked else None
        if api is None:
            return
        for host, mark in sorted(marked.items()):
            try:
                api.remove(mark.instance, mark.region, mark.keys)
            except Exception as exc:
                line = f"{host}: Failed to remove its tag {IN_FLIGHT_TAG} ({mark.instance}): {exc}"
                self.result.tag_failures.append(line)
                self.warn(line)

    def finish_marked(self, ladder: LadderState, ledger: BudgetLedger, act: bool) -> None:
        """Find every instance a dead pass marked in flight (one filtered Describe call per region,
        whatever the inventory's filters) and finish it as the store path does (:meth:`finish_one`); its
        rung counts as attempted and its budget as spent (``StoredState.recover``). Finished: the mark
        is removed; not: it keeps the failed attempts and their cause, the pass fails (exit 3) and the
        host counts against its group's floor. ``act`` False (paused): nothing is finished, the pass
        says what would be."""
        api = self.marks()
        if api is None:
            return
        try:
            found, bad = api.find()
        except Exception as exc:
            line = f"could not look for the instances a dead pass marked (tag {IN_FLIGHT_TAG}): {exc}"
            self.result.unfinished.append(line)
            self.warn(line)
            return
        for line in bad:
            self.result.malformed_tags.append(line)
            self.warn(line)
        finishers = in_flight_modules()
        for mark in found:
            rec = mark.record
            host, action = str(rec["host"]), str(rec["action"])
            group = self.group_of(host) or NO_GROUP
            entry = LedgerEntry(action, host, group, float(rec["at"]), id=str(rec["pass"]))
            rule, check, rung = rec.get("rule"), rec.get("check"), rec.get("rung")
            if isinstance(rule, str) and rule and isinstance(check, str) and isinstance(rung, int):
                current = ladder.get(host, rule)
                if current is None or current.last_tried < entry.at:
                    ladder.record(host, rule, check, rung, action, entry.at)
            ledger.record_once(action, host, group, entry.at)
            journal = {k: v for k, v in rec.items() if k not in FIELDS}
            journal.update(instance=mark.instance, region=mark.region)
            where = f"{host} ({mark.instance})"
            if not act:
                line = (
                    f"{where}: the {action} a dead pass left half done would be finished once automation "
                    "is unpaused"
                )
                self.result.would_finish.append(line)
                self.say(line, "warning")
                self.report_stranded(entry, journal)
                self.in_flight[host] = f"{action} left half done"
                continue
            if action in finishers:
                done = self.finish_one(entry, journal, finishers[action])
            else:
                done = False
                self.not_finished(
                    entry, journal, where, f"its tag {IN_FLIGHT_TAG} names {action}, which no pass finishes"
                )
            kept: dict[str, Any] = {
                k: journal[k] for k in ("attempts", "cause", "new_instances") if k in journal
            }
            try:
                if done:
                    api.remove(mark.instance, mark.region, mark.keys)
                else:
                    api.write(mark.instance, mark.region, {**rec, **kept}, old=mark.keys)
            except Exception as exc:
                line = f"{host}: Failed to {'remove' if done else 'write'} its tag {IN_FLIGHT_TAG} ({mark.instance}): {exc}"
                self.result.tag_failures.append(line)
                self.warn(line)
            if not done:
                self.in_flight[host] = f"{action} left half done"
