"""The models of the documents fleetops reads back (see :mod:`fleetops.schemas`): the base, the
plan (``fleetops.plan/v1``), the rollout state (``fleetops.rollout.engine-state/v1``) and the list of
rollouts (``fleetops.rollouts/v1``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from fleetops.documents import (
    FieldProblem,
    OpenModel,
)
from fleetops.util import PLAN_SCHEMA, ROLLOUT_CUT_OFF, ROLLOUT_ID_PATTERN, ROLLOUTS_SCHEMA

STATE_SCHEMA = "fleetops.rollout.engine-state/v1"
# Unix times fleetops writes: from 1970 up to the last second of year 9999 (time.localtime's range).
MAX_EPOCH = 253402300799.0


# --------------------------------------------------------------------------------------- models


_Open = OpenModel  # strict types for the fields named here; any other key is allowed (formats grow)


NonNegInt = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH, description="Unix time (seconds)")]
HostName = Annotated[str, Field(min_length=1)]
Severity = Literal["critical", "warning", "info"]
# findings.COVERAGE_LEVELS and ANSWERED_STATUSES, spelled as types (tests/fleetops/test_coverage.py holds them equal)
CoverageLevel = Literal["full", "partial", "none"]
Dimension = Literal["az", "ami", "kernel", "instance_type"]


# ------------------------------------------------------------------ plan (fleetops.plan/v1)


class PlanCaps(_Open):
    max_parallel: str = Field(description="as given: a count ('3') or a percent ('10%')")
    max_parallel_hosts: NonNegInt
    per_group_max: NonNegInt | None = Field(description="null: no per-group cap")
    canary: NonNegInt


Batches = Annotated[
    list[Annotated[list[HostName], Field(min_length=1)]],
    Field(description="exact host names, in order; the first is the canary batch when caps.canary > 0"),
]


def _check_batches(batches: list[list[str]], hosts: int | None) -> None:
    """A host is in one batch only; ``hosts``, when given, counts the hosts in the batches."""
    seen: set[str] = set()
    for i, batch in enumerate(batches):
        for host in batch:
            if host in seen:
                raise FieldProblem(("batches", i), f"host {host!r} is in more than one batch")
            seen.add(host)
    if hosts is not None and hosts != len(seen):
        raise FieldProblem(("hosts",), f"is {hosts} but the batches hold {len(seen)} host(s)")


class PlanDocument(_Open):
    """``fleetops plan --format json``."""

    model_config = ConfigDict(title=PLAN_SCHEMA)

    schema_: Literal["fleetops.plan/v1"] = Field(alias="schema")
    action: str = Field(min_length=1)
    batches: Batches
    excluded: list[str]
    caps: PlanCaps
    lower_bound: NonNegInt
    groups: dict[str, list[HostName]]
    group_by: str
    hosts: NonNegInt = Field(description="the number of hosts in the batches")
    notes: list[str]

    @model_validator(mode="after")
    def _batches_consistent(self) -> Self:
        _check_batches(self.batches, self.hosts)
        return self


class RolloutPlan(_Open):
    """The ``plan`` a rollout state carries: the plan document it was started with. The engine
    needs only ``batches``; the other fields, when present, are those of PlanDocument."""

    schema_: Literal["fleetops.plan/v1"] | None = Field(default=None, alias="schema")
    action: str | None = None
    batches: Batches
    excluded: list[str] | None = None
    caps: PlanCaps | None = None
    lower_bound: NonNegInt | None = None
    groups: dict[str, list[HostName]] | None = None
    group_by: str | None = None
    hosts: NonNegInt | None = None
    notes: list[str] | None = None

    @model_validator(mode="after")
    def _batches_consistent(self) -> Self:
        _check_batches(self.batches, self.hosts)
        return self


# ------------------------------------------------------- rollout state (engine-state/v1)


HostState = Literal["pending", "running", "done", "failed", "skipped"]
RolloutStatus = Literal["running", "done", "stopped", "interrupted", "refused"]


class HostOutcome(_Open):
    """One host's last outcome (rollout/outcome.py HostOutcome.to_dict)."""

    status: Literal["ok", "failed", "unreachable", "skipped", "running"]
    changed: bool = False
    msg: str | None = None
    result: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    gate: str | None = Field(default=None, description="why the host failed its gate")
    notes: list[str] = Field(default_factory=list)


class BatchRecord(_Open):
    index: Annotated[int, Field(ge=1)]
    hosts: list[HostName]
    started: Epoch
    finished: Epoch | None = Field(description="null: cut short")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.finished is not None and self.finished < self.started:
            raise FieldProblem(("finished",), "before started")
        return self


class Stopped(_Open):
    after_batch: NonNegInt
    reason: str
    pending: list[HostName]
    in_doubt: list[HostName] = Field(default_factory=list)


class LeaseInstance(_Open):
    instance: str = Field(min_length=1)
    region: str


class Lease(_Open):
    ttl: Annotated[float, Field(gt=0)] | None = None
    settle: Seconds | None = None
    instances: dict[str, LeaseInstance] = Field(default_factory=dict)


class RolloutState(_Open):
    """A rollout's state file (rollout/state.py ``Rollout``): what ``--resume`` and ``report`` read."""

    model_config = ConfigDict(title=STATE_SCHEMA)

    schema_: Literal["fleetops.rollout.engine-state/v1"] = Field(alias="schema")
    id: str = Field(pattern=ROLLOUT_ID_PATTERN)
    action: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    apply: bool
    inventory: list[str]
    extravars: dict[str, Any]
    plan: RolloutPlan
    max_failures: NonNegInt
    cooldown: Seconds
    gate: bool
    state_path: str
    operator: str = ""
    created: Epoch = 0.0
    status: RolloutStatus = "running"
    hosts: dict[str, HostState] = Field(default_factory=dict)
    results: dict[str, HostOutcome] = Field(default_factory=dict)
    batches: list[BatchRecord] = Field(default_factory=list)
    preflight: dict[str, str | None] = Field(default_factory=dict)
    stopped: Stopped | None = None
    lease: Lease | None = None

    @model_validator(mode="after")
    def _planned_hosts_known(self) -> Self:
        for batch in self.plan.batches:
            for host in batch:
                if host not in self.hosts:
                    raise FieldProblem(("hosts",), f"no entry for planned host {host!r}")
        return self


# -------------------------------------------------------------- rollouts (fleetops.rollouts/v1)


class RolloutRow(_Open):
    id: str = Field(description="the rollout id, or the id part of an unreadable state file's name")
    action: str = Field(min_length=1)
    status: str = Field(
        description=f"the saved status (running, done, stopped, interrupted, refused); {ROLLOUT_CUT_OFF!r} for "
        "one saved as running that no live process of this controller holds; 'unreadable' for a state file "
        "that does not load (error says why)"
    )
    apply: bool
    started: Epoch | None
    operator: str
    hosts: NonNegInt
    done: NonNegInt
    failed: NonNegInt
    pending: NonNegInt = Field(description="pending, running or skipped: not yet done")
    state: str = Field(description="the state file's path (fleetops report takes it, or the id)")
    error: str


class RolloutsDocument(_Open):
    """``fleetops rollouts --format json``: the rollouts this controller keeps, newest first."""

    model_config = ConfigDict(title=ROLLOUTS_SCHEMA)

    schema_: Literal["fleetops.rollouts/v1"] = Field(alias="schema")
    rollouts: list[RolloutRow]
