"""What every part of a pass shares: its inputs (:class:`PassInputs`) and :class:`PassBase` (the
result it fills, the groups, the warnings, running one action, and the EC2 tags it leaves)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.auto.result import (
    ActionRun,
    PassResult,
    RunAction,
    Say,
)
from fleetops.auto.seen import FleetRecord, Sighting
from fleetops.auto.tags import TagTarget, merge_tags, write_tags
from fleetops.errors import FleetopsError
from fleetops.exitcodes import ExitCode
from fleetops.nodes import NodeReading
from fleetops.policy import (
    NO_GROUP,
    SPENT_TAG_KEY,
    TAG_KEY,
    BudgetLedger,
    Decision,
    LadderState,
    Policy,
)
from fleetops.rollout.lease import Ec2Connection
from fleetops.store import Store


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
    # hosts of the fleet whose instance the inventory lists as not running -> why (the floors count them)
    stopped: Mapping[str, str] = field(default_factory=dict)


# Why a batch must not start (pause, lease lost, store unreachable), or None; given the action and its
# decisions. It may reserve the batch's budget in the store.
Before = Callable[[str, Sequence[Decision]], str | None]
After = Callable[[str, ActionRun], None]


@dataclass
class PassBase:
    """A pass's inputs, its result as it grows, and what every part of it uses (see :mod:`fleetops.auto`)."""

    inputs: PassInputs
    result: PassResult
    run_action: RunAction
    say: Say
    clock: Callable[[], float]
    shield: Callable[[], contextlib.AbstractContextManager[Any]]

    def __post_init__(self) -> None:
        # host -> what the store has in flight on it: another pass's batch, a step a dead pass left half done
        self.in_flight: dict[str, str] = {}
        self.brakes: dict[str, dict[str, Any]] = {}  # the storm brakes in force before this pass
        self.trip: Callable[[Mapping[str, str]], None] = lambda new: None  # record brakes this pass trips
        self.seen = FleetRecord()  # what the passes recorded of each host (fleetops.auto.seen)
        self.saw: dict[str, Sighting] = {}  # what this pass saw, once it decided
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
