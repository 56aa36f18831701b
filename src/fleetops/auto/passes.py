"""The pass itself: :func:`run_pass` decides and acts, with the state directory or the shared store."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetops import journal
from fleetops.auto import seen as seen_mod
from fleetops.auto.actions import batches, check_policy_actions
from fleetops.auto.context import After, Before, PassInputs
from fleetops.auto.finish import MarkedFinishers
from fleetops.auto.guards import Guards
from fleetops.auto.result import (
    SIGNAL_CODES,
    ActionRun,
    PassResult,
    RunAction,
    Say,
)
from fleetops.auto.state import (
    BRAKES_FILE,
    LADDER_FILE,
    LEDGER_FILE,
    load_brakes,
    load_state,
    save_brakes,
    state_locks,
)
from fleetops.policy import (
    HUMAN,
    BudgetLedger,
    Decision,
    LadderState,
    commit,
    controller_id,
    decide,
)
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.pause import PauseRecord, local_pause
from fleetops.store import PassLease, Store, StoredState, StoreFailure

# a reservation that took longer than this is stamped again before its batch starts (the window runs from
# each host's act once settled; until then the reservation counts as spent whatever its time)
RESTAMP_S = 10.0


def new_pass_id(clock: Callable[[], float]) -> str:
    return f"auto-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(clock()))}-{secrets.token_hex(3)}"


def disruptive_actions(inputs: PassInputs, every: bool = False) -> list[str]:
    """The disruptive actions the policy's ladders name (``Remediation.disruptive``); ``every``: all of
    them, named or not (another pass's policy may name others)."""
    named = (
        set(REMEDIATIONS)
        if every
        else {str(rung.action) for rule in inputs.policy.rules for rung in rule.ladder}
    )
    return sorted(a for a in named if a in REMEDIATIONS and REMEDIATIONS[a].disruptive)


def paused(store: Store | None) -> PauseRecord | None:
    """The pause in force: this controller's (``fleetops pause`` without a store) first, then the
    shared store's."""
    return local_pause() or (store.paused() if store is not None else None)


def spend_unsettled(ledger: BudgetLedger, now: float) -> list[str]:
    """The state directory's reservations no pass settled (a pass killed mid-batch, a run that raised):
    spent from ``now``, as their hosts may have been acted on any time before. One line each."""
    left = {e.id: e for e in ledger.entries if e.reserved}
    ledger.settle(dict.fromkeys(left, now), now)
    return [
        f"{e.host}: {e.action} reserved at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(e.at))} by "
        f"{e.controller or '?'}, which ended before settling it: its budget counts as spent"
        for e in left.values()
    ]


def run_pass(
    inputs: PassInputs,
    run_action: RunAction,
    say: Say,
    clock: Callable[[], float] = time.time,
    shield: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> PassResult:
    """Decide and act once (see the module's docstring); ``say`` gets one line per host, then each action.
    ``shield``: what the commit runs under (``api.auto``: signals held until the ladder, the ledger and
    the tags are all written, so a SIGTERM never leaves a rung recorded without its budget spent).
    With ``inputs.store``, the ladders and the ledger are the shared store's (``_run_with_store``)."""
    check_policy_actions(inputs.policy, inputs.policy_source)
    result = PassResult([], [], inputs.apply, inputs.policy_source)
    ctx = _Pass(inputs, result, run_action, say, clock, shield)
    if inputs.store is not None:
        ctx.run_with_store(inputs.store)
        return result
    with state_locks(inputs.state_dir) as (ladder_path, ledger_path):
        ladder, ledger = load_state(ladder_path, ledger_path)
        brakes_path = inputs.state_dir / BRAKES_FILE
        ctx.brakes = load_brakes(brakes_path)

        def trip(new: Mapping[str, str]) -> None:
            now = clock()
            save_brakes(brakes_path, {**ctx.brakes, **{r: {"since": now, "why": w} for r, w in new.items()}})

        ctx.trip = trip
        ctx.read_record(seen_mod.load_dir(inputs.state_dir))
        malformed = ctx.merge_all_tags(ladder, ledger, clock())
        for line in spend_unsettled(ledger, clock()):
            ctx.warn(line)
        attempted: set[tuple[str, str]] = set()
        pass_id = new_pass_id(clock)
        disruptive = disruptive_actions(inputs)
        if inputs.apply and disruptive:
            where = (
                "one state directory and on the instances (EC2 tags: a pass with another state directory "
                "finishes what a dead one left in flight from them)"
                if inputs.connection is not None
                else "one state directory alone"
            )
            say(
                f"no shared store: the records of this pass's {', '.join(disruptive)} live in {where}; "
                "name a store (store_table) so every controller shares them",
                "dim",
            )
        reserved: dict[str, dict[str, str]] = {}  # action -> {host: ledger entry id}, batch by batch
        pause = paused(None)  # this controller's pause: nothing acts, before and between actions
        if pause is not None:
            result.paused = pause.describe()
            say(f"{pause.describe()}: nothing acts until 'fleetops unpause'", "warning")
        if inputs.apply:  # what a dead pass marked in flight on its instances (held by a pause)
            ctx.finish_marked(ladder, ledger, act=pause is None)

        def before(action: str, decisions: Sequence[Decision]) -> str | None:
            held = paused(None)
            if held is not None:
                result.paused = held.describe()
                return held.describe()
            held_by_mark = ctx.mark_batch(pass_id, action, decisions)  # the in-flight marks, without a store
            if held_by_mark is not None:
                return held_by_mark
            if inputs.apply:  # spent before the batch starts, on disk: a pass killed mid-batch keeps it spent
                now, who = clock(), controller_id()
                reserved[action] = {
                    d.host: ledger.reserve(action, d.host, d.group, now, who).id for d in decisions
                }
                ledger.save(ledger_path)
            return None

        def after(action: str, run: ActionRun) -> None:
            ctx.unmark_batch()
            ids, now = reserved.pop(action, {}), clock()
            tried = run.attempted | run.cannot_act
            ledger.settle({i: run.acted.get(h, now) for h, i in ids.items() if h in tried}, now)
            ledger.release({i for h, i in ids.items() if h not in tried})
            if inputs.apply:
                ledger.save(ledger_path)

        try:
            ctx.decide_and_act(ladder, ledger, clock(), attempted, before, after, act=pause is None)
        finally:
            if inputs.apply:
                with shield():
                    spend_unsettled(ledger, clock())  # a run that raised: its hosts may have been acted on
                    commit(
                        result.decisions,
                        ladder,
                        ledger,
                        clock(),
                        taken=lambda d: (d.host, d.action or "") in attempted or d.action == HUMAN,
                        controller=controller_id(),
                        spent=False,  # reserved and settled batch by batch (before, after)
                    )
                    ladder.save(ladder_path)
                    ledger.save(ledger_path, clock())
                    seen_mod.save_dir(
                        inputs.state_dir, ctx.saw, clock(), seen_mod.rule_checks(inputs.policy), ctx.warn
                    )
                    ctx.write_mirror(ladder, ledger, malformed)
    return result


class _Pass(Guards, MarkedFinishers):
    """A pass: its holds (:class:`Guards`), what it finishes (:class:`MarkedFinishers`), deciding and
    acting."""

    def decide_and_act(
        self,
        ladder: LadderState,
        ledger: BudgetLedger,
        now: float,
        attempted: set[tuple[str, str]],
        before: Before | None = None,
        after: After | None = None,
        act: bool = True,
    ) -> None:
        inputs, result, say = self.inputs, self.result, self.say
        result.decisions = decide(
            inputs.policy, inputs.scan_report, ladder, ledger, now, self.group_of, self.sizes
        )
        self.saw = seen_mod.sightings(inputs.scan_report.get("hosts") or {}, inputs.policy, now)
        self.count_unreachable()
        self.read_nodes()
        self.apply_brakes(ladder, now)
        self.hold_unknown_capacity(now)
        self.wait_for_drains(now)
        self.apply_floors(ladder, now)
        for d in result.decisions:
            style = {"act": "bold", "human": "warning", "exhausted": "warning", "not_scanned": "error"}.get(
                d.status, ""
            )
            say(d.line(), style)
        if not act:
            return
        by_host = {d.host: d for d in result.decisions}
        for action, params, hosts in batches(result.decisions, inputs.extra_params):
            held = before(action, [by_host[h] for h in hosts]) if before is not None else None
            if held is not None:
                say(
                    f"{action} on {len(hosts)} host(s) not started: {held}; the pass starts no further action",
                    "error",
                )
                result.held = held
                break
            say(
                f"{action} on {len(hosts)} host(s): {' '.join(hosts)}"
                + ("" if inputs.apply else " (dry run)"),
                "bold",
            )
            run = self.run_or_fail(action, hosts, params, tell=True)
            result.runs.append(run)
            attempted.update((h, action) for h in run.attempted | run.cannot_act)
            if after is not None:
                after(action, run)
            if run.cannot_act:
                say(
                    f"{action}: nothing to do on {' '.join(sorted(run.cannot_act))}: the rung could not act; "
                    "it counts as tried, and the ladder climbs after its clear time",
                    "warning",
                )
            if run.exit_code in SIGNAL_CODES:  # Ctrl-C or SIGTERM stopped that rollout: stop the pass
                say(f"{action}: {run.exit_code.name.lower()}; the pass starts no further action", "warning")
                break
            if run.stop_requested is not None:  # `fleetops stop`: a person stops the pass, not one action
                say(f"{action}: {run.stop_requested}; the pass starts no further action", "warning")
                break

    def read_record(self, record: seen_mod.FleetRecord) -> None:
        """The fleet record as read; what of it did not parse, one warning each (the pass fails)."""
        self.seen = record
        for line in record.malformed:
            self.warn(line)
        self.result.malformed_record = list(record.malformed)

    # ---- with the shared store

    def seed(self, state: StoredState) -> set[tuple[str, str]]:
        """The upgrade path, once per store: what the EC2 tags and this controller's state directory
        record is merged into the store (the record tried last wins; an action within a second of one
        already there is the same action). A dry run merges in memory only."""
        ladder_path, ledger_path = self.inputs.state_dir / LADDER_FILE, self.inputs.state_dir / LEDGER_FILE
        with state_locks(self.inputs.state_dir):
            ladder, ledger = load_state(ladder_path, ledger_path)
        for line in spend_unsettled(ledger, self.clock()):  # a pass without the store killed mid-rollout
            self.warn(line)
        for host, rules in ladder.hosts.items():
            for rule, rec in rules.items():
                mine = state.ladder.get(host, rule)
                if mine is None or rec.last_tried > mine.last_tried:
                    state.ladder.hosts.setdefault(host, {})[rule] = rec
        for e in ledger.entries:
            state.ledger.record_once(e.action, e.host, e.group, e.at, e.controller)
        malformed = self.merge_all_tags(state.ladder, state.ledger, self.clock())
        if self.inputs.apply:
            state.flush()
            state.mark_seeded(self.inputs.operator or controller_id())
            self.say(
                f"the shared store was seeded from the EC2 tags and {self.inputs.state_dir}; from now on "
                "the tags are a mirror this pass writes",
                "dim",
            )
        return malformed

    def run_with_store(self, store: Store) -> None:
        inputs, result = self.inputs, self.result
        result.store = store.where()
        store.ready()  # created on first use; refuses a controller whose clock is off the store's
        pass_id = new_pass_id(self.clock)
        lease = PassLease(store, pass_id, inputs.operator or controller_id()) if inputs.apply else None
        if lease is not None:
            lease.take()
            if lease.took_over:
                self.warn(f"took over the shared store's lease: {lease.took_over}")
        try:
            if lease is not None:  # the rollouts' lease items expired long ago (fleetops.journal.sweep)
                for line in journal.sweep(store, self.clock()):
                    self.say(line, "dim")
            state = StoredState(store)
            state.load()
            for line in state.malformed:
                self.warn(line)
            result.malformed_store = list(state.malformed)
            self.brakes = store.brakes()
            self.read_record(seen_mod.load_store(store))
            operator = inputs.operator or controller_id()

            def trip(new: Mapping[str, str]) -> None:
                for rule, why in sorted(new.items()):
                    store.trip_brake(rule, why, operator)

            self.trip = trip
            malformed: set[tuple[str, str]] = set()
            if not state.seeded:
                malformed = self.seed(state)
            # a pause holds everything, what earlier passes left included: read before anything is finished
            pause = paused(store)
            if pause is not None:
                result.paused = pause.describe()
                self.say(f"{pause.describe()}: nothing acts until 'fleetops unpause'", "warning")
            # the floors count the batches the store has in flight: reserved by another pass and not settled
            # (a live one, or a dead one recovered below: its host may be down now). What a dead pass left
            # half done is counted as it is finished or held (finish_in_flight, hold_in_flight).
            self.in_flight.update(state.busy(disruptive_actions(inputs, every=True)))
            if inputs.apply:
                for line in state.recover(pass_id, self.clock()):
                    self.warn(line)
                    result.recovered.append(line)
                if pause is None:
                    self.finish_in_flight(state)
                else:
                    self.hold_in_flight(state)
            go_on = self.rerun_in_doubt(state, lease, paused=pause is not None)
            reserved: dict[str, dict[str, str]] = {}
            controller = controller_id()

            def before(action: str, decisions: Sequence[Decision]) -> str | None:
                if lease is not None and lease.lost is not None:
                    result.store_failure = f"the shared store's lease was lost: {lease.lost}"
                    return result.store_failure
                try:
                    held = paused(store)
                    if held is not None:
                        result.paused = held.describe()
                        return held.describe()
                    if inputs.apply:
                        picks = [
                            (d.host, d.group, d.rule or "", d.rung or 0, d.check or "") for d in decisions
                        ]
                        instances = {
                            d.host: (inputs.tags[d.host].instance, inputs.tags[d.host].region)
                            for d in decisions
                            if d.host in inputs.tags
                        }
                        try:  # no in-flight record, no disruptive call: a later pass could not finish it
                            records = self.in_flight_records(action, instances)
                        except Exception as exc:
                            result.store_failure = (
                                f"{action}: could not read what a later pass would need to finish it: {exc}"
                            )
                            return result.store_failure
                        for host, rerun in self.rerun_records(action, decisions).items():
                            records[host] = {**(records.get(host) or {}), **rerun}
                        at = self.clock()
                        reserved[action] = state.reserve(
                            pass_id, action, picks, controller, at, instances, records
                        )
                        # the lease, checked with a write of its own right before acting: a pass that hung
                        # while reserving (past its lease) finds it taken and acts on nothing
                        if lease is not None:
                            lease.renew()
                            if lease.lost is not None:
                                result.store_failure = f"the shared store's lease was lost: {lease.lost}"
                                return result.store_failure
                        if self.clock() - at > RESTAMP_S:  # it hung, and nobody took over: spend it now
                            state.restamp(reserved[action].values(), self.clock())
                except StoreFailure as exc:
                    result.store_failure = str(exc)
                    return str(exc)
                return None

            def after(action: str, run: ActionRun) -> None:
                if inputs.apply and action in reserved:
                    state.settle(
                        reserved.pop(action), run.attempted | run.cannot_act, action, self.clock(), run.acted
                    )

            attempted: set[tuple[str, str]] = set()
            try:
                self.decide_and_act(
                    state.ladder,
                    state.ledger,
                    self.clock(),
                    attempted,
                    before,
                    after,
                    act=pause is None and go_on,
                )
            finally:
                if inputs.apply:
                    with self.shield():
                        # the rungs were recorded batch by batch (settle); what is left: the resets
                        # a clean scan showed, and the ladders that reached ``human``
                        commit(
                            result.decisions,
                            state.ladder,
                            state.ledger,
                            self.clock(),
                            taken=lambda d: d.action == HUMAN,
                        )
                        try:
                            state.flush(self.clock())
                            seen_mod.save_store(
                                store,
                                self.saw,
                                self.group_of,
                                self.clock(),
                                seen_mod.rule_checks(inputs.policy),
                                self.warn,
                            )
                        except StoreFailure as exc:
                            result.store_failure = str(exc)
                            self.warn(str(exc))
                        self.write_mirror(state.ladder, state.ledger, malformed)
        finally:
            if lease is not None:
                lease.release()
