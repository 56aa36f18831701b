"""The model of ``fleetops.auto/v1``: what one ``remediate auto`` pass decided and did.

``remediate auto --format json`` prints it, AWX keeps it as the job's artifact (``playbooks/
remediate_auto.yml``), the Prometheus file is derived from it (``fleetops.metrics.build_auto_registry``)
and the pass's audit line names its decisions. ``schemas/auto-pass.schema.json`` is generated from this
model (``python -m fleetops.schemas --write schemas``) and a test validates a real pass's output with it.

As the other documents' models (``fleetops.schemas``): strict where a reader relies on a field, open
(extra keys allowed) elsewhere. ``rung`` counts from 1, as the text does (``rule r rung 1/4``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from fleetops.documents import OpenModel

AUTO_SCHEMA = "fleetops.auto/v1"

# What a pass decides for a host (``fleetops.policy.decide.Status`` is this).
DecisionStatus = Literal[
    "act", "wait", "budget", "brake", "floor", "human", "exhausted", "clean", "no_rule", "not_scanned"
]
_NonNegInt = Annotated[int, Field(ge=0)]
_Name = Annotated[str, Field(min_length=1)]


class AutoDecision(OpenModel):
    """One host's decision (``fleetops.policy.decide.Decision.to_dict``)."""

    host: _Name
    group: str
    status: DecisionStatus
    reason: str
    rule: str | None
    check: str | None
    severity: Literal["critical", "warning", "info"] | None
    summary: str | None
    rung: Annotated[int, Field(ge=1)] | None = Field(
        description="the rung of the rule's ladder taken now, waited on or blocked, counted from 1 as the "
        "text says it (rung 1/4); null: no rule"
    )
    rungs: _NonNegInt = Field(description="the ladder's length")
    rung_action: str | None
    action: str | None = Field(description="the action taken now; null: none")
    params: dict[str, Any]
    waiting_rules: list[str]
    reset: list[str]
    still_quarantined: list[str]
    blind: list[str] | None = None
    what_if: Literal[True] | None = Field(
        default=None,
        description="a what-if (remediate auto --from): this action was not taken; absent in a pass",
    )


class AutoAction(OpenModel):
    """One action's rollout over exactly its hosts."""

    action: _Name
    hosts: list[_Name]
    params: dict[str, Any]
    done: list[_Name]
    attempted: list[_Name]
    exit_code: _NonNegInt
    error: str | None
    rollout: dict[str, Any] | None = Field(description="the rollout's report (fleetops.rollout.engine/v1)")


class AutoUnreachable(OpenModel):
    hosts: list[_Name]
    limit: _NonNegInt
    tolerated: bool


class AutoWaiting(OpenModel):
    """The hosts that wait for a person and the storm brakes in force: not a failed pass (exit 0) unless
    ``fail_on`` is human (exit 1)."""

    hosts: list[_Name] = Field(description="hosts whose ladder reached `human` or ran out")
    brakes: list[_Name] = Field(description="rules a storm brake holds (fleetops brake lift RULE)")
    fail_on: Literal["never", "human"] = Field(description="remediate auto --fail-on: human made them exit 1")


class AutoWhatIf(OpenModel):
    from_: str = Field(alias="from", description="the saved scan report (fleetops.scan/v1) decided against")


class AutoPass(OpenModel):
    """``fleetops remediate auto --format json``; the AWX job's artifact."""

    model_config = ConfigDict(title=AUTO_SCHEMA)

    schema_: Literal["fleetops.auto/v1"] = Field(alias="schema")
    apply: bool = Field(description="false: a dry run (check mode; nothing recorded)")
    policy: str
    decisions: list[AutoDecision]
    actions: list[AutoAction]
    ladder_tags: dict[str, Any]
    spent_tags: dict[str, Any]
    warnings: list[str]
    exit_code: _NonNegInt
    unreachable: AutoUnreachable | None = None
    waiting_for_person: AutoWaiting | None = Field(
        default=None, description="hosts that wait for a person, storm brakes; absent when none"
    )
    what_if: AutoWhatIf | None = Field(
        default=None,
        description="remediate auto --from: decided against a saved scan, nothing run or recorded",
    )
