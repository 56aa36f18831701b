"""What a dead pass left: the disruptive steps it left half done on EC2 instances (finished, through the
collection module's finisher) and the batches it cut off whose action is run again when in doubt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetops import journal as journal_mod
from fleetops.ansible.collection import load
from fleetops.auto.actions import action_params, freeze
from fleetops.auto.context import PassBase
from fleetops.auto.result import (
    SIGNAL_CODES,
)
from fleetops.fix import ACTIONABLE
from fleetops.policy import (
    Decision,
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
        result = self.result
        changed = False
        for entry, journal in state.unfinished(finishers):
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
                changed = True
                continue
            msg = ""
            if not isinstance(journal.get("new_instances"), list):
                regions = self.inputs.connection.regions
                record = {
                    **journal,
                    "region": journal.get("region") or (regions[0] if regions else "us-east-1"),
                    "at": entry.at,
                }
                module = load(f"plugins.modules.{finishers[entry.action]}")
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
                    changed = True
                    continue
                msg = str(done.get("msg", "done"))
                if done.get("new_instances"):
                    journal["new_instances"] = [str(i) for i in done["new_instances"]]
                    changed = True
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
                changed = True
                continue
            journal["finished"] = True
            changed = True
            if journal.get("new_instances"):
                msg = f"{msg + '; ' if msg else ''}{', '.join(journal['new_instances'])} scanned clean"
            line = f"{where}: finished the {entry.action} a dead pass left half done: {msg or 'done'}"
            result.finished.append(line)
            self.say(line, "bold")
        if changed:
            state.flush()
        for entry, _journal in state.unfinished(finishers):
            self.in_flight[entry.host] = f"{entry.action} left half done"

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
            if entry.get("status") != "ok":
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
