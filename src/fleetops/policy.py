"""Remediation policy (``fleetops.policy/v1``) and the pure decision of ``remediate auto``.

A policy is a YAML file: for each kind of finding (a rule: check, severities, optional data match)
an ordered **ladder** of actions, each rung with the time it gets to clear the finding before the
next rung is tried, and per-action **budgets** (at most N per window across the fleet, and per group
a count and a percent: the smaller wins)::

    schema: fleetops.policy/v1
    budgets:
      reboot: {window: 1h, max: 20, per_group: 2, per_group_pct: 10}
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

Budgets count what the ledger holds in the window before ``now``: ``max`` across the fleet,
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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import json
import math
import operator
import os
import re
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

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

from fleetops.errors import FleetopsError
from fleetops.schemas import (
    MAX_EPOCH,
    DocumentError,
    FieldProblem,
    Severity,
    _raise_validation,  # the one-line DocumentError every document of fleetops uses
    read_json,
)
from fleetops.util import DAY_S, HOUR_S, atomic_write

POLICY_SCHEMA = "fleetops.policy/v1"
LADDER_SCHEMA = "fleetops.policy.ladder/v1"
LEDGER_SCHEMA = "fleetops.policy.ledger/v1"
SCHEMA_NAME = "policy"  # schemas/policy.schema.json

# The ladder's actions: the remediations a rung can run, and "human" (a note, nothing runs).
Action = Literal[
    "fix", "disable-unit", "set-env", "reclaim", "reboot", "quarantine", "stop-start", "replace", "human"
]
ACTIONS: tuple[str, ...] = get_args(Action)
HUMAN = "human"
# The checks node_health reports (README detector table); a rule naming another is a typo.
CHECKS = (
    "zombie_memcg",
    "crashloop_unit",
    "crashloop_container",
    "ucx_mmap_hooks",
    "anon_rss_growth",
    "ec2_scheduled_event",
    "ena_resets",
    "cpu_starvation",
    "gpu_health",
    "unexpected_unit",
)
DEFAULT_SEVERITIES: tuple[Severity, ...] = ("warning", "critical")
NO_GROUP = "-"  # the group of a host group_of knows nothing about
MAX_WINDOW_S = 7 * DAY_S  # the longest budget window; the ledger keeps entries this long
LOCK_TIMEOUT_S = 30.0
RULE_NAME = r"^[a-z0-9][a-z0-9_.-]*$"
TAG_KEY = "fleetops.io/ladder"  # the EC2 tag that carries a host's ladders (LadderState.tag_value)
TAG_MAX = 256  # EC2's limit on a tag value
SPENT_TAG_KEY = "fleetops.io/spent"  # the budgeted actions taken on a host (BudgetLedger.tag_value)
CLOCK_SKEW_S = 300  # a spent tag's entry this far ahead of this controller's clock still counts (as now)

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

    @property
    def clear_after_s(self) -> int:
        return duration_seconds(self.clear_after) if self.clear_after is not None else 0


class Rule(_Strict):
    name: str = Field(pattern=RULE_NAME, max_length=64)
    description: str | None = None
    match: list[Match] = Field(min_length=1, description="the rule takes a finding any entry matches")
    ladder: list[Rung] = Field(min_length=1, description="the actions, in the order they are tried")

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

    @model_validator(mode="after")
    def _limits(self) -> Self:
        if self.max is None and self.per_group is None and self.per_group_pct is None:
            raise FieldProblem((), "no limit: give max, per_group or per_group_pct")
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
        description="per action",
        json_schema_extra={"propertyNames": {"enum": [a for a in ACTIONS if a != HUMAN]}},
    )
    rules: list[Rule] = Field(
        min_length=1, description="tried in order: the first that matches a finding takes it"
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
        return self

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

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
        _raise_validation(exc, source)
    except RecursionError:
        raise DocumentError(source, "nested too deeply") from None
    raise AssertionError("unreachable")  # pragma: no cover


def load_policy(path: Path | str) -> Policy:
    """The policy file at ``path``, validated; DocumentError (one line, exit 2) otherwise."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise DocumentError(source, "no such file") from None
    except IsADirectoryError:
        raise DocumentError(source, "is a directory, not a file") from None
    except OSError as exc:
        raise DocumentError(source, f"cannot read: {exc.strerror or exc}") from None
    return parse_policy(raw, source)


def default_policy_path() -> Path:
    """The default policy, shipped in the package (``fleetops/policies/default.yml``; a checkout's
    ``policies/`` links to it)."""
    return Path(__file__).resolve().parent / "policies" / "default.yml"


# ---------------------------------------------------------------------------------- state files


class StateError(FleetopsError):
    """A state file could not be locked in time."""


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive lock on ``.<name>.lock`` beside ``path`` (created 0600, never through a link),
    waited for at most ``timeout`` seconds."""
    lock = path.with_name(f".{path.name}.lock")
    os.makedirs(lock.parent, 0o700, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    raise StateError(
                        f"{path}: another controller holds its lock (waited {timeout:g} s)"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


class _StateDoc(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH)]


class _RungRecordDoc(_StateDoc):
    check: str
    rung: Annotated[int, Field(ge=0)]
    action: str
    first_tried: Epoch
    last_tried: Epoch
    tries: Annotated[int, Field(ge=1)] = 1
    quarantined: bool = False


class _LadderDoc(_StateDoc):
    model_config = ConfigDict(title=LADDER_SCHEMA)
    schema_: Literal["fleetops.policy.ladder/v1"] = Field(alias="schema")
    hosts: dict[str, dict[str, _RungRecordDoc]]


class _LedgerEntryDoc(_StateDoc):
    id: str
    action: str
    host: str
    group: str
    at: Epoch
    controller: str = ""


class _LedgerDoc(_StateDoc):
    model_config = ConfigDict(title=LEDGER_SCHEMA)
    schema_: Literal["fleetops.policy.ledger/v1"] = Field(alias="schema")
    entries: list[_LedgerEntryDoc]


def _validated(model: type[BaseModel], data: Any, source: str) -> None:
    if not isinstance(data, dict):
        raise DocumentError(
            source, f"not a {model.model_config.get('title')} document: a JSON object was expected"
        )
    try:
        model.model_validate(data)
    except ValidationError as exc:
        _raise_validation(exc, source)


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _check_tag_length(value: str, source: str) -> None:
    """DocumentError unless ``value`` fits an EC2 tag value (TAG_MAX characters): a longer one came
    from no EC2 tag (a hand-written inventory's ``ec2_tags``), and is not parsed at all."""
    if len(value) > TAG_MAX:
        raise DocumentError(source, f"{len(value)} characters: longer than an EC2 tag value ({TAG_MAX})")


@dataclass
class RungRecord:
    """Where one ladder of one host stands: the rung last tried, and when."""

    check: str
    rung: int
    action: str
    first_tried: float  # when the ladder's first rung was taken (this episode)
    last_tried: float  # when this rung was taken
    tries: int = 1  # rungs taken in this episode
    quarantined: bool = False  # a quarantine rung was taken in this episode (the taint stays until released)


@dataclass
class LadderState:
    """Per host, per rule (a rule names one fault; its findings share one ladder): the rung tried."""

    hosts: dict[str, dict[str, RungRecord]] = field(default_factory=dict)

    def get(self, host: str, rule: str) -> RungRecord | None:
        return self.hosts.get(host, {}).get(rule)

    def rules(self, host: str) -> list[str]:
        return sorted(self.hosts.get(host, {}))

    def record(self, host: str, rule: str, check: str, rung: int, action: str, now: float) -> RungRecord:
        """Rung ``rung`` (``action``) of ``rule`` was taken on ``host`` at ``now``."""
        old = self.get(host, rule)
        rec = RungRecord(
            check=check,
            rung=rung,
            action=action,
            first_tried=old.first_tried if old is not None else now,
            last_tried=now,
            tries=old.tries + 1 if old is not None else 1,
            quarantined=(old is not None and old.quarantined) or action == "quarantine",
        )
        self.hosts.setdefault(host, {})[rule] = rec
        return rec

    def reset(self, host: str, rule: str) -> None:
        rules = self.hosts.get(host)
        if rules is not None:
            rules.pop(rule, None)
            if not rules:
                del self.hosts[host]

    def tag_value(self, host: str) -> str | None:
        """``host``'s ladders as the value of the EC2 tag ``TAG_KEY`` (at most 256 characters: the
        most recently tried first, what does not fit left out); None: no ladder (delete the tag).

        ``rule=rung:action:first_tried:last_tried:tries:quarantined:check`` joined by ``;``. Write it
        after every pass (and delete it when None) so another controller's ``merge_tag`` sees this one's."""
        parts: list[str] = []
        for rule, rec in sorted(self.hosts.get(host, {}).items(), key=lambda kv: (-kv[1].last_tried, kv[0])):
            part = (
                f"{rule}={rec.rung}:{rec.action}:{int(rec.first_tried)}:{int(rec.last_tried)}:{rec.tries}:"
                f"{int(rec.quarantined)}:{rec.check}"
            )
            if len(";".join([*parts, part])) <= TAG_MAX:
                parts.append(part)
        return ";".join(parts) or None

    def merge_tag(self, host: str, value: str, source: str) -> None:
        """Take in the ladders a host's tag holds (``tag_value``'s format): per rule, the record
        tried last wins. DocumentError (one line, naming ``source``) when the value is not of it."""
        _check_tag_length(value, source)
        merged: dict[str, RungRecord] = {}
        for i, part in enumerate(value.split(";") if value else []):
            rule, eq, rest = part.partition("=")
            fields = rest.split(":")
            if (
                not eq
                or not re.fullmatch(RULE_NAME, rule)
                or len(fields) != 7
                or not all(f.isdigit() for f in (*fields[0:1], *fields[2:6]))
                or fields[1] not in ACTIONS
                or fields[5] not in ("0", "1")
                or fields[6] not in CHECKS
                or int(fields[4]) < 1
                or not int(fields[2]) <= int(fields[3]) <= MAX_EPOCH
            ):
                raise DocumentError(source, f"entry {i + 1} is not rule=rung:action:first:last:tries:quarantined:check: "
                                            f"{part[:60]!r}")  # fmt: skip
            merged[rule] = RungRecord(
                check=fields[6], rung=int(fields[0]), action=fields[1], first_tried=float(fields[2]),
                last_tried=float(fields[3]), tries=int(fields[4]), quarantined=fields[5] == "1",
            )  # fmt: skip
        for rule, rec in merged.items():
            mine = self.get(host, rule)
            if mine is None or rec.last_tried > mine.last_tried:
                self.hosts.setdefault(host, {})[rule] = rec

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": LADDER_SCHEMA,
            "hosts": {
                host: {rule: vars(rec).copy() for rule, rec in sorted(rules.items())}
                for host, rules in sorted(self.hosts.items())
            },
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> LadderState:
        _validated(_LadderDoc, data, source)
        return cls(
            hosts={
                host: {
                    rule: RungRecord(
                        check=r["check"],
                        rung=r["rung"],
                        action=r["action"],
                        first_tried=float(r["first_tried"]),
                        last_tried=float(r["last_tried"]),
                        tries=r.get("tries", 1),
                        quarantined=r.get("quarantined", False),
                    )
                    for rule, r in rules.items()
                }
                for host, rules in data["hosts"].items()
            }
        )

    @classmethod
    def load(cls, path: Path) -> LadderState:
        """The state at ``path``; an empty state when there is no file yet (the first pass)."""
        if not path.exists() and not path.is_symlink():
            return cls()
        return cls.from_json(read_json(path), str(path))

    def save(self, path: Path) -> None:
        atomic_write(path, _dump(self.to_json()), mode=0o600, mkdir=True)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[LadderState]:
        """Load under an exclusive lock, yield, save on a normal exit (not on an exception)."""
        with file_lock(path, timeout):
            state = cls.load(path)
            yield state
            state.save(path)


@dataclass(frozen=True)
class LedgerEntry:
    action: str
    host: str
    group: str
    at: float
    controller: str = ""
    id: str = field(default_factory=lambda: secrets.token_hex(8))


def controller_id() -> str:
    """``<hostname>:<pid>``: who took an action (ledger entries name it)."""
    return f"{os.uname().nodename}:{os.getpid()}"


@dataclass
class BudgetLedger:
    """The actions taken (when, on which host, in which group): what budgets are counted against."""

    entries: list[LedgerEntry] = field(default_factory=list)
    # record_once's index, (host, action) -> times: valid while `entries` is the list it was built from
    # (held here, so no other list can take its address) and has the length it had
    _times: dict[tuple[str, str], list[float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _indexed: tuple[list[LedgerEntry] | None, int] = field(
        default=(None, -1), init=False, repr=False, compare=False
    )

    def record(self, action: str, host: str, group: str, now: float, controller: str = "") -> LedgerEntry:
        entry = LedgerEntry(action=action, host=host, group=group, at=now, controller=controller)
        self.entries.append(entry)
        return entry

    def record_once(self, action: str, host: str, group: str, at: float, controller: str = "") -> bool:
        """``record`` unless the ledger already has ``action`` on ``host`` within a second of ``at``
        (the same action read back from an EC2 tag, whose times are whole seconds); True if recorded.
        O(1) per call: a pass merges every host's tags, and a fleet's thousands of entries made a
        scan of the whole ledger per entry quadratic (7,500 hosts: 5.6 s)."""
        if self._indexed[0] is not self.entries or self._indexed[1] != len(self.entries):
            self._times = {}
            for e in self.entries:
                self._times.setdefault((e.host, e.action), []).append(e.at)
        times = self._times.setdefault((host, action), [])
        if any(abs(t - at) < 1.0 for t in times):
            self._indexed = (self.entries, len(self.entries))
            return False
        self.record(action, host, group, at, controller)
        times.append(at)
        self._indexed = (self.entries, len(self.entries))
        return True

    def taken(self, action: str, since: float, until: float, group: str | None = None) -> list[LedgerEntry]:
        """``action`` entries in (since, until] (of ``group`` when given)."""
        return [
            e
            for e in self.entries
            if e.action == action and since < e.at <= until and (group is None or e.group == group)
        ]

    def blocked(
        self, action: str, group: str, group_size: int, now: float, budget: Budget | None
    ) -> str | None:
        """Why ``budget`` forbids one more ``action`` in ``group`` at ``now`` ("budget: ..."), or None."""
        if budget is None:
            return None
        recent = self.taken(action, now - budget.window_s, now)
        return _verdict(
            action, group, group_size, budget, len(recent), sum(1 for e in recent if e.group == group)
        )

    def allows(self, action: str, group: str, group_size: int, now: float, budget: Budget | None) -> bool:
        """True when ``budget`` lets one more ``action`` happen in ``group`` at ``now``."""
        return self.blocked(action, group, group_size, now, budget) is None

    def tag_value(self, host: str, windows: Mapping[str, float], now: float) -> str | None:
        """The actions taken on ``host`` that a budget still counts (``windows``: action -> its
        budget's window, seconds) as the value of the EC2 tag ``SPENT_TAG_KEY``: ``action:epoch``
        joined by ``;``, the most recent first, at most TAG_MAX characters (the oldest left out).
        None: nothing to carry (delete the tag). It outlives the host's ladder: a stop-start that
        cleared the fault resets the ladder, but spent the budget for the whole window."""
        seen: set[tuple[str, int]] = set()
        parts: list[str] = []
        for e in sorted(self.entries, key=lambda e: (-e.at, e.action)):
            window = windows.get(e.action)
            key = (e.action, int(e.at))
            if e.host != host or window is None or not now - window < e.at <= now or key in seen:
                continue
            seen.add(key)
            part = f"{e.action}:{int(e.at)}"
            if len(";".join([*parts, part])) > TAG_MAX:
                break
            parts.append(part)
        return ";".join(parts) or None

    def merge_tag(self, host: str, group: str, value: str, source: str, now: float) -> int:
        """Count the actions a host's ``SPENT_TAG_KEY`` tag holds (``tag_value``'s format) that the
        ledger does not have yet (the same action on the same host within a second), in ``group``;
        returns how many were added. An entry up to CLOCK_SKEW_S ahead of ``now`` (another
        controller's clock) counts as taken now; one further ahead, or older than any window, is
        left out. DocumentError (one line, naming ``source``) when the value is not of the format:
        then nothing of it is counted."""
        _check_tag_length(value, source)
        parsed: list[tuple[str, float]] = []
        for i, part in enumerate(value.split(";") if value else []):
            name, colon, epoch = part.partition(":")
            if (
                not colon
                or name not in ACTIONS
                or name == HUMAN
                or not epoch.isdigit()
                or int(epoch) > MAX_EPOCH
            ):
                raise DocumentError(source, f"entry {i + 1} is not action:epoch: {part[:60]!r}")
            parsed.append((name, float(epoch)))
        added = 0
        for action, at in parsed:
            if at > now + CLOCK_SKEW_S or now - at > MAX_WINDOW_S:
                continue
            added += self.record_once(action, host, group, min(at, now), controller="tag")
        return added

    def prune(self, now: float, keep: float = MAX_WINDOW_S) -> None:
        """Forget entries older than any budget window."""
        self.entries = [e for e in self.entries if e.at > now - keep]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": LEDGER_SCHEMA,
            "entries": [vars(e).copy() for e in sorted(self.entries, key=lambda e: e.at)],
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> BudgetLedger:
        _validated(_LedgerDoc, data, source)
        return cls(
            entries=[
                LedgerEntry(
                    action=e["action"],
                    host=e["host"],
                    group=e["group"],
                    at=float(e["at"]),
                    controller=e.get("controller", ""),
                    id=e["id"],
                )
                for e in data["entries"]
            ]
        )

    @classmethod
    def load(cls, path: Path) -> BudgetLedger:
        """The ledger at ``path``; an empty one when there is no file yet."""
        if not path.exists() and not path.is_symlink():
            return cls()
        return cls.from_json(read_json(path), str(path))

    def save(self, path: Path, now: float | None = None) -> None:
        """Write the ledger (entries older than the longest window dropped when ``now`` is given)."""
        if now is not None:
            self.prune(now)
        atomic_write(path, _dump(self.to_json()), mode=0o600, mkdir=True)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[BudgetLedger]:
        """Load under an exclusive lock, yield, save on a normal exit (not on an exception): decide
        and record inside it, so two controllers never spend the same budget."""
        with file_lock(path, timeout):
            ledger = cls.load(path)
            yield ledger
            ledger.save(path)


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


class _Spending:
    """A pass's view of the ledger: per budgeted action, what its window holds at ``now`` (counted
    once, so a pass costs O(hosts + entries)), plus what the pass itself decides."""

    def __init__(self, ledger: BudgetLedger, budgets: Mapping[str, Budget], now: float) -> None:
        self.budgets = budgets
        self.fleet: Counter[str] = Counter()
        self.group: Counter[tuple[str, str]] = Counter()
        for e in ledger.entries:
            budget = budgets.get(e.action)
            if budget is not None and now - budget.window_s < e.at <= now:
                self.fleet[e.action] += 1
                self.group[(e.action, e.group)] += 1

    def blocked(self, action: str, group: str, group_size: int) -> str | None:
        budget = self.budgets.get(action)
        if budget is None:
            return None
        return _verdict(action, group, group_size, budget, self.fleet[action], self.group[(action, group)])

    def take(self, action: str, group: str) -> None:
        self.fleet[action] += 1
        self.group[(action, group)] += 1


# ---------------------------------------------------------------------------------- deciding


Status = Literal["act", "wait", "budget", "human", "exhausted", "clean", "no_rule", "not_scanned"]


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
    rung: int | None = None  # index into the rule's ladder: the rung taken now, waited on or blocked
    rungs: int = 0  # the ladder's length
    rung_action: str | None = None  # that rung's action
    action: str | None = None  # the action to take now (None: none)
    params: Mapping[str, Any] = field(default_factory=dict)
    waiting_rules: tuple[str, ...] = ()  # other rules the host matches, after this one
    reset: tuple[str, ...] = ()  # ladders this scan showed cleared (reset by commit)
    # of those, the ones whose episode quarantined the host: its taint stays until someone releases it
    still_quarantined: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (for a report or the audit log)."""
        data = asdict(self)
        data["params"] = dict(self.params)
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
    pending = _Spending(budget_ledger, policy.budgets, now)
    return [
        _decide_host(policy, host, hosts[host], ladder_state, pending, now, group_of(host) or NO_GROUP, sizes)
        for host in sorted(hosts)
    ]


def _decide_host(
    policy: Policy,
    host: str,
    result: Mapping[str, Any],
    ladder: LadderState,
    pending: _Spending,
    now: float,
    group: str,
    sizes: Mapping[str, int],
) -> Decision:
    status = result.get("status")
    if status != "ok":
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
    reset = tuple(r for r in ladder.rules(host) if r not in matched)
    held = tuple(r for r in reset if _rec(ladder, host, r).quarantined)
    if not matched:
        was = "; ".join(f"{r} reset (was at {_rec(ladder, host, r).action})" for r in reset)
        if held:
            was += f"; still quarantined by {', '.join(held)}: release it when the host is trusted again"
        if unmatched:
            what = ", ".join(sorted({f"{f.get('check')} ({f.get('severity')})" for f in unmatched}))
            why = f"no rule matches: {what}" + (f"; {was}" if was else "")
            return Decision(host, group, "no_rule", why, reset=reset, still_quarantined=held)
        return Decision(
            host, group, "clean", "clean" + (f"; {was}" if was else ""), reset=reset, still_quarantined=held
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
) -> None:
    """Record a pass: every ladder a scan showed cleared is reset, and every action taken (by
    default every decided action; ``taken`` says which ran) is recorded in the ladder and, but
    ``human``, in the ledger. ``now``: when the actions finished (a rung's clear time starts then)."""
    for d in decisions:
        for rule in d.reset:
            ladder_state.reset(d.host, rule)
        if d.action is None or d.rule is None or d.rung is None or d.check is None:
            continue
        if taken is not None and not taken(d):
            continue
        ladder_state.record(d.host, d.rule, d.check, d.rung, d.action, now)
        if d.action != HUMAN:
            budget_ledger.record(d.action, d.host, d.group, now, controller)


# ------------------------------------------------------------------------------- JSON Schema


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``fleetops.policy/v1``, from the model."""
    body = Policy.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://example.invalid/fleetops/schemas/{SCHEMA_NAME}.schema.json",
        **body,
    }


def json_schema_text() -> str:
    """``json_schema()`` as ``schemas/policy.schema.json`` holds it."""
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetops.policy --write DIR``: (re)write DIR/policy.schema.json;
    ``python -m fleetops.policy --check FILE...``: validate policy files (one line each)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        out = Path(args[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{SCHEMA_NAME}.schema.json").write_text(json_schema_text(), encoding="utf-8")
        return 0
    if len(args) >= 2 and args[0] == "--check":
        rc = 0
        for name in args[1:]:
            try:
                policy = load_policy(name)
            except DocumentError as exc:
                sys.stderr.write(f"{exc}\n")
                rc = 2
            else:
                sys.stdout.write(f"{name}: ok ({len(policy.rules)} rules)\n")
        return rc
    sys.stderr.write("usage: python -m fleetops.policy --write DIR | --check FILE...\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
