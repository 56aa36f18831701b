"""The pure decision of one ``remediate auto`` pass, and its record.

:func:`decide` takes the policy, a scan report (``fleetops.scan/v1``), the :class:`LadderState` and
the :class:`BudgetLedger` and says, per host, the rule that matched, the rung and the action to take
now or why none (a :class:`Decision`); it changes nothing. Budgets are counted one way,
:class:`Spending`: what each budgeted action's window holds in the ledger, plus what the pass itself
decides. After the engine ran the actions, :func:`commit` records them (ladder and ledger) and
applies the resets the scan showed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fleetops.ansible import facts
from fleetops.auto_schema import DecisionStatus
from fleetops.policy.language import DEFAULT_SEVERITIES, HUMAN, Budget, Policy, Rule, fmt_duration
from fleetops.policy.records import RungRecord
from fleetops.policy.state import BudgetLedger, LadderState
from fleetops.policy.tags import CLOCK_SKEW_S

NO_GROUP = "-"  # the group of a host group_of knows nothing about


# ---------------------------------------------------------------------------------- budgets


def _verdict(
    action: str, group: str, group_size: int, budget: Budget, fleet: int, in_group: int
) -> str | None:
    """Why one more ``action`` is over ``budget`` when ``fleet`` were taken in its window (``in_group``
    of them in ``group``), or None."""
    if budget.max is not None and fleet >= budget.max:
        return f"budget: {action} {budget.max}{budget.per()} across the fleet used"
    limit = budget.group_limit(group_size)
    if limit is not None and in_group >= limit[0]:
        return f"budget: {action} {limit[1]} in group {group} used"
    return None


class Spending:
    """The budgets as a pass sees them: per budgeted action, the ledger's entries in its window
    before ``now`` (and those up to ``CLOCK_SKEW_S`` after it: another controller's clock may run ahead of
    this one's) and those reserved and not yet settled, across the fleet and per group (counted once, so a
    pass costs O(hosts + entries)), plus what the pass itself takes (``take``)."""

    def __init__(self, ledger: BudgetLedger, budgets: Mapping[str, Budget], now: float) -> None:
        self.budgets = budgets
        self.fleet: Counter[str] = Counter()
        self.group: Counter[tuple[str, str]] = Counter()
        for e in ledger.entries:
            budget = budgets.get(e.action)
            # a reservation not yet settled is spent whatever its time (its batch may act any moment)
            if budget is not None and (e.reserved or now - budget.window_s < e.at <= now + CLOCK_SKEW_S):
                self.fleet[e.action] += 1
                self.group[(e.action, e.group)] += 1

    def blocked(self, action: str, group: str, group_size: int) -> str | None:
        """Why the budget forbids one more ``action`` in ``group`` (of ``group_size`` hosts)
        ("budget: ..."), or None (also when ``action`` has no budget)."""
        budget = self.budgets.get(action)
        if budget is None:
            return None
        return _verdict(action, group, group_size, budget, self.fleet[action], self.group[(action, group)])

    def take(self, action: str, group: str) -> None:
        """One more ``action`` in ``group``, decided by this pass."""
        self.fleet[action] += 1
        self.group[(action, group)] += 1


# ---------------------------------------------------------------------------------- deciding


Status = DecisionStatus  # declared with the document that carries it (fleetops.auto_schema)


@dataclass(frozen=True)
class Decision:
    """What one pass decides for one host."""

    host: str
    group: str
    status: Status
    reason: str
    rule: str | None = None
    check: str | None = None
    severity: str | None = None
    summary: str | None = None
    # index into the rule's ladder: the rung taken now, waited on or blocked (1-based in to_dict's JSON)
    rung: int | None = None
    rungs: int = 0  # the ladder's length
    rung_action: str | None = None  # that rung's action
    action: str | None = None  # the action to take now (None: none)
    params: Mapping[str, Any] = field(default_factory=dict)
    waiting_rules: tuple[str, ...] = ()  # other rules the host matches, after this one
    reset: tuple[str, ...] = ()  # ladders this scan showed cleared (reset by commit)
    # of those, the ones whose episode quarantined the host: its taint stays until someone releases it
    still_quarantined: tuple[str, ...] = ()
    # ladders in progress that this scan cannot judge: a detector of the rule failed on the host, so
    # the finding may well be there; kept as they are, and the pass fails (it is not clean)
    blind: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (for a report or the audit log)."""
        data = asdict(self)
        data["params"] = dict(self.params)
        # counted from 1, as the text says it (``line``: "rung 1/4"); ``rung`` here is the ladder's index
        data["rung"] = None if self.rung is None else self.rung + 1
        if not self.blind:
            del data["blind"]  # the documents of passes before it, unchanged
        return data

    def line(self) -> str:
        """One line for the operator: host, finding, rule and rung, and the action or why none."""
        parts = [f"{self.host}:"]
        if self.check is not None:
            parts.append(f"{self.check} ({self.severity})")
        if self.rule is not None and self.rung is not None:
            parts.append(f"rule {self.rule} rung {self.rung + 1}/{self.rungs} {self.rung_action}:")
        parts.append(self.reason)
        if self.waiting_rules:
            parts.append(f"(then: {', '.join(self.waiting_rules)})")
        return " ".join(parts)


_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _group_sizes(hosts: Collection[str], group_of: Callable[[str], str | None]) -> dict[str, int]:
    return dict(Counter(group_of(h) or NO_GROUP for h in hosts))


def decide(
    policy: Policy,
    scan_report: Mapping[str, Any],
    ladder_state: LadderState,
    budget_ledger: BudgetLedger,
    now: float,
    group_of: Callable[[str], str | None],
    group_sizes: Mapping[str, int] | None = None,
) -> list[Decision]:
    """One decision per host of ``scan_report`` (sorted by name). Pure: nothing passed in changes.

    ``group_of``: a host's budget group (its AZ, say; None: no group). ``group_sizes``: hosts per
    group, for percent budgets (default: counted from the report's hosts). Actions decided for
    earlier hosts of the same pass count against the budgets of later ones.
    """
    hosts: Mapping[str, Any] = scan_report.get("hosts") or {}
    sizes = dict(group_sizes) if group_sizes is not None else _group_sizes(list(hosts), group_of)
    pending = Spending(budget_ledger, policy.limits, now)
    return [
        _decide_host(policy, host, hosts[host], ladder_state, pending, now, group_of(host) or NO_GROUP, sizes)
        for host in sorted(hosts)
    ]


def _decide_host(
    policy: Policy,
    host: str,
    result: Mapping[str, Any],
    ladder: LadderState,
    pending: Spending,
    now: float,
    group: str,
    sizes: Mapping[str, int],
) -> Decision:
    status = result.get("status")
    if not facts.answered(result):  # ok or partial: its findings are decided on
        msg = f": {result.get('msg')}" if result.get("msg") else ""
        return Decision(host, group, "not_scanned", f"not scanned ({status}){msg}: ladders left as they are")

    matched: dict[str, tuple[Rule, Mapping[str, Any]]] = {}
    unmatched: list[Mapping[str, Any]] = []
    for finding in result.get("findings") or []:
        rule = policy.rule_for(finding)
        if rule is None:
            if finding.get("severity") in DEFAULT_SEVERITIES:
                unmatched.append(finding)
            continue
        best = matched.get(rule.name)
        if best is None or _SEVERITY_RANK.get(finding.get("severity", ""), 0) > _SEVERITY_RANK.get(
            best[1].get("severity", ""), 0
        ):
            matched[rule.name] = (rule, finding)
    failed = {str(e.get("check")) for e in result.get("errors") or [] if isinstance(e, Mapping)}
    blind = tuple(
        r
        for r in ladder.rules(host)
        if r not in matched and failed & _rule_checks(policy, r, _rec(ladder, host, r))
    )
    reset = tuple(r for r in ladder.rules(host) if r not in matched and r not in blind)
    held = tuple(r for r in reset if _rec(ladder, host, r).quarantined)
    if not matched:
        was = "; ".join(f"{r} reset (was at {_rec(ladder, host, r).action})" for r in reset)
        if blind:
            kept = ", ".join(
                f"{r} ({', '.join(sorted(failed & _rule_checks(policy, r, _rec(ladder, host, r))))})"
                for r in blind
            )
            was = (f"{was}; " if was else "") + f"ladder kept: its detector failed on the host: {kept}"
        if held:
            was += f"; still quarantined by {', '.join(held)}: release it when the host is trusted again"
        if unmatched:
            what = ", ".join(sorted({f"{f.get('check')} ({f.get('severity')})" for f in unmatched}))
            why = f"no rule matches: {what}" + (f"; {was}" if was else "")
            return Decision(host, group, "no_rule", why, reset=reset, still_quarantined=held, blind=blind)
        return Decision(
            host,
            group,
            "clean",
            "clean" + (f"; {was}" if was else ""),
            reset=reset,
            still_quarantined=held,
            blind=blind,
        )

    order = [r.name for r in policy.rules if r.name in matched]
    rule, finding = matched[order[0]]
    base = Decision(
        host,
        group,
        "act",
        "",
        rule=rule.name,
        check=str(finding.get("check")),
        severity=str(finding.get("severity")),
        summary=str(finding.get("summary", "")),
        rungs=len(rule.ladder),
        waiting_rules=tuple(order[1:]),
        reset=reset,
        still_quarantined=held,
        blind=blind,
    )

    rec = ladder.get(host, rule.name)
    index, note = _current_rung(rule, rec)
    if rec is None or index is None:
        want, why = 0, "first rung" + (f" ({note})" if note else "")
    else:
        rung = rule.ladder[index]
        ago = now - rec.last_tried
        if rung.action == HUMAN:
            return replace(
                base, status="human", rung=index, rung_action=HUMAN,
                reason=f"needs a human (since {fmt_duration(ago)}): {rung.note or 'no note'}",
            )  # fmt: skip
        if ago < rung.clear_after_s:
            return replace(
                base, status="wait", rung=index, rung_action=rung.action,
                reason=f"waiting: rung {rung.action} tried {fmt_duration(ago)} ago, gets {fmt_duration(rung.clear_after_s)}",
            )  # fmt: skip
        if index + 1 >= len(rule.ladder):
            return replace(
                base, status="exhausted", rung=index, rung_action=rung.action,
                reason=f"needs a human: ladder exhausted (rung {rung.action} tried {fmt_duration(ago)} ago, "
                f"the finding persists)",
            )  # fmt: skip
        want = index + 1
        why = f"climbing: rung {rung.action} tried {fmt_duration(ago)} ago did not clear it"
    rung = rule.ladder[want]
    if rung.action == HUMAN:
        return replace(
            base, status="human", rung=want, rung_action=HUMAN, action=HUMAN,
            reason=f"needs a human: {rung.note or 'no note'}" + (f" ({why})" if want else ""),
        )  # fmt: skip
    size = sizes.get(group, 1)
    blocked = pending.blocked(rung.action, group, size)
    if blocked is not None:
        return replace(base, status="budget", rung=want, rung_action=rung.action, reason=blocked)
    pending.take(rung.action, group)
    return replace(
        base, status="act", rung=want, rung_action=rung.action, action=rung.action, params=dict(rung.params),
        reason=f"{rung.action} now ({why})",
    )  # fmt: skip


def _rule_checks(policy: Policy, name: str, rec: RungRecord) -> set[str]:
    """The checks a ladder's rule matches on (a rule the policy no longer has: the check it recorded)."""
    rule = policy.rule(name)
    return {m.check for m in rule.match} if rule is not None else {rec.check}


def _rec(ladder: LadderState, host: str, rule: str) -> RungRecord:
    rec = ladder.get(host, rule)
    assert rec is not None
    return rec


def _current_rung(rule: Rule, rec: RungRecord | None) -> tuple[int | None, str]:
    """The index of the rung ``rec`` says was tried, following the rule when the policy changed;
    None (start over) when that action is no longer in the ladder."""
    if rec is None:
        return None, ""
    if rec.rung < len(rule.ladder) and rule.ladder[rec.rung].action == rec.action:
        return rec.rung, ""
    for i, rung in enumerate(rule.ladder):
        if rung.action == rec.action:
            return i, ""
    return None, f"the policy changed: {rec.action} is no longer on this ladder, starting over"


def commit(
    decisions: Collection[Decision],
    ladder_state: LadderState,
    budget_ledger: BudgetLedger,
    now: float,
    taken: Callable[[Decision], bool] | None = None,
    controller: str = "",
    spent: bool = True,
) -> None:
    """Record a pass: every ladder a scan showed cleared is reset, and every action taken (by
    default every decided action; ``taken`` says which ran) is recorded in the ladder and, but
    ``human``, in the ledger (not with ``spent=False``: the pass reserved and settled its budgets batch
    by batch). ``now``: when the actions finished (a rung's clear time starts then)."""
    for d in decisions:
        for rule in d.reset:
            ladder_state.reset(d.host, rule)
        if d.action is None or d.rule is None or d.rung is None or d.check is None:
            continue
        if taken is not None and not taken(d):
            continue
        ladder_state.record(d.host, d.rule, d.check, d.rung, d.action, now)
        if d.action != HUMAN and spent:
            budget_ledger.record(d.action, d.host, d.group, now, controller)


# ---------------------------------------------------------------------------------- the storm brake


def storm_brakes(
    policy: Policy,
    decisions: Collection[Decision],
    group_sizes: Mapping[str, int],
    failed: Mapping[str, str] | None = None,
    elsewhere: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The rules this pass's decisions show in a storm (``Storm.tripped``) -> why. A host counts for each
    rule its findings match (the rule it acts on and those waiting their turn), whatever its status;
    ``group_sizes``: hosts per group over the whole fleet.

    ``failed`` (host -> group): hosts the scheduler itself took out as failing (Slurm: not responding, an
    unexpected reboot; ``NodeState.failed``), whatever their findings: a fault that hangs a node outright
    leaves no finding to match (the host is unreachable), so each such host counts as one more for every
    rule that matched a host this pass, in the fleet and in the groups where the rule matched.

    ``elsewhere`` (rule -> host -> group): hosts outside this pass known to match the rule recently."""
    failed = dict(failed or {})
    elsewhere = elsewhere or {}
    fleet = sum(group_sizes.values())
    matched: dict[str, list[Decision]] = {}
    for d in decisions:
        for rule in ([d.rule] if d.rule else []) + list(d.waiting_rules):
            matched.setdefault(rule, []).append(d)
    out: dict[str, str] = {}
    for name, ds in sorted(matched.items()):
        found = policy.rule(name)
        if found is None:
            continue
        hosts = {d.host for d in ds}
        known = {h: g for h, g in elsewhere.get(name, {}).items() if h not in hosts}
        hosts |= set(known)
        down = {h: g for h, g in failed.items() if h not in hosts}
        counts = Counter(d.group for d in ds)
        counts.update(known.values())
        counts.update(g for g in down.values() if g in counts)
        groups = {g: (n, group_sizes.get(g, n)) for g, n in counts.items()}
        why = policy.storm_of(found).tripped(len(ds) + len(known) + len(down), fleet, groups)
        if why is not None:
            notes = {
                "outside this pass, as the fleet record and the ladders show": known,
                "failed in the scheduler, no finding": down,
            }
            out[name] = why + "".join(f" ({len(h)} of them {n}: {_some(h)})" for n, h in notes.items() if h)
    return out


def _some(hosts: Collection[str]) -> str:
    return ", ".join(sorted(hosts)[:5]) + (", ..." if len(hosts) > 5 else "")


def hold_for_brakes(
    decisions: Sequence[Decision], brakes: Mapping[str, str], held: Callable[[str], bool]
) -> list[Decision]:
    """``decisions`` with each action a brake holds (``held(action)``) on a braked rule turned into status
    ``brake``: nothing runs, nothing is recorded, the rung is tried again once the brake is lifted."""
    out = []
    for d in decisions:
        if (
            d.status == "act"
            and d.rule is not None
            and d.rule in brakes
            and d.action is not None
            and held(d.action)
        ):
            d = replace(
                d,
                status="brake",
                action=None,
                reason=f"storm brake on rule {d.rule}: {brakes[d.rule]}; {d.rung_action} is held fleet-wide "
                f"until a person lifts it ('fleetops brake lift {d.rule}')",
            )
        out.append(d)
    return out


# ---------------------------------------------------------------------------------- capacity floors


@dataclass(frozen=True)
class GroupCapacity:
    """One group as the floors see it after a pass decided: its size, the hosts unavailable before the
    pass (and why), those the pass takes, what its floor keeps, and the hosts the floor held back."""

    group: str
    size: int
    unavailable: dict[str, str]
    taken: tuple[str, ...]
    keep: int | None
    held: tuple[str, ...]

    def line(self) -> str:
        why = ", ".join(f"{h} {w}" for h, w in sorted(self.unavailable.items())[:5])
        more = f" and {len(self.unavailable) - 5} more" if len(self.unavailable) > 5 else ""
        left = self.size - len(self.unavailable) - len(self.taken)
        may = max(0, left - self.keep) if self.keep is not None else left
        return (
            f"group {self.group}: {self.size} hosts, {len(self.unavailable)} unavailable"
            + (f" ({why}{more})" if why else "")
            + f", {len(self.taken)} taken now"
            + (f", keeps {self.keep} available: {may} more may be taken" if self.keep is not None else "")
            + (f"; held by the floor: {' '.join(self.held)}" if self.held else "")
        )


def hold_for_floors(
    policy: Policy,
    decisions: Sequence[Decision],
    group_sizes: Mapping[str, int],
    unavailable: Mapping[str, tuple[str, str]],
    quarantined: Mapping[str, str],
    disruptive: Callable[[str], bool],
    maybe_serving: Collection[str] = (),
) -> tuple[list[Decision], list[GroupCapacity]]:
    """``decisions`` with each disruptive action that would leave its group below the rule's floor (or
    over its quarantine cap) turned into status ``floor``, taken in host order; and each group's capacity.

    ``unavailable``: host -> (group, why) of hosts out of service before this pass (unreachable,
    quarantined, stopped, being replaced); ``quarantined``: host -> group of hosts standing quarantined.
    A host already unavailable may be acted on without costing the group more — except one of
    ``maybe_serving``: counted unavailable only because a record names it (a batch reserved in the store,
    a step a dead pass left) while nothing shows it out of service; it counts against its group for the
    others, and taking it is judged as taking a host in service (it is counted once: already in the
    unavailable). UsageError (exit 2) when a floor keeps more hosts than a group it applies to has: no
    host of it could ever be taken."""
    from fleetops.errors import UsageError

    down: dict[str, dict[str, str]] = {}
    for host, (group, cause) in unavailable.items():
        down.setdefault(group, {})[host] = cause
    in_quarantine = Counter(quarantined.values())
    taken: dict[str, list[str]] = {}
    held: dict[str, list[str]] = {}
    keeps: dict[str, int] = {}
    out = []
    for d in decisions:
        rule = policy.rule(d.rule) if d.rule else None
        floor = policy.floor_of(rule) if rule is not None else None
        if d.status != "act" or d.action is None or floor is None or not disruptive(d.action):
            out.append(d)
            continue
        g, size = d.group, group_sizes.get(d.group, 1)
        keep = floor.keep(size)
        if keep > size:
            raise UsageError(
                f"policy: rule {d.rule}: its floor {floor.says(size)} in group {g}, which has {size} hosts: "
                "no host of it could ever be taken (lower floor.min_available)"
            )
        keeps[g] = keep
        gone = down.get(g, {})
        mine = taken.setdefault(g, [])
        why = None
        cap = floor.quarantine_cap(size) if d.action == "quarantine" else None
        if cap is not None and d.host not in quarantined and in_quarantine[g] >= cap:
            why = f"floor: group {g} has {in_quarantine[g]} of {size} hosts quarantined (at most {cap})"
        elif d.host not in gone and size - len(gone) - len(mine) - 1 < keep:
            why = f"floor: group {g} {floor.says(size)}; {len(gone)} unavailable, {len(mine)} taken by this pass"
        elif d.host in gone and d.host in maybe_serving and size - len(gone) - len(mine) < keep:
            why = (
                f"floor: group {g} {floor.says(size)}; {len(gone)} unavailable ({d.host} among them on a record "
                f"only: {gone[d.host]}, and may be serving), {len(mine)} taken by this pass"
            )
        if why is not None:
            held.setdefault(g, []).append(d.host)
            out.append(replace(d, status="floor", action=None, reason=why))
            continue
        if d.host not in gone:
            mine.append(d.host)
        if d.action == "quarantine" and d.host not in quarantined:
            in_quarantine[g] += 1
        out.append(d)
    capacity = [
        GroupCapacity(
            g,
            group_sizes.get(g, 0),
            dict(down.get(g, {})),
            tuple(taken.get(g, [])),
            keeps.get(g),
            tuple(held.get(g, [])),
        )
        for g in sorted(set(taken) | set(held))
    ]
    return out, capacity
