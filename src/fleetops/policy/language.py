"""The policy language (``fleetops.policy/v1``): its model, its validation and its matching.

A policy file is YAML (or JSON); :func:`load_policy` and :func:`parse_policy` read it into a frozen
:class:`Policy` or raise one-line DocumentErrors (unknown keys, unknown checks and actions, a rung
after ``human``, a budget without a limit, duplicate keys or rule names). :func:`matches` says
whether a finding is of a rule's ``match`` entry (see the package's docstring for the operators).
Nothing here reads or writes state.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import operator
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from fleetops.documents import (  # the one-line DocumentError every document of fleetops uses
    DocumentError,
    FieldProblem,
    raise_validation,
    read_document,
)
from fleetops.remediations import REMEDIATIONS, ladder_order
from fleetops.schemas import FINDING_DATA_KEYS, Severity
from fleetops.util import DAY_S, HOUR_S

POLICY_SCHEMA = "fleetops.policy/v1"

HUMAN = "human"
# The ladder's actions: the remediations a rung can run (their declarations: ``ladder_order()``, in the
# order a pass runs them), and "human" (a note, nothing runs). Checked by pydantic (and the JSON Schema's
# enum); a plain string to the type checker, as the names are data.
ACTIONS: tuple[str, ...] = (*ladder_order(), HUMAN)
if TYPE_CHECKING:
    Action = str
else:
    Action = Literal[ACTIONS]
# The checks node_health reports (docs/guides/scanning.md, its detectors): the declaration of their
# findings' data keys names them; a rule naming another is a typo.
CHECKS: tuple[str, ...] = tuple(FINDING_DATA_KEYS)
DEFAULT_SEVERITIES: tuple[Severity, ...] = ("warning", "critical")
MAX_WINDOW_S = 7 * DAY_S  # the longest budget window; the ledger keeps entries this long
RULE_NAME = r"^[a-z0-9][a-z0-9_.-]*$"

_DURATION = re.compile(r"^(?:[0-9]+[smhd])+$")
_DURATION_PART = re.compile(r"([0-9]+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": HOUR_S, "d": DAY_S}
DURATION_PATTERN = _DURATION.pattern


def duration_seconds(text: str) -> int:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"``, ``"1h30m"`` in seconds; ValueError otherwise."""
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration: {text!r} (a number and s, m, h or d: 90s, 15m, 2h, 7d, 1h30m)")
    return sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))


def fmt_duration(seconds: float) -> str:
    """A short, rounded duration for a person: ``45 s``, ``4 min``, ``3 h``, ``2 d``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{int(seconds)} s"
    if seconds < 90 * 60:
        return f"{int(seconds // 60)} min"
    if seconds < 48 * HOUR_S:
        hours = seconds / HOUR_S
        return f"{hours:.0f} h" if hours >= 10 or hours == int(hours) else f"{hours:.1f} h"
    return f"{seconds / DAY_S:.0f} d"


def _check_duration(text: str) -> str:
    duration_seconds(text)
    return text


Duration = Annotated[
    str,
    AfterValidator(_check_duration),
    Field(
        json_schema_extra={"pattern": DURATION_PATTERN},
        description="a duration: a number and s, m, h or d (90s, 15m, 2h, 7d, 1h30m)",
    ),
]


# --------------------------------------------------------------------------------------- models


class _Strict(BaseModel):
    """Hand-written policy: every key is known (a typo is an error, not a silent default)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


Scalar = str | int | float | bool | None


class Ops(_Strict):
    """Operators of a data condition; all given must hold for one value at the path."""

    eq: Scalar = Field(default=None, description="equal to (types compared too: true is not 1)")
    in_: list[Scalar] | None = Field(default=None, alias="in", description="equal to one of these")
    glob: str | None = Field(default=None, description="a string matching this shell pattern (fnmatch)")
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None
    has_any: list[str | int] | None = Field(
        default=None,
        min_length=1,
        description="a mapping with one of these keys, or a list with one of these",
    )
    exists: bool | None = Field(default=None, description="true: the path holds a value; false: it does not")

    @model_validator(mode="after")
    def _something(self) -> Self:
        if not self.model_fields_set:
            raise FieldProblem((), "an empty condition: give a value or an operator (eq, in, glob, gt, ...)")
        return self


def _scalar_to_eq(value: Any) -> Any:
    return value if isinstance(value, dict) else {"eq": value}


Condition = Annotated[Ops, BeforeValidator(_scalar_to_eq, json_schema_input_type=Scalar | Ops)]


class Match(_Strict):
    """One kind of finding a rule takes."""

    check: str = Field(description="the finding's check (" + ", ".join(CHECKS) + ")")
    severity: list[Severity] = Field(
        default=list(DEFAULT_SEVERITIES),
        min_length=1,
        description="the severities taken (default warning, critical)",
    )
    data: dict[str, Condition] = Field(
        default_factory=dict,
        description="dotted path into the finding's data (* any element) -> a value or operators; all must hold",
    )

    @model_validator(mode="after")
    def _known_check(self) -> Self:
        if self.check not in CHECKS:
            raise FieldProblem(("check",), f"unknown check {self.check!r} (known: {', '.join(CHECKS)})")
        for path in self.data:
            if not path or any(not part for part in path.split(".")):
                raise FieldProblem(("data", path), "not a dotted path (empty part)")
        return self


class Rung(_Strict):
    """One step of a ladder."""

    action: Action
    clear_after: Duration | None = Field(
        default=None,
        description="the time this rung gets to clear the finding before the next is tried "
        "(required but on a last 'human' rung)",
    )
    note: str | None = Field(
        default=None, description="why this rung is here; for 'human', what the human should do"
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="parameters for the action's remediation, passed through as they are",
    )
    drain_wait: Duration | None = Field(
        default=None,
        description="a disruptive rung on a Slurm node fleetops drained waits for its jobs to end (DRAINED); "
        "at most this long after the drain, then it acts on the jobs still running (unset: as long as they run)",
    )

    @property
    def clear_after_s(self) -> int:
        return duration_seconds(self.clear_after) if self.clear_after is not None else 0

    @property
    def drain_wait_s(self) -> int | None:
        return duration_seconds(self.drain_wait) if self.drain_wait is not None else None

    @model_validator(mode="after")
    def _values(self) -> Self:
        if self.clear_after is not None and self.clear_after_s == 0:
            raise FieldProblem(("clear_after",), "must be more than 0: a rung gets time to clear the finding")
        if self.drain_wait is not None and self.drain_wait_s == 0:
            raise FieldProblem(("drain_wait",), "must be more than 0 (unset: wait as long as the jobs run)")
        remediation = REMEDIATIONS.get(self.action)
        if self.drain_wait is not None and (
            remediation is None or not remediation.disruptive or self.action == "quarantine"
        ):
            raise FieldProblem(
                ("drain_wait",),
                f"only a disruptive rung after a quarantine waits for a drain (reboot, stop-start, replace), not {self.action}",
            )
        for name, value in self.params.items():
            param = remediation.parameters_by_name.get(name) if remediation is not None else None
            if param is None:
                continue  # an unknown name: auto.check_policy_actions names what the action takes
            try:
                param.validate(value)
            except ValueError as err:
                raise FieldProblem(
                    ("params", name), f"remediate {self.action} {param.option}: {err}"
                ) from None
        return self


class Storm(_Strict):
    """The storm brake: one rule matching more hosts in one pass than a fault plausibly reaches at once (a
    driver bug that makes every GPU log Xid 79) holds that rule's disruptive rungs fleet-wide until a
    person lifts it; rungs that only protect work (quarantine) go on within their budgets."""

    fleet_pct: Annotated[float, Field(gt=0, le=100)] = Field(
        default=10, description="trip when the rule matches more than this percent of the fleet's hosts"
    )
    group_pct: Annotated[float, Field(gt=0, le=100)] = Field(
        default=30, description="... or more than this percent of one group's hosts"
    )
    min_hosts: Annotated[int, Field(ge=1)] = Field(
        default=3, description="neither limit is below this many hosts (a small fleet is not a storm at 1)"
    )

    def limit(self, pct: float, size: int) -> int:
        return max(self.min_hosts, math.floor(Fraction(str(pct)) * size / 100))

    def tripped(self, matched: int, fleet: int, groups: Mapping[str, tuple[int, int]]) -> str | None:
        """Why ``matched`` hosts of ``fleet`` (per group: (matched, size)) are a storm, or None."""
        limit = self.limit(self.fleet_pct, fleet)
        if matched > limit:
            return f"it matched {matched} of {fleet} hosts (more than {limit}: {self.fleet_pct:g}% of the fleet, at least {self.min_hosts})"
        for group, (n, size) in sorted(groups.items()):
            limit = self.limit(self.group_pct, size)
            if n > limit:
                return (
                    f"it matched {n} of {size} hosts in group {group} (more than {limit}: "
                    f"{self.group_pct:g}% of a group, at least {self.min_hosts})"
                )
        return None


class Floor(_Strict):
    """A capacity floor for the disruptive rungs (reboot, quarantine, stop-start, replace): per group, at
    least this many hosts stay available — counting hosts unreachable, quarantined, stopped or being
    replaced, and those this pass takes — and at most this share of a group stands quarantined. A host no
    pass or scan recorded recently (a limited pass does not scan it) is capacity unknown, or counted as
    available, as ``unrecorded`` says."""

    min_available_pct: Annotated[float, Field(ge=0, le=100)] = Field(
        default=50, description="percent of each group's hosts that stay available (rounded up)"
    )
    min_available: Annotated[int, Field(ge=0)] = Field(
        default=1, description="... and never fewer than this many hosts of a group"
    )
    max_quarantined_pct: Annotated[float, Field(gt=0, le=100)] | None = Field(
        default=None,
        description="at most this percent of a group stands quarantined (rounded down, at least 1)",
    )
    unrecorded: Literal["unknown", "available"] = Field(
        default="unknown",
        description="a host outside a limited pass that no pass or fleetops scan recorded in the last 30 min: "
        "unknown (its group's capacity is unknown: a disruptive rung under this floor there waits) or "
        "available (counted in service, as the inventory lists it)",
    )

    def keep(self, size: int) -> int:
        """Hosts of a group of ``size`` that must stay available."""
        return max(self.min_available, math.ceil(Fraction(str(self.min_available_pct)) * size / 100))

    def quarantine_cap(self, size: int) -> int | None:
        if self.max_quarantined_pct is None:
            return None
        return max(1, math.floor(Fraction(str(self.max_quarantined_pct)) * size / 100))

    def says(self, size: int) -> str:
        return f"keeps {self.keep(size)} of {size} available ({self.min_available_pct:g}%, at least {self.min_available})"


class Unreachable(_Strict):
    """Hosts a pass could not reach (ssh timed out or refused, an instance gone between the listing and the
    scan): on a large fleet a few always are. Up to this share of the pass's hosts they are reported, left
    at their ladders and counted against the floors, and the pass does not fail for them; beyond it the
    pass fails (exit 3), as an outage of the network or of the controller looks. Hosts whose scan failed
    or whose detector errored fail the pass whatever the share."""

    max_pct: Annotated[float, Field(ge=0, le=100)] = Field(
        default=0, description="percent of the pass's hosts that may be unreachable (rounded down)"
    )

    def limit(self, hosts: int) -> int:
        """Unreachable hosts of ``hosts`` that do not fail the pass."""
        return math.floor(Fraction(str(self.max_pct)) * hosts / 100)


class Rule(_Strict):
    name: str = Field(pattern=RULE_NAME, max_length=64)
    description: str | None = None
    match: list[Match] = Field(min_length=1, description="the rule takes a finding any entry matches")
    ladder: list[Rung] = Field(min_length=1, description="the actions, in the order they are tried")
    storm: Storm | None = Field(
        default=None, description="this rule's storm brake limits (default: the policy's)"
    )
    floor: Floor | None = Field(
        default=None, description="this rule's capacity floor (default: the policy's)"
    )

    @model_validator(mode="after")
    def _ladder_shape(self) -> Self:
        for i, rung in enumerate(self.ladder):
            last = i == len(self.ladder) - 1
            if rung.action == HUMAN and not last:
                raise FieldProblem(
                    ("ladder", i, "action"), "'human' ends a ladder: no rung after it is reached"
                )
            if rung.action != HUMAN and rung.clear_after is None:
                raise FieldProblem(
                    ("ladder", i, "clear_after"),
                    "required: the time this rung gets to clear the finding before the next is tried",
                )
            if rung.action == HUMAN and rung.params:
                raise FieldProblem(("ladder", i, "params"), "'human' runs nothing: no params")
        return self


class Budget(_Strict):
    """How often an action may be taken: within ``window``, at most ``max`` across the fleet and, per
    group, ``per_group`` hosts and ``per_group_pct`` percent of the group (the smaller wins)."""

    window: Duration = "1h"
    max: Annotated[int, Field(ge=0)] | None = Field(default=None, description="across the fleet")
    per_group: Annotated[int, Field(ge=0)] | None = Field(default=None, description="hosts of one group")
    per_group_pct: Annotated[float, Field(gt=0, le=100)] | None = Field(
        default=None, description="percent of a group's hosts, rounded down but at least 1"
    )
    unlimited: bool = Field(
        default=False, description="no limit: said outright, as an action without a budget is refused"
    )

    @model_validator(mode="after")
    def _limits(self) -> Self:
        limited = not (self.max is None and self.per_group is None and self.per_group_pct is None)
        if self.unlimited and limited:
            raise FieldProblem(("unlimited",), "an unlimited budget has no max, per_group or per_group_pct")
        if not self.unlimited and not limited:
            raise FieldProblem((), "no limit: give max, per_group or per_group_pct (or unlimited: true)")
        if duration_seconds(self.window) == 0 or duration_seconds(self.window) > MAX_WINDOW_S:
            raise FieldProblem(("window",), f"must be more than 0 and at most 7d, got {self.window}")
        return self

    @property
    def window_s(self) -> int:
        return duration_seconds(self.window)

    def per(self) -> str:
        return "/h" if self.window_s == HOUR_S else f" per {self.window}"

    def group_limit(self, group_size: int) -> tuple[int, str] | None:
        """The most hosts of a group of ``group_size`` per window, and how to say it; None: no limit."""
        limits: list[tuple[int, str]] = []
        if self.per_group is not None:
            limits.append((self.per_group, f"{self.per_group}{self.per()}"))
        if self.per_group_pct is not None:
            n = max(1, math.floor(Fraction(str(self.per_group_pct)) * group_size / 100))  # exact: no 2.999...
            limits.append((n, f"{self.per_group_pct:g}% ({n} of {group_size} hosts){self.per()}"))
        return min(limits, key=lambda item: item[0]) if limits else None


class Policy(_Strict):
    """A ``fleetops.policy/v1`` file."""

    model_config = ConfigDict(title=POLICY_SCHEMA, populate_by_name=False)

    schema_: Literal["fleetops.policy/v1"] = Field(alias="schema")
    description: str | None = None
    budgets: dict[str, Budget] = Field(
        default_factory=dict,
        description="per action: a limit, or {unlimited: true}; every action a ladder names needs one",
        json_schema_extra={"propertyNames": {"enum": [a for a in ACTIONS if a != HUMAN]}},
    )
    rules: list[Rule] = Field(
        min_length=1, description="tried in order: the first that matches a finding takes it"
    )
    storm: Storm = Field(
        default_factory=Storm,
        description="the storm brake's limits for every rule (a rule's own storm: replaces them)",
    )
    floor: Floor | None = Field(
        default=None,
        description="the capacity floor of every rule's disruptive rungs (a rule's own floor replaces it; "
        "none: only the engine's --max-unhealthy)",
    )
    unreachable: Unreachable = Field(
        default_factory=Unreachable,
        description="the share of a pass's hosts that may be unreachable without failing the pass "
        "(reported and counted against the floors; none by default)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        seen: set[str] = set()
        for i, rule in enumerate(self.rules):
            if rule.name in seen:
                raise FieldProblem(("rules", i, "name"), f"rule {rule.name!r} is defined twice")
            seen.add(rule.name)
        for action in self.budgets:
            if action == HUMAN:
                raise FieldProblem(("budgets", HUMAN), "'human' runs nothing: it takes no budget")
            if action not in ACTIONS:
                known = ", ".join(a for a in ACTIONS if a != HUMAN)
                raise FieldProblem(("budgets", action), f"unknown action {action!r} (known: {known})")
        for i, rule in enumerate(self.rules):
            for j, rung in enumerate(rule.ladder):
                if rung.action != HUMAN and rung.action not in self.budgets:
                    raise FieldProblem(
                        ("rules", i, "ladder", j, "action"),
                        f"rule {rule.name}: {rung.action} has no budget: give budgets.{rung.action} a limit "
                        "(max, per_group, per_group_pct) or {unlimited: true}",
                    )
        return self

    @property
    def limits(self) -> dict[str, Budget]:
        """The budgets that limit, per action (an unlimited action is not in it)."""
        return {a: b for a, b in self.budgets.items() if not b.unlimited}

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

    def storm_of(self, rule: Rule) -> Storm:
        return rule.storm if rule.storm is not None else self.storm

    def floor_of(self, rule: Rule) -> Floor | None:
        return rule.floor if rule.floor is not None else self.floor

    def rule_for(self, finding: Mapping[str, Any]) -> Rule | None:
        """The first rule that takes ``finding``, or None."""
        return next((r for r in self.rules if any(matches(m, finding) for m in r.match)), None)


# --------------------------------------------------------------------------------------- matching


def _values(data: Any, parts: list[str]) -> Iterator[Any]:
    if not parts:
        yield data
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
        for item in items:
            yield from _values(item, rest)
    elif isinstance(data, dict) and head in data:
        yield from _values(data[head], rest)
    elif isinstance(data, list) and head.isdigit() and int(head) < len(data):
        yield from _values(data[int(head)], rest)


def _equal(value: Any, want: Any) -> bool:
    if isinstance(value, bool) or isinstance(want, bool):
        return isinstance(value, bool) and isinstance(want, bool) and value == want
    return bool(value == want)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _holds(ops: Ops, value: Any) -> bool:
    checks: list[bool] = []
    given = ops.model_fields_set
    if "eq" in given:
        checks.append(_equal(value, ops.eq))
    if ops.in_ is not None:
        checks.append(any(_equal(value, w) for w in ops.in_))
    if ops.glob is not None:
        checks.append(isinstance(value, str) and fnmatch.fnmatchcase(value, ops.glob))
    number = _number(value)
    for bound, test in (
        (ops.gt, operator.gt),
        (ops.gte, operator.ge),
        (ops.lt, operator.lt),
        (ops.lte, operator.le),
    ):
        if bound is not None:
            checks.append(number is not None and bool(test(number, bound)))
    if ops.has_any is not None:
        wanted = {str(w) for w in ops.has_any}
        if isinstance(value, dict):
            checks.append(any(str(k) in wanted for k in value))
        elif isinstance(value, list):
            checks.append(any(not isinstance(v, dict | list) and str(v) in wanted for v in value))
        else:
            checks.append(False)
    return all(checks)


def _condition(data: Any, path: str, ops: Ops) -> bool:
    found = list(_values(data, path.split(".")))
    if ops.exists is not None and bool(found) != ops.exists:
        return False
    if not found:
        return ops.exists is False
    if ops.model_fields_set == {"exists"}:
        return True
    return any(_holds(ops, value) for value in found)


def matches(match: Match, finding: Mapping[str, Any]) -> bool:
    """True when ``finding`` (``{check, severity, summary, data}``) is of ``match``."""
    if finding.get("check") != match.check or finding.get("severity") not in match.severity:
        return False
    data = finding.get("data") or {}
    return all(_condition(data, path, ops) for path, ops in match.data.items())


# ---------------------------------------------------------------------------------- loading a policy


class _Loader(yaml.SafeLoader):
    """Safe YAML without timestamps (a date stays the text it was) and with duplicate keys refused."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping_no_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=True)
        with contextlib.suppress(TypeError):  # an unhashable key: construct_mapping says so
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found a duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML: {problem}{where}"


def parse_policy(text: str | bytes, source: str) -> Policy:
    """The policy in ``text`` (YAML or JSON), validated; DocumentError (one line) otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(source, f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise DocumentError(source, _yaml_error(exc)) from None
    except RecursionError:
        raise DocumentError(source, "not valid YAML: nested too deeply") from None
    return validate_policy(data, source)


def validate_policy(data: Any, source: str) -> Policy:
    """``data`` (parsed) as a Policy; DocumentError (one line) otherwise."""
    if data is None:
        raise DocumentError(source, f"empty file: no {POLICY_SCHEMA} document")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"{type(data).__name__} {str(data)[:40]!r}"
        raise DocumentError(source, f"not a {POLICY_SCHEMA} document: a mapping was expected, got {kind}")
    if data.get("schema") != POLICY_SCHEMA:
        got = data.get("schema")
        raise DocumentError(
            source,
            f"not a {POLICY_SCHEMA} document (schema: {got!r})"
            if got
            else f"required field missing ({POLICY_SCHEMA})",
            "schema",
        )
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise_validation(exc, source)
    except RecursionError:
        raise DocumentError(source, "nested too deeply") from None
    raise AssertionError("unreachable")  # pragma: no cover


def load_policy(path: Path | str) -> Policy:
    """The policy file at ``path``, validated; DocumentError (one line, exit 2) otherwise."""
    return parse_policy(read_document(path), str(path))


def default_policy_path() -> Path:
    """The default policy, shipped in the package (``fleetops/policies/default.yml``; a checkout's
    ``policies/`` links to it)."""
    return Path(__file__).resolve().parent.parent / "policies" / "default.yml"
