"""The JSON documents fleetops reads back, validated before use: a bad file is one line and exit 2.

fleetops writes these documents, which it, a tool or an operator later reads back:

=====================  ==========================================  ===================================
document               written by                                  read back by
=====================  ==========================================  ===================================
rollout state          ``Rollout.save`` (rollout/state.py)         ``remediate --resume``, ``report``
scan report            ``fleetops scan -o`` (scan.build_report),   ``drift --from``, ``merge``
                       ``fleetops merge -o`` (merge.merge)
scan partial, line 1   ``scan -o``'s ``FILE.partial`` header        ``merge`` (validate_partial_header)
scan host line         ``scan --format ndjson``, one a host as it   tools (``jq``), a killed run's
                       answers (scan.host_line)                    output kept (validate_scan_host)
drift report           ``fleetops drift -o`` (drift.build_drift)   tools, AWX, a later ``drift --from``
plan                   ``fleetops plan --format json``             tools; embedded in every state
=====================  ==========================================  ===================================

Each has a pydantic model here and a JSON Schema generated from it in ``schemas/`` at the root of
the repository (``python -m fleetops.schemas --write`` regenerates them; a test checks they are
current). The models are strict where the code relies on a field — required keys, their types (no
``"1"`` for 1, no ``true`` for 1), enumerations, finite numbers, times a clock can show — and open
(``additionalProperties``) everywhere else, so the formats can grow without breaking older readers.

Entry points, each raising :class:`DocumentError` (a :class:`~fleetops.errors.UsageError`: exit 2)
whose message is one line, ``"<file>: <field.path>: <problem>"``:

- ``load_state(path, actions=None)``, ``load_scan_report(path)``, ``load_drift_report(path)``,
  ``load_plan(path)``: read, parse and validate a file; return the parsed ``dict`` unchanged.
- ``validate_state(data, source, actions=None)`` and the other ``validate_*``: the same for a value
  already parsed (``source`` names it in the message).

Validation only: the returned value is exactly what the file holds (extra keys included), so the
code that used ``json.loads`` before keeps working on the same data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, ValidationError, model_validator

from fleetops.auto_schema import AutoPass
from fleetops.documents import (
    DocumentError,
    FieldProblem,
    OpenModel,
    bad_numbers,
    field_path,
    got,
    problem,
    raise_validation,
    read_json,
)
from fleetops.util import DRIFT_SCHEMA, PLAN_SCHEMA, ROLLOUT_ID_PATTERN, SCAN_HOST_SCHEMA, SCAN_SCHEMA

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


# -------------------------------------------------------------- scan report (fleetops.scan/v1)


class ZombieThresholds(_Open):
    zombie_warning: int | None = None
    zombie_critical: int | None = None
    headroom_critical_pct: float | None = None


class Culprit(_Open):
    unit: str


class ZombieData(_Open):
    """``zombie_memcg`` finding data (what ``remediate fix`` reads)."""

    zombies: int | None = None
    id_headroom_pct: float | None = None
    thresholds: ZombieThresholds = Field(default_factory=ZombieThresholds)
    culprits: list[Culprit] = Field(default_factory=list)


class UnitLoopData(_Open):
    """``crashloop_unit`` finding data."""

    unit: str | None = None


class ContainerLoopData(_Open):
    """``crashloop_container`` finding data."""

    name: str | None = None
    image: str | None = None
    owner_unit: str | None = None
    owner_basis: str | None = None
    owner_protected: bool | None = None
    restart_policy: str | None = None


class UcxData(_Open):
    """``ucx_mmap_hooks`` finding data."""

    unit: str | None = None
    unit_manager: str | None = None
    fixable_unit: bool | None = None
    cgroup: str | None = None
    pid: int | None = None
    comm: str | None = None


# The checks whose finding data other commands read, and the fields they read.
FINDING_DATA: dict[str, type[_Open]] = {
    "zombie_memcg": ZombieData,
    "crashloop_unit": UnitLoopData,
    "crashloop_container": ContainerLoopData,
    "ucx_mmap_hooks": UcxData,
}


class Finding(_Open):
    """One finding; for the checks in FINDING_DATA, ``data`` is also checked against that model
    (the JSON Schema leaves ``data`` open: it differs by check)."""

    check: str = Field(min_length=1)
    severity: Severity
    summary: str
    data: dict[str, Any]

    @model_validator(mode="after")
    def _data_of_check(self) -> Self:
        model = FINDING_DATA.get(self.check)
        if model is not None:
            try:
                model.model_validate(self.data)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                raise FieldProblem(("data", *first["loc"]), problem(first)) from None
        return self


class DetectorError(_Open):
    check: str
    msg: str


class HostIdentity(_Open):
    kernel: str | None = None
    os: str | None = None


class UnitFile(_Open):
    state: str | None = None


class UnitFacts(_Open):
    systemd: bool = False
    enabled: list[str] = Field(default_factory=list)
    unit_files: dict[str, UnitFile] = Field(default_factory=dict)
    environment: dict[str, dict[str, str]] = Field(default_factory=dict)


class UcxProcess(_Open):
    version: str | None = None


class UcxFacts(_Open):
    processes: list[UcxProcess] = Field(default_factory=list)


class MemcgFacts(_Open):
    zombies: int | None = None


class ScanFacts(_Open):
    """The facts other commands read (drift, fix); every other detector's facts pass as they are."""

    host: HostIdentity | None = None
    units: UnitFacts | None = None
    ucx: UcxFacts | None = None
    memcg: MemcgFacts | None = None


class ScanNode(_Open):
    """The host's scheduler node, read once per scan on the controller (``fleetops.nodes.scan_view``): the
    hosts whose ``fleetops_quarantine_backend`` is ``slurm``."""

    backend: Literal["slurm", "kubernetes"]
    node: str = Field(description="the scheduler's name of the node")
    phase: Literal["in", "cordoned", "draining", "drained", "down", "out", "missing", "unknown"] = Field(
        description="in: takes work; missing: the scheduler does not list it; unknown: it could not be read"
    )
    ours: bool = Field(description="fleetops' own quarantine (its record on the node)")
    reason: str = Field(default="", description="the scheduler's reason, without Slurm's [user@time]")
    since: Epoch | None = Field(default=None, description="when fleetops drained it (its record's time)")
    error: str | None = Field(default=None, description="phase unknown: why the scheduler could not be read")


class ScanHost(_Open):
    status: Literal["ok", "unreachable", "failed", "not_scanned"]
    msg: str | None = None
    timed_out: bool = False
    findings: list[Finding]
    facts: ScanFacts
    errors: list[DetectorError] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list)
    duration_ms: Seconds | None = None
    node: ScanNode | None = Field(default=None, description="Slurm hosts only (fleetops_quarantine_backend)")


class ScanHostLine(ScanHost):
    """One line of ``fleetops scan --format ndjson`` (scan.host_line): a host's entry as the report's
    ``hosts[NAME]`` holds it, with its name, written as soon as the host answers (a run killed half
    way leaves every line it wrote whole); hosts with no answer when the scan ends (``not_scanned``)
    follow at the end. One object a line, no summary line: the lines are the hosts."""

    model_config = ConfigDict(title=SCAN_HOST_SCHEMA)

    schema_: Literal["fleetops.scan.host/v1"] = Field(alias="schema")
    host: HostName


class ScanSummary(_Open):
    hosts: NonNegInt
    ok: NonNegInt
    unreachable: NonNegInt
    failed: NonNegInt
    not_scanned: NonNegInt = 0
    findings: dict[str, NonNegInt]
    errors: NonNegInt = 0
    node_errors: NonNegInt = Field(default=0, description="hosts whose scheduler node could not be read")


class ScanShard(_Open):
    """``fleetops scan --shard I/N``: the hosts whose name's SHA-256 modulo N is I - 1."""

    index: Annotated[int, Field(ge=1)]
    count: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _index_in_count(self) -> Self:
        if self.index > self.count:
            raise FieldProblem(("index",), f"is {self.index}, more than the count {self.count}")
        return self


class ScanOptionsRecord(_Open):
    """What decides a scan's findings (``ScanOptions.record``); null: the module's default."""

    checks: list[str] | None = None
    sample_seconds: Seconds | None = None
    zombie_warning: int | None = None
    zombie_critical: int | None = None
    headroom_critical_pct: float | None = None
    extra_vars: str | None = Field(default=None, description="a digest of the extra vars (sha256:...)")


class MergedSource(_Open):
    path: str
    shard: ScanShard | None = None
    partial: bool = Field(
        description="a killed scan's .partial file: its hosts without an answer are not_scanned"
    )
    hosts: NonNegInt
    not_scanned: NonNegInt = 0


class MergedFrom(_Open):
    """``fleetops merge``: the reports (or .partial files) the report was joined from."""

    sources: list[MergedSource]
    notes: list[str] = Field(default_factory=list)


class ScanTransport(_Open):
    """``fleetops scan --transport ssh``: the hosts ansible-playbook scanned instead, and why."""

    name: Literal["ssh"]
    by_ansible: dict[HostName, str] = Field(default_factory=dict)


class ScanReport(_Open):
    """``fleetops scan -o FILE`` / ``--format json`` / ``fleetops merge``: what ``drift --from`` and
    ``merge`` read."""

    model_config = ConfigDict(title=SCAN_SCHEMA)

    schema_: Literal["fleetops.scan/v1"] = Field(alias="schema")
    started_at: str
    duration_s: Seconds
    shard: ScanShard | None = Field(default=None, description="--shard I/N: absent for the whole selection")
    options: ScanOptionsRecord | None = Field(default=None, description="absent in older reports")
    merged: MergedFrom | None = Field(
        default=None, description="fleetops merge: absent in a scan's own report"
    )
    transport: ScanTransport | None = Field(default=None, description="--transport ssh only")
    hosts: dict[str, ScanHost]
    summary: ScanSummary
    interrupted: bool = False


class ScanPartialHeader(_Open):
    """The first line of a scan's ``FILE.partial`` (``fleetops.scan.partial/v1``; scan.PartialReport)."""

    schema_: Literal["fleetops.scan.partial/v1"] = Field(alias="schema")
    started_at: str
    targets: list[HostName] | None = Field(
        default=None, description="every targeted host; absent in older files"
    )
    shard: ScanShard | None = None
    options: ScanOptionsRecord | None = None


# ------------------------------------------------------------ drift report (fleetops.drift/v1)


class DriftItem(_Open):
    fact: str
    label: str
    majority: str
    majority_hosts: NonNegInt
    hosts: NonNegInt
    tie: bool
    odd: dict[str, str]


class DriftGroup(_Open):
    hosts: list[HostName]
    all_hosts: bool
    drift: list[DriftItem]


class BetweenGroups(_Open):
    fact: str
    label: str
    groups: dict[str, str]


class OddValue(_Open):
    fact: str
    label: str
    value: str
    majority: str
    scope: str
    tie: bool


class DriftHost(_Open):
    status: str | None
    az: str | None = None
    ami: str | None = None
    kernel: str | None = None
    instance_type: str | None = None


class NotCompared(_Open):
    status: str | None
    msg: str | None = ""


class DriftScan(_Open):
    started_at: str | None
    interrupted: bool


class DriftSummary(_Open):
    hosts: NonNegInt
    compared: NonNegInt
    not_compared: NonNegInt
    facts_compared: NonNegInt
    drifting_facts: NonNegInt
    odd_hosts: list[str]


class DriftReport(_Open):
    """``fleetops drift -o FILE`` / ``--format json``."""

    model_config = ConfigDict(title=DRIFT_SCHEMA)

    schema_: Literal["fleetops.drift/v1"] = Field(alias="schema")
    scan: DriftScan
    group_by: list[Dimension]
    hosts: dict[str, DriftHost]
    fleet: list[DriftItem]
    groups: dict[str, dict[str, DriftGroup]]
    between_groups: dict[str, list[BetweenGroups]]
    skipped_dimensions: dict[str, str]
    odd_hosts: dict[str, list[OddValue]]
    not_compared: dict[str, NotCompared]
    summary: DriftSummary


# ------------------------------------------------------------------------- reading a document


MODELS: dict[str, type[_Open]] = {
    "rollout-state": RolloutState,
    "scan-report": ScanReport,
    "scan-host": ScanHostLine,
    "drift-report": DriftReport,
    "plan": PlanDocument,
    "auto-pass": AutoPass,
}


def _validate(
    model: type[_Open], data: Any, source: str, check: Callable[[dict[str, Any], str], None] | None = None
) -> dict[str, Any]:
    for loc, bad in bad_numbers(data):
        raise DocumentError(source, f"{bad.text}: {bad.why}", field_path(loc))
    if not isinstance(data, dict):
        raise DocumentError(source, f"not a {model.model_config.get('title')} document: a JSON object "
                                    f"was expected, got {got(data)}")  # fmt: skip
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise_validation(exc, source)
    except RecursionError:
        raise DocumentError(source, "nested too deeply") from None
    if check is not None:
        check(data, source)
    return data


# ------------------------------------------------------------------------- public entry points


def _known_action(actions: Collection[str] | None) -> Callable[[dict[str, Any], str], None] | None:
    if actions is None:
        return None

    def check(data: dict[str, Any], source: str) -> None:
        if data["action"] not in actions:
            known = ", ".join(sorted(actions))
            raise DocumentError(source, f"unknown remediation {data['action']!r} (known: {known})", "action")

    return check


def validate_state(data: Any, source: str, actions: Collection[str] | None = None) -> dict[str, Any]:
    """``data`` if it is a rollout state (``fleetops.rollout.engine-state/v1``), else DocumentError.

    ``actions``: the remediations this fleetops knows (``REMEDIATIONS``); an ``action`` outside
    them is refused too (``--resume`` would not know what to run).
    """
    return _validate(RolloutState, data, source, _known_action(actions))


def validate_scan_report(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.scan/v1`` report, else DocumentError."""
    return _validate(ScanReport, data, source)


def validate_scan_host(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is one ``fleetops.scan.host/v1`` line of ``scan --format ndjson``, else DocumentError."""
    return _validate(ScanHostLine, data, source)


def validate_partial_header(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is the first line of a scan's ``.partial`` file, else DocumentError."""
    return _validate(ScanPartialHeader, data, source)


def validate_drift_report(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.drift/v1`` report, else DocumentError."""
    return _validate(DriftReport, data, source)


def validate_plan(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a ``fleetops.plan/v1`` document, else DocumentError."""
    return _validate(PlanDocument, data, source)


def load_state(path: Path | str, actions: Collection[str] | None = None) -> dict[str, Any]:
    """The rollout state file at ``path``, validated (see ``validate_state``)."""
    return validate_state(read_json(path), str(path), actions)


def load_scan_report(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.scan/v1`` report at ``path``, validated."""
    return validate_scan_report(read_json(path), str(path))


def load_drift_report(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.drift/v1`` report at ``path``, validated."""
    return validate_drift_report(read_json(path), str(path))


def load_plan(path: Path | str) -> dict[str, Any]:
    """The ``fleetops.plan/v1`` document at ``path``, validated."""
    return validate_plan(read_json(path), str(path))


# ------------------------------------------------------------------------------- JSON Schemas


SCHEMA_DIR_NAME = "schemas"


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of document ``name`` (a key of MODELS), from its model."""
    model = MODELS[name]
    body = model.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://example.invalid/fleetops/schemas/{name}.schema.json",
        **body,
    }


def json_schema_text(name: str) -> str:
    """``json_schema(name)`` as the committed file holds it."""
    return json.dumps(json_schema(name), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetops.schemas --write DIR``: (re)write DIR/<name>.schema.json for every document."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--write":
        sys.stderr.write("usage: python -m fleetops.schemas --write DIR\n")
        return 2
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        (out / f"{name}.schema.json").write_text(json_schema_text(name), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
