"""One pass of ``fleetops remediate auto``: scan, decide per host by the policy, act, remember.

The pure part is :mod:`fleetops.policy` (``decide``, ``commit``); this module runs a pass around it:

1. the policy is loaded and checked against the remediations that exist (every rung's action is a
   remediation or ``human``; every rung's ``params`` are that remediation's parameters);
2. the hosts are scanned (one ``node_health`` call per host);
3. under the ladder lock, then the ledger lock (the state directory's ``ladder.json`` and
   ``ledger.json``; another pass holding them makes this one exit 4 at once), each EC2 host's
   ``fleetops.io/ladder`` tag is merged in, and the actions its ``fleetops.io/spent`` tag records (and
   the ladder tag's latest rungs) are counted against the budgets too, so a controller with another
   state directory, an AWX job in a fresh container, spends the same budgets; then ``decide``;
4. one rollout per action (and per parameter set), through ``run_action``: the same engine, lock,
   lease, gates and audit as ``fleetops remediate <action>``, with the pass's caps;
5. with ``apply``, ``commit``: the ladders of every host an action was *attempted* on (done, failed,
   timed out, in doubt) climb and the budgets are spent (a failing action is not retried every pass
   for free); hosts the scan showed clean have their ladders reset; and each EC2 host's two tags are
   rewritten: the ladder tag (deleted when it has no ladder left) and the spent tag (every budgeted
   action on it still inside its budget's window: it outlives a ladder its action cleared). A dry
   run records nothing.

With a shared store (``inputs.store``, :mod:`fleetops.store`), step 3 reads the ladders and the ledger
from the store under the pass's lease instead (the state directory and the tags are read once, to seed
it), a pause in the store holds the pass before it acts and before every action (exit 5), each action's
budget is reserved in the store before its rollout starts and settled after (ladders climb then), a dead
pass's unsettled reservations count as attempted, and the tags are written as a mirror.

Ctrl-C (stop after the batch), SIGTERM or SIGHUP during an action ends that rollout as
``fleetops remediate`` would (state saved for ``--resume``); the pass then starts no further action,
records what was attempted (hosts caught mid-batch included) and exits 130 / 143 / 129. A SIGTERM
or SIGHUP outside a rollout (the scan, between actions) unwinds the same way (``api.auto``).

Exit: 130 / 143 / 129 when a signal stopped the pass; 3 when a host could not be scanned or an
action's rollout did not finish every host (or the store failed, or holds what does not parse); 5 when
automation is paused; 1 when a host needs a human (the ladder reached ``human``
or ran out); else 0 (acting, waiting, blocked by a budget, clean).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible.collection import load, module_utils
from fleetops.documents import DocumentError, read_json
from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.fix import ACTIONABLE
from fleetops.nodes import NodeReading
from fleetops.policy import (
    FROM_LADDER_TAG,
    HUMAN,
    MAX_WINDOW_S,
    NO_GROUP,
    SPENT_TAG_KEY,
    TAG_KEY,
    BudgetLedger,
    Decision,
    LadderState,
    LedgerEntry,
    Policy,
    StateError,
    commit,
    controller_id,
    decide,
    file_lock,
    fmt_duration,
    hold_for_brakes,
    hold_for_floors,
    storm_brakes,
)
from fleetops.remediations import REMEDIATIONS, ladder_order
from fleetops.rollout.lease import Ec2Connection
from fleetops.store import RESERVED, PassLease, Store, StoredState, StoreFailure
from fleetops.util import atomic_write

AUTO_SCHEMA = "fleetops.auto/v1"
LADDER_FILE = "ladder.json"
LEDGER_FILE = "ledger.json"
BRAKES_FILE = "brakes.json"  # the storm brakes in force, without a shared store
BRAKES_SCHEMA = "fleetops.auto.brakes/v1"
# a reservation older than this when its batch starts (the pass hung while reserving) is stamped again,
# so the budget's window runs from when the batch really starts
RESTAMP_S = 10.0
PASS_LOCK_TIMEOUT_S = 2.0  # another pass holds the state: fail at once rather than queue behind it
REASON_MAX = 200  # the quarantine reason kept in the node's annotation
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
        ):
            return ExitCode.FAILED
        if self.paused is not None:
            return ExitCode.PAUSED
        if any(d.status in ("human", "exhausted") for d in self.decisions) or self.brakes:
            return ExitCode.FINDINGS  # a person must act: a ladder at its end, or a storm brake to lift
        return ExitCode.OK

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
        if self.capacity:
            doc["capacity"] = [dict(c) for c in self.capacity]
        if self.nodes_out or self.node_failures:
            doc["nodes"] = {"out": dict(self.nodes_out), "failures": list(self.node_failures)}
        if self.unreachable:
            doc["unreachable"] = {
                "hosts": list(self.unreachable),
                "limit": self.unreachable_limit,
                "tolerated": bool(self.tolerated),
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
        return doc

    def _document(self) -> dict[str, Any]:
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


# ------------------------------------------------------------------------------ policy vs registry


def check_policy_actions(policy: Policy, source: str) -> None:
    """UsageError unless every rung's action is a remediation (or ``human``) and its params are that
    remediation's parameters (``quarantine``'s ``finding`` and ``reason`` come from the finding)."""
    for rule in policy.rules:
        for i, rung in enumerate(rule.ladder):
            if rung.action == HUMAN:
                continue
            remediation = REMEDIATIONS.get(rung.action)
            where = f"{source}: rule {rule.name} rung {i + 1} ({rung.action})"
            if remediation is None:
                raise UsageError(
                    f"{where}: fleetops has no such remediation (one of {', '.join(REMEDIATIONS)})"
                )
            unknown = sorted(set(rung.params) - set(remediation.params) - set(remediation.from_finding()))
            if unknown:
                raise UsageError(
                    f"{where}: unknown parameter(s) {', '.join(unknown)} "
                    f"(remediate {rung.action} takes {', '.join(sorted(remediation.params)) or 'none'})"
                )


def action_params(d: Decision, extra: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of ``d``'s action: the rung's, the operator's per-action ones (``extra``: kubectl,
    kubeconfig...), and what the finding gives (quarantine's check and reason)."""
    assert d.action is not None
    remediation = REMEDIATIONS[d.action]
    params: dict[str, Any] = {k: v for k, v in extra.get(d.action, {}).items() if k in remediation.params}
    params.update(d.params)
    for name, source in remediation.from_finding().items():  # what the finding supplies (Param.from_finding)
        if source == "reason":
            reason = (
                f"fleetops remediate auto: rule {d.rule} rung {(d.rung or 0) + 1}: {d.summary or d.check}"
            )
            params[name] = reason[:REASON_MAX]
        elif d.check:
            params[name] = d.check
    return {k: v for k, v in params.items() if k in remediation.params}


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def batches(
    decisions: Sequence[Decision], extra: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, dict[str, Any], list[str]]]:
    """The rollouts a pass runs: one per action and parameter set, in ``ladder_order()``, hosts sorted."""
    grouped: dict[tuple[str, Any], tuple[dict[str, Any], list[str]]] = {}
    for d in decisions:
        if d.status != "act" or d.action is None or d.action == HUMAN:
            continue
        params = action_params(d, extra)
        key = (d.action, _freeze(params))
        grouped.setdefault(key, (params, []))[1].append(d.host)
    order = {a: i for i, a in enumerate(ladder_order())}
    out = [(action, params, sorted(hosts)) for (action, _k), (params, hosts) in grouped.items()]
    out.sort(key=lambda t: (order.get(t[0], len(order)), t[2]))
    return out


# ------------------------------------------------------------------------------ EC2 ladder tags


def merge_tags(
    ladder: LadderState,
    ledger: BudgetLedger,
    tags: Mapping[str, str],
    group_of: Callable[[str], str | None],
    now: float,
    warn: Callable[[str], None],
    spent: Mapping[str, str] | None = None,
) -> set[tuple[str, str]]:
    """Merge each host's ``TAG_KEY`` value into ``ladder`` and count its rungs (tried within the
    ledger's longest window, not already in the ledger) against the budgets; count the actions each
    host's ``SPENT_TAG_KEY`` value (``spent``) records too. A malformed tag is left out with a
    warning (one instance's bad tag must not stop the pass for the fleet); returns the (host, tag key)
    of each, which the pass leaves as it found it."""
    malformed: set[tuple[str, str]] = set()
    for host, value in sorted((spent or {}).items()):
        try:
            ledger.merge_tag(host, group_of(host) or NO_GROUP, value, f"{host}: tag {SPENT_TAG_KEY}", now)
        except DocumentError as exc:
            warn(f"{exc}: ignored, and left as it is for a person to mend or delete")
            malformed.add((host, SPENT_TAG_KEY))
    for host, value in sorted(tags.items()):
        try:
            ladder.merge_tag(host, value, source=f"{host}: tag {TAG_KEY}")
        except DocumentError as exc:
            warn(f"{exc}: ignored, and left as it is for a person to mend or delete")
            malformed.add((host, TAG_KEY))
            continue
        for rec in ladder.hosts.get(host, {}).values():
            if rec.action == HUMAN or now - rec.last_tried > MAX_WINDOW_S or rec.last_tried > now:
                continue
            ledger.record_once(rec.action, host, group_of(host) or NO_GROUP, rec.last_tried, FROM_LADDER_TAG)
    return malformed


@dataclass(frozen=True)
class TagTarget:
    instance: str
    region: str
    value: str | None  # the ladder tag's value the inventory showed (None: no tag)
    spent: str | None = None  # the spent tag's value the inventory showed (None: no tag)

    def shown(self, key: str) -> str | None:
        return self.spent if key == SPENT_TAG_KEY else self.value


def write_tags(
    connection: Ec2Connection,
    targets: Mapping[str, TagTarget],
    new: Mapping[str, str | None],
    key: str,
    failed: Callable[[str, str], None],
) -> dict[str, str | None]:
    """Write (or delete) each host's tag ``key`` whose value changed; returns what was written. A host
    whose write fails is told to ``failed`` (host, why) and the others are still written."""
    lease_utils = module_utils("lease")
    aws = module_utils("aws")
    changed = {h: v for h, v in new.items() if h in targets and targets[h].shown(key) != v}
    if not changed:
        return {}
    regions = {targets[h].instance: targets[h].region for h in changed}
    tags = lease_utils.Ec2Tags(connection.settings(), regions, user_agent="fleetops.auto")
    written: dict[str, str | None] = {}
    for host, value in sorted(changed.items()):
        t = targets[host]
        old = t.shown(key)
        try:
            if value is None:
                if old is not None:
                    tags.delete([t.instance], key, old)
            else:
                tags.write([t.instance], key, value)
        except aws.AwsError as exc:
            failed(host, f"Failed to write its tag {key} ({t.instance}): {exc}")
            continue
        written[host] = value
    return written


# ------------------------------------------------------------------------------ the storm brakes (no store)


def load_brakes(path: Path) -> dict[str, dict[str, Any]]:
    """The storm brakes in force (``brakes.json``: rule -> {since, why}); none when there is no file.
    DocumentError (exit 2) when it is not such a document: a brake nobody can read must not vanish."""
    if not path.exists() and not path.is_symlink():
        return {}
    data = read_json(path)
    brakes = data.get("brakes") if isinstance(data, dict) and data.get("schema") == BRAKES_SCHEMA else None
    if not isinstance(brakes, dict) or not all(isinstance(b, dict) for b in brakes.values()):
        raise DocumentError(str(path), f"not a {BRAKES_SCHEMA} document; nothing was done")
    return brakes


def save_brakes(path: Path, brakes: Mapping[str, Mapping[str, Any]]) -> None:
    text = json.dumps({"schema": BRAKES_SCHEMA, "brakes": brakes}, indent=1, sort_keys=True) + "\n"
    atomic_write(path, text, mode=0o600, mkdir=True)


def lift_brake(state_dir: Path, rule: str) -> bool:
    """Remove the brake on ``rule`` from the state directory's brakes (under the pass lock); whether
    there was one."""
    with _state_locks(state_dir):
        path = state_dir / BRAKES_FILE
        brakes = load_brakes(path)
        if rule not in brakes:
            return False
        del brakes[rule]
        save_brakes(path, brakes)
        return True


# ------------------------------------------------------------------------------ the pass


@contextlib.contextmanager
def _state_locks(directory: Path) -> Iterator[tuple[Path, Path]]:
    ladder_path, ledger_path = directory / LADDER_FILE, directory / LEDGER_FILE
    try:
        with file_lock(ladder_path, PASS_LOCK_TIMEOUT_S), file_lock(ledger_path, PASS_LOCK_TIMEOUT_S):
            yield ladder_path, ledger_path
    except StateError as exc:
        raise PassLockedError(f"another 'fleetops remediate auto' pass is running: {exc}") from None


# What moving an unreadable state file aside would cost, said with the error.
_ASIDE = {
    LADDER_FILE: f"restarts every ladder from what the EC2 hosts' {TAG_KEY} tags still record (the others "
    "from their first rung)",
    LEDGER_FILE: f"forgets the budgets spent, except what each EC2 host's {SPENT_TAG_KEY} tag records",
}


def _load_state(ladder_path: Path, ledger_path: Path) -> tuple[LadderState, BudgetLedger]:
    """Both state files; an unreadable one stops the pass before anything is decided or changed
    (exit 2), saying what moving it aside would cost."""
    path = ladder_path
    try:
        ladder = LadderState.load(path)
        path = ledger_path
        return ladder, BudgetLedger.load(path)
    except DocumentError as exc:
        cost = _ASIDE.get(path.name, "")
        raise DocumentError(
            exc.source, f"{exc.problem}; nothing was done. Moving it aside {cost}", exc.field
        ) from None


@dataclass
class PassInputs:
    policy: Policy
    policy_source: str
    scan_report: Mapping[str, Any]
    group_of: Mapping[str, str | None]
    state_dir: Path
    apply: bool
    tags: Mapping[str, TagTarget] = field(default_factory=dict)  # EC2 hosts: their instance and tag
    connection: Ec2Connection | None = None  # where to write the tags (None: no EC2)
    extra_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # every host of the inventory -> its group, a limit or --exclude notwithstanding: groups are sized
    # (percent budgets) over the whole fleet (None: the selection is the fleet)
    fleet: Mapping[str, str | None] | None = None
    # the EC2 hosts outside the selection: their ladder and spent tags count against the budgets too
    # (read, never written)
    fleet_tags: Mapping[str, TagTarget] = field(default_factory=dict)
    # the shared store (None: the state directory and the EC2 tags are the record)
    store: Store | None = None
    operator: str = ""  # who runs the pass (the store's lease names them)
    # the schedulers' view of the fleet's nodes, read once before deciding (None: not read)
    nodes: NodeReading | None = None


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
    with _state_locks(inputs.state_dir) as (ladder_path, ledger_path):
        ladder, ledger = _load_state(ladder_path, ledger_path)
        brakes_path = inputs.state_dir / BRAKES_FILE
        ctx.brakes = load_brakes(brakes_path)

        def trip(new: Mapping[str, str]) -> None:
            now = clock()
            save_brakes(brakes_path, {**ctx.brakes, **{r: {"since": now, "why": w} for r, w in new.items()}})

        ctx.trip = trip
        malformed = ctx.merge_all_tags(ladder, ledger, clock())
        attempted: set[tuple[str, str]] = set()
        try:
            ctx.decide_and_act(ladder, ledger, clock(), attempted)
        finally:
            if inputs.apply:
                with shield():
                    commit(
                        result.decisions,
                        ladder,
                        ledger,
                        clock(),
                        taken=lambda d: (d.host, d.action or "") in attempted or d.action == HUMAN,
                        controller=controller_id(),
                    )
                    ladder.save(ladder_path)
                    ledger.save(ledger_path, clock())
                    ctx.write_mirror(ladder, ledger, malformed)
    return result


def _disruptive(action: str | None) -> bool:
    """The action takes its host out of service (reboot, quarantine, stop-start, replace)."""
    return action is not None and action in REMEDIATIONS and REMEDIATIONS[action].disruptive


# Why a batch must not start (pause, lease lost, store unreachable), or None; given the action and its
# decisions. It may reserve the batch's budget in the store.
Before = Callable[[str, Sequence[Decision]], str | None]
After = Callable[[str, ActionRun], None]


@dataclass
class _Pass:
    inputs: PassInputs
    result: PassResult
    run_action: RunAction
    say: Say
    clock: Callable[[], float]
    shield: Callable[[], contextlib.AbstractContextManager[Any]]

    def __post_init__(self) -> None:
        self.in_flight: dict[str, str] = {}  # host -> what a dead pass left half done on it (the store's)
        self.brakes: dict[str, dict[str, Any]] = {}  # the storm brakes in force before this pass
        self.trip: Callable[[Mapping[str, str]], None] = lambda new: None  # record brakes this pass trips
        inputs = self.inputs
        fleet = inputs.fleet if inputs.fleet is not None else inputs.group_of
        self.fleet = fleet
        # the whole fleet's groups: a limit or --exclude does not shrink them
        self.sizes = Counter(self.group_of(h) or NO_GROUP for h in {*fleet, *inputs.group_of})

    def group_of(self, host: str) -> str | None:
        return self.inputs.group_of.get(host) if host in self.inputs.group_of else self.fleet.get(host)

    def warn(self, line: str) -> None:
        self.result.warnings.append(line)
        self.say(line, "warning")

    def merge_all_tags(self, ladder: LadderState, ledger: BudgetLedger, now: float) -> set[tuple[str, str]]:
        """Every EC2 host's tags into ``ladder`` and ``ledger`` (the selection's and the rest of the
        fleet's); the malformed ones, which are left as found."""
        read = {**self.inputs.fleet_tags, **self.inputs.tags}
        malformed = merge_tags(
            ladder,
            ledger,
            {h: t.value for h, t in read.items() if t.value},
            self.group_of,
            now,
            self.warn,
            spent={h: t.spent for h, t in read.items() if t.spent},
        )
        self.result.malformed_tags = sorted(f"{h}: {key}" for h, key in malformed if h in self.inputs.tags)
        return malformed

    def run_or_fail(
        self, action: str, hosts: Sequence[str], params: Mapping[str, Any], tell: bool = False
    ) -> ActionRun:
        """``run_action``; one that raised (FleetopsError) as a failed ActionRun with its exit code and
        error (said as an error line when ``tell``)."""
        try:
            return self.run_action(action, hosts, params)
        except FleetopsError as exc:
            code = exc.exit_code if exc.exit_code in set(ExitCode) else ExitCode.FAILED
            if tell:
                self.say(f"{action}: {exc}", "error")
            return ActionRun(action, tuple(hosts), params, exit_code=ExitCode(code), error=str(exc))

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
        self.count_unreachable()
        self.read_nodes()
        self.apply_brakes()
        self.hold_unknown_capacity()
        self.wait_for_drains(now)
        self.apply_floors(ladder)
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

    def count_unreachable(self) -> None:
        """The hosts the scan could not reach; within the policy's share (``unreachable.max_pct``) they do
        not fail the pass (the floors count them either way). One line when there are any."""
        hosts = self.inputs.scan_report.get("hosts") or {}
        result, share = self.result, self.inputs.policy.unreachable
        result.unreachable = sorted(
            h for h, e in hosts.items() if isinstance(e, Mapping) and e.get("status") == "unreachable"
        )
        result.unreachable_limit = share.limit(len(hosts))
        count, limit = len(result.unreachable), result.unreachable_limit
        if not count or not share.max_pct:  # none tolerated: each host's own line says it was not scanned
            return
        told = f"{count} of {len(hosts)} host(s) unreachable"
        if count <= limit:
            self.say(
                f"{told}, within the policy's {share.max_pct:g}% ({limit}): reported, left at their ladders and "
                "counted against the floors; the pass does not fail for them",
                "warning",
            )
        else:
            self.warn(
                f"{told}, more than the policy's unreachable.max_pct {share.max_pct:g}% ({limit}): the pass fails"
            )

    def read_nodes(self) -> None:
        """The schedulers' view (``inputs.nodes``): one line for the nodes out of scheduling, one per backend
        that could not be read (the pass fails) or was not read."""
        reading, result = self.inputs.nodes, self.result
        if reading is None:
            return
        out = reading.out()
        result.nodes_out = {h: s.to_dict() for h, s in sorted(out.items())}
        if out:
            shown = "; ".join(f"{h} {s.why()}" for h, s in sorted(out.items())[:20])
            more = f"; and {len(out) - 20} more" if len(out) > 20 else ""
            self.say(f"nodes out of scheduling: {len(out)} ({shown}{more})", "dim")
        for line in reading.skipped:
            self.say(f"nodes: {line}", "dim")
        for line in reading.failures:
            result.node_failures.append(line)
            self.warn(f"nodes: {line}: the pass fails, and takes no disruptive action in its hosts' groups")

    def hold_unknown_capacity(self) -> None:
        """A disruptive rung in a group whose nodes could not be read (``inputs.nodes.unknown``) waits
        (status ``floor``): the group's capacity is unknown."""
        reading = self.inputs.nodes
        if reading is None or not reading.unknown:
            return
        unknown = {self.group_of(h) or NO_GROUP: why for h, why in reading.unknown.items()}
        self.result.decisions = [
            dataclasses.replace(
                d,
                status="floor",
                action=None,
                reason=f"floor: the capacity of group {d.group} is unknown ({unknown[d.group]})",
            )
            if d.status == "act" and _disruptive(d.action) and d.group in unknown
            else d
            for d in self.result.decisions
        ]

    def wait_for_drains(self, now: float) -> None:
        """A disruptive rung (reboot, stop-start, replace) on a Slurm node that fleetops drained and whose
        jobs still run waits (status ``wait``) until the node is DRAINED: a pass never kills a job by
        acting before its node has drained — unless the rung's ``drain_wait`` since the drain has passed,
        as the policy says; then it acts, and says so."""
        reading = self.inputs.nodes
        if reading is None:
            return
        decisions = []
        for d in self.result.decisions:
            state = reading.states.get(d.host)
            draining = (
                state is not None and state.backend == "slurm" and state.phase == "draining" and state.ours
            )
            if (
                state is None
                or not draining
                or d.status != "act"
                or d.action == "quarantine"
                or not _disruptive(d.action)
            ):
                decisions.append(d)
                continue
            rule = self.inputs.policy.rule(d.rule) if d.rule is not None else None
            rung = rule.ladder[d.rung] if rule is not None and d.rung is not None else None
            bound = f" or {rung.drain_wait} after the drain (drain_wait)" if rung and rung.drain_wait else ""
            waited = now - state.since if state.since is not None else None
            if (
                rung is not None
                and rung.drain_wait_s is not None
                and waited is not None
                and waited >= rung.drain_wait_s
            ):
                self.warn(
                    f"{d.host}: Slurm node {state.node} still drains {fmt_duration(int(waited))} after fleetops "
                    f"drained it, past the rung's drain_wait {rung.drain_wait}: {d.action} goes ahead on the jobs "
                    "still running"
                )
                decisions.append(d)
                continue
            decisions.append(
                dataclasses.replace(
                    d,
                    status="wait",
                    action=None,
                    reason=f"waits for Slurm node {state.node} to drain (its jobs still run): {d.rung_action} "
                    f"starts once it is DRAINED{bound}",
                )
            )
        self.result.decisions = decisions

    def apply_brakes(self) -> None:
        """The storm brake: rules this pass shows in a storm trip (recorded with ``apply``, told once), and
        every brake in force holds its rule's braked rungs (reboot, stop-start, replace) fleet-wide."""
        inputs, result = self.inputs, self.result
        failed = {
            h: self.group_of(h) or NO_GROUP
            for h, state in (inputs.nodes.states.items() if inputs.nodes is not None else ())
            if state.failed
        }
        tripped = storm_brakes(inputs.policy, result.decisions, self.sizes, failed)
        in_force = {r: str(b.get("why") or "") for r, b in self.brakes.items()}
        new = {r: w for r, w in tripped.items() if r not in in_force}
        in_force.update(new)
        if not in_force:
            return
        result.decisions = hold_for_brakes(
            result.decisions, in_force, lambda a: a in REMEDIATIONS and REMEDIATIONS[a].braked
        )
        result.brakes = {
            r: {"why": w, "since": self.brakes.get(r, {}).get("since"), "new": r in new}
            for r, w in in_force.items()
        }
        for rule, why in sorted(in_force.items()):
            if rule in new:
                self.warn(
                    f"storm brake tripped on rule {rule}: {why}; its reboot, stop-start and replace rungs are held "
                    f"fleet-wide until a person lifts it ('fleetops remediate auto --lift-brake {rule}')"
                )
            else:
                self.say(f"storm brake on rule {rule} holds: {why}", "dim")
        if inputs.apply and new:
            self.trip(new)

    def apply_floors(self, ladder: LadderState) -> None:
        """The capacity floors (the policy's ``floor``): per group, the hosts out of service now —
        unreachable or failed in the scan, quarantined (a ladder's or a cleared ladder's taint), left half
        done by a dead pass (``in_flight``) — and the ones this pass takes; a disruptive action that would
        leave its group below the floor waits (status ``floor``). One line per group with such an action."""
        inputs, result = self.inputs, self.result
        policy = inputs.policy
        if policy.floor is None and not any(r.floor is not None for r in policy.rules):
            return
        unavailable: dict[str, tuple[str, str]] = {}
        for host, entry in (inputs.scan_report.get("hosts") or {}).items():
            if isinstance(entry, Mapping) and entry.get("status") != "ok":
                unavailable[host] = (
                    self.group_of(host) or NO_GROUP,
                    str(entry.get("status") or "not scanned"),
                )
        quarantined = {
            host: self.group_of(host) or NO_GROUP
            for host, rules in ladder.hosts.items()
            if any(rec.quarantined for rec in rules.values())
        }
        quarantined.update({d.host: d.group for d in result.decisions if d.still_quarantined})
        for host, group in quarantined.items():
            unavailable.setdefault(host, (group, "quarantined"))
        for host, why in self.in_flight.items():
            unavailable.setdefault(host, (self.group_of(host) or NO_GROUP, why))
        for host, state in (inputs.nodes.out() if inputs.nodes is not None else {}).items():
            if state.ours:  # a quarantine of ours a cleared ladder left standing counts against the cap
                quarantined.setdefault(host, self.group_of(host) or NO_GROUP)
            unavailable.setdefault(host, (self.group_of(host) or NO_GROUP, state.why()))
        result.decisions, capacity = hold_for_floors(
            policy,
            result.decisions,
            self.sizes,
            unavailable,
            quarantined,
            _disruptive,
        )
        result.capacity = [
            {"group": c.group, "size": c.size, "unavailable": dict(c.unavailable), "taken": list(c.taken),
             "keep": c.keep, "held": list(c.held)}
            for c in capacity
        ]  # fmt: skip
        for c in capacity:
            self.say(c.line(), "warning" if c.held else "dim")

    def write_mirror(
        self, ladder: LadderState, ledger: BudgetLedger, malformed: set[tuple[str, str]]
    ) -> None:
        """Each selected EC2 host's ladder and spent tags as this pass leaves them (and a replaced host's
        spent tag on its new instance): the record without a store, a readable mirror with one."""
        inputs, result = self.inputs, self.result
        windows = {a: float(b.window_s) for a, b in inputs.policy.limits.items()}
        then = self.clock()
        result.tags_after = {
            h: {
                key: t.shown(key) if (h, key) in malformed else value  # a bad tag: left as found
                for key, value in (
                    (TAG_KEY, ladder.tag_value(h)),
                    (SPENT_TAG_KEY, ledger.tag_value(h, windows, then)),
                )
            }
            for h, t in inputs.tags.items()
        }
        if inputs.connection is None or not inputs.tags:
            return

        def tag_failed(host: str, why: str) -> None:
            result.tag_failures.append(host)
            where = "the shared store" if inputs.store is not None else "the state directory"
            self.warn(f"{host}: {why}; {where} has its ladders and the budgets spent")

        result.tag_writes = write_tags(
            inputs.connection,
            inputs.tags,
            {h: t[TAG_KEY] for h, t in result.tags_after.items()},
            TAG_KEY,
            failed=tag_failed,
        )
        result.spent_writes = write_tags(
            inputs.connection,
            inputs.tags,
            {h: t[SPENT_TAG_KEY] for h, t in result.tags_after.items()},
            SPENT_TAG_KEY,
            failed=tag_failed,
        )
        # a replaced host's budget record travels to its new instance
        new = {
            iid: (TagTarget(iid, region, None, None), result.tags_after[host][SPENT_TAG_KEY])
            for r in result.runs
            for host, (iid, region) in r.replacements.items()
            if host in result.tags_after
            and result.tags_after[host][SPENT_TAG_KEY]
            and (host, SPENT_TAG_KEY) not in malformed  # a tag left as found is not copied
        }
        carried = write_tags(
            inputs.connection,
            {iid: target for iid, (target, _v) in new.items()},
            {iid: value for iid, (_t, value) in new.items()},
            SPENT_TAG_KEY,
            failed=tag_failed,
        )
        result.carried = {iid: v for iid, v in carried.items() if v is not None}

    # ---- with the shared store

    def seed(self, state: StoredState) -> set[tuple[str, str]]:
        """The upgrade path, once per store: what the EC2 tags and this controller's state directory
        record is merged into the store (the record tried last wins; an action within a second of one
        already there is the same action). A dry run merges in memory only."""
        ladder_path, ledger_path = self.inputs.state_dir / LADDER_FILE, self.inputs.state_dir / LEDGER_FILE
        with _state_locks(self.inputs.state_dir):
            ladder, ledger = _load_state(ladder_path, ledger_path)
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

    def finish_in_flight(self, state: StoredState) -> None:
        """Finish every action a dead pass left half done on an EC2 instance (``Remediation.in_flight``: a
        stop-start stopped and never started, a replace whose group may still be launching), through the
        collection module's ``finish_instance`` — whether or not the inventory still lists the instance. A
        finisher that names new instances (a replace's) finishes only once this pass's scan has each of
        them clean; until then the journal keeps them. One that cannot be finished now fails the pass
        (exit 3) and is tried again by the next."""
        finishers = {name: r.in_flight for name, r in REMEDIATIONS.items() if r.in_flight}
        result = self.result
        changed = False
        for entry, journal in state.unfinished(finishers):
            instance = str(journal["instance"])
            where = f"{entry.host} ({instance})"
            if self.inputs.connection is None:
                result.unfinished.append(where)
                self.warn(
                    f"{where}: the {entry.action} a dead pass left may be half done, and this inventory "
                    "has no EC2 source to finish it with"
                )
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
                    result.unfinished.append(where)
                    self.warn(
                        f"{where}: failed to finish the {entry.action} a dead pass left: {exc}; the next "
                        "pass tries again"
                    )
                    continue
                msg = str(done.get("msg", "done"))
                if done.get("new_instances"):
                    journal["new_instances"] = [str(i) for i in done["new_instances"]]
                    changed = True
            why = self.not_scanned_clean(journal.get("new_instances") or [])
            if why is not None:
                result.unfinished.append(where)
                told = f": {msg}; it" if msg else ""
                self.warn(
                    f"{where}: the {entry.action} a dead pass left{told} is not finished: {why}; the next "
                    "pass looks again"
                )
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
                self.say(
                    f"{entry.host}: {what} would be run again{unsettled}"
                    + (" once automation is unpaused" if paused else " (dry run)"),
                    "warning",
                )
                continue
            params = {k: v for k, v in inputs.extra_params.get(entry.action, {}).items()}
            params.update(journal["rerun"])
            params = {k: v for k, v in params.items() if k in remediation.params}
            group = groups.setdefault((entry.action, _freeze(params)), (params, []))
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

    def run_with_store(self, store: Store) -> None:
        inputs, result = self.inputs, self.result
        result.store = store.where()
        store.ready()  # created on first use; refuses a controller whose clock is off the store's
        pass_id = f"auto-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(self.clock()))}-{secrets.token_hex(3)}"
        lease = PassLease(store, pass_id, inputs.operator or controller_id()) if inputs.apply else None
        if lease is not None:
            lease.take()
            if lease.took_over:
                self.warn(f"took over the shared store's lease: {lease.took_over}")
        try:
            state = StoredState(store)
            state.load()
            for line in state.malformed:
                self.warn(line)
            result.malformed_store = list(state.malformed)
            self.brakes = store.brakes()
            operator = inputs.operator or controller_id()

            def trip(new: Mapping[str, str]) -> None:
                for rule, why in sorted(new.items()):
                    store.trip_brake(rule, why, operator)

            self.trip = trip
            malformed: set[tuple[str, str]] = set()
            if not state.seeded:
                malformed = self.seed(state)
            if inputs.apply:
                for line in state.recover(pass_id):
                    self.warn(line)
                    result.recovered.append(line)
                self.finish_in_flight(state)
            pause = store.paused()
            if pause is not None:
                result.paused = pause.describe()
                self.say(f"{pause.describe()}: nothing acts until 'fleetops unpause'", "warning")
            go_on = self.rerun_in_doubt(state, lease, paused=pause is not None)
            reserved: dict[str, dict[str, str]] = {}
            controller = controller_id()

            def before(action: str, decisions: Sequence[Decision]) -> str | None:
                if lease is not None and lease.lost is not None:
                    result.store_failure = f"the shared store's lease was lost: {lease.lost}"
                    return result.store_failure
                try:
                    paused = store.paused()
                    if paused is not None:
                        result.paused = paused.describe()
                        return paused.describe()
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
                    state.settle(reserved.pop(action), run.attempted | run.cannot_act, action, self.clock())

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
                        except StoreFailure as exc:
                            result.store_failure = str(exc)
                            self.warn(str(exc))
                        self.write_mirror(state.ladder, state.ledger, malformed)
        finally:
            if lease is not None:
                lease.release()
