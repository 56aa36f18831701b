"""Remediation policy (``fleetops.policy/v1``) and the pure decision of ``remediate auto``.

A policy is a YAML file: for each kind of finding (a rule: check, severities, optional data match)
an ordered **ladder** of actions, each rung with the time it gets to clear the finding before the
next rung is tried, and per-action **budgets** (at most N per window across the fleet, and per group
a count and a percent: the smaller wins; every action a ladder names needs one, ``{unlimited: true}``
said outright)::

    schema: fleetops.policy/v1
    budgets:
      quarantine: {window: 1h, max: 20, per_group_pct: 20}
      stop-start: {window: 1h, max: 10, per_group: 2}
      replace: {window: 1h, per_group: 1}
    rules:
      - name: gpu-fatal
        match:
          - check: gpu_health
            severity: [critical]
            data: {xid: {has_any: ["79", "48"]}}
          - check: gpu_health
            data: {gpus.*.remapped_rows_failure: true}
        ladder:
          - {action: quarantine, clear_after: 10m}
          - {action: stop-start, clear_after: 30m}
          - {action: replace, clear_after: 1h}
          - {action: human, note: "hardware keeps failing on new instances: open a case"}

``decide`` is pure: given the policy, a scan report (``fleetops.scan/v1``), the per-host
:class:`LadderState` (which rung was tried when) and the :class:`BudgetLedger` (which actions were
taken when, in which group), it says for each host the rule that matched, the rung, and the action
to take now or why none ("waiting: rung reboot tried 4 min ago, gets 15 min", "budget: replace 1/h
in group us-east-1a used", "needs a human: ...", "clean"). It changes nothing: after the engine ran
the actions, ``commit`` records them (ladder and ledger) and applies the resets the scan showed.

Matching: the rules are tried in order and the first rule with a matching ``match`` entry takes a
finding; a host whose findings match several rules acts on the earliest of them (hardware first in
the default policy), the others wait their turn. A ``match`` entry holds when the check is the
finding's, its severity is listed (default: warning and critical) and every ``data`` condition
holds. A condition's key is a dotted path into the finding's ``data`` (``*`` is any element of a
list or any value of a mapping; the condition holds when any value found satisfies it); its value is
a plain value (equality) or operators: ``eq``, ``in``, ``glob``, ``gt``, ``gte``, ``lt``, ``lte``,
``has_any`` (a mapping's keys or a list's elements) and ``exists``, all of which must hold.

A ladder climbs only while its finding persists: the first rung is taken when the rule first
matches; the next when the finding is still there ``clear_after`` after the current rung was
tried; a host that scans without the finding has that ladder reset (a later recurrence starts at
the first rung again); a host that was not scanned keeps its ladder as it is. ``human`` is a note,
not an action: a ladder that reaches it, or runs out of rungs, says "needs a human" every pass.

Budgets count what the ledger holds in the window before ``now`` (an entry's time is when its host
was acted on; one reserved and not yet settled counts whatever its time): ``max`` across the fleet,
``per_group`` in the host's group, and ``per_group_pct`` percent of the group's hosts (rounded down,
but at least 1: a percent budget never forbids an action outright; ``per_group: 0`` does). With
both, the smaller wins. An action without a budget is not limited by the policy (the engine's own
caps and capacity floor still hold).

State files (``LadderState``, ``BudgetLedger``) are JSON, written atomically, 0600; ``locked(path)``
holds an exclusive lock on a side file while a controller reads, decides and writes, so two
controllers sharing the files (an operator and AWX) never both spend the last of a budget. One pass
of ``remediate auto`` (take the locks in this order, ladder first)::

    with LadderState.locked(ladder_path) as ladder, BudgetLedger.locked(ledger_path) as ledger:
        decisions = decide(policy, scan_report, ladder, ledger, time.time(), group_of)
        ...  # print d.line() for each; run the "act" decisions through the engine
        commit(decisions, ladder, ledger, time.time(), taken=lambda d: d.host in ran_ok)

On EC2 a host's ladders also travel in the tag ``TAG_KEY`` (``LadderState.tag_value`` after each
pass, ``merge_tag`` before the next: the record tried last wins), so a controller with another state
directory climbs from where the first left off. A ladder that quarantined a host and then cleared
says so (``Decision.still_quarantined``): the taint stays until someone releases it. The budgets
spent travel in a tag of their own, ``SPENT_TAG_KEY`` (``BudgetLedger.tag_value`` / ``merge_tag``):
every budgeted action taken on the host within its budget's window, whether or not its ladder is
still open. A fault that a stop-start cleared resets the ladder (and deletes its tag), but that
stop-start still counts against the budget on every controller until its window has passed.

The package, by concern (each module imports only those before it):

- :mod:`~fleetops.policy.language`: the policy's model, its validation and loading, ``matches``;
- :mod:`~fleetops.policy.records`: ``RungRecord`` and ``LedgerEntry``, what state and tags hold;
- :mod:`~fleetops.policy.tags`: the EC2 tag codec (``TAG_KEY``, ``SPENT_TAG_KEY``);
- :mod:`~fleetops.policy.state`: ``LadderState``, ``BudgetLedger``, their files and ``file_lock``;
- :mod:`~fleetops.policy.decide`: ``decide``, ``commit``, ``Decision`` and ``Spending``, the one
  place budgets are counted;
- :mod:`~fleetops.policy.lint`: what loads but never matches (data keys no finding declares, entries
  an earlier rule always takes first), for ``fleetops policy check``;
- :mod:`~fleetops.policy.schema`: the JSON Schema and ``python -m fleetops.policy`` (``--check``: the
  same check).
"""

from __future__ import annotations

from fleetops.policy.decide import (
    NO_GROUP,
    Decision,
    GroupCapacity,
    Spending,
    Status,
    commit,
    decide,
    hold_for_brakes,
    hold_for_floors,
    storm_brakes,
)
from fleetops.policy.language import (
    ACTIONS,
    CHECKS,
    DEFAULT_SEVERITIES,
    DURATION_PATTERN,
    HUMAN,
    MAX_WINDOW_S,
    POLICY_SCHEMA,
    RULE_NAME,
    Action,
    Budget,
    Condition,
    Duration,
    Floor,
    Match,
    Ops,
    Policy,
    Rule,
    Rung,
    Scalar,
    Storm,
    Unreachable,
    default_policy_path,
    duration_seconds,
    fmt_duration,
    load_policy,
    matches,
    parse_policy,
    validate_policy,
)
from fleetops.policy.records import LedgerEntry, RungRecord
from fleetops.policy.schema import SCHEMA_NAME, json_schema, json_schema_text, main
from fleetops.policy.state import (
    LADDER_SCHEMA,
    LEDGER_SCHEMA,
    LOCK_TIMEOUT_S,
    BudgetLedger,
    LadderState,
    StateError,
    controller_id,
    file_lock,
)
from fleetops.policy.tags import CLOCK_SKEW_S, FROM_LADDER_TAG, FROM_TAG, SPENT_TAG_KEY, TAG_KEY, TAG_MAX

__all__ = [
    "ACTIONS",
    "CHECKS",
    "CLOCK_SKEW_S",
    "DEFAULT_SEVERITIES",
    "DURATION_PATTERN",
    "FROM_LADDER_TAG",
    "FROM_TAG",
    "HUMAN",
    "LADDER_SCHEMA",
    "LEDGER_SCHEMA",
    "LOCK_TIMEOUT_S",
    "MAX_WINDOW_S",
    "NO_GROUP",
    "POLICY_SCHEMA",
    "RULE_NAME",
    "SCHEMA_NAME",
    "SPENT_TAG_KEY",
    "TAG_KEY",
    "TAG_MAX",
    "Action",
    "Budget",
    "BudgetLedger",
    "Condition",
    "Decision",
    "Duration",
    "Floor",
    "GroupCapacity",
    "LadderState",
    "LedgerEntry",
    "Match",
    "Ops",
    "Policy",
    "Rule",
    "Rung",
    "RungRecord",
    "Scalar",
    "Spending",
    "StateError",
    "Status",
    "Storm",
    "Unreachable",
    "commit",
    "controller_id",
    "decide",
    "default_policy_path",
    "duration_seconds",
    "file_lock",
    "fmt_duration",
    "hold_for_brakes",
    "hold_for_floors",
    "json_schema",
    "json_schema_text",
    "load_policy",
    "main",
    "matches",
    "parse_policy",
    "storm_brakes",
    "validate_policy",
]
