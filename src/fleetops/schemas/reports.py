"""The models of the reports fleetops reads back (see :mod:`fleetops.schemas`): the scan report
(``fleetops.scan/v1``, its host lines and its partial header) and the drift report (``fleetops.drift/v1``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, ValidationError, model_validator

from fleetops.auto_schema import DecisionStatus
from fleetops.documents import (
    FieldProblem,
    problem,
)
from fleetops.schemas.models import (
    CoverageLevel,
    Dimension,
    Epoch,
    HostName,
    NonNegInt,
    Seconds,
    Severity,
    _Open,
)
from fleetops.util import DRIFT_SCHEMA, SCAN_HOST_SCHEMA, SCAN_SCHEMA, MixedTransport, ScanTransportName

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

# Every check node_health reports, in its detectors' order, and the top-level keys of its findings'
# ``data`` beyond the fields FINDING_DATA's model declares (the detectors in plugins/module_utils set
# them; tests/unit/plugins/module_utils/conftest.py holds every finding the detector tests make to it).
_MORE_DATA_KEYS: dict[str, tuple[str, ...]] = {
    "zombie_memcg": (
        "cgroup_version", "growth", "id_headroom", "id_headroom_basis", "id_max", "id_used", "live",
        "scope", "total",
        # health.py: the culprits of growth, merged in (or, with no zombie finding, the growth itself)
        "growth_per_min", "growth_basis", "seconds", "total_per_min", "live_per_min", "zombies_per_min",
    ),
    "crashloop_unit": (
        "active_state", "exec_main_status", "fragment_path", "n_restarts", "rate_basis", "restart",
        "restarts_in_window", "restarts_per_min", "result", "sub_state", "unit_file_preset",
        "unit_file_state", "vendor_unit",
    ),
    "crashloop_container": (
        "created_age_s", "exit_code", "full_id", "id", "labels", "rate_basis", "recreated",
        "restart_count", "restarting", "restarts_in_window", "restarts_per_min", "started_age_s", "status",
    ),
    "ucx_mmap_hooks": (
        "cmdline", "environ_readable", "fixed_upstream", "growth", "hooks_on", "libdir", "libraries",
        "policy", "rcache_bounded", "restart_pending", "same_mount_ns", "upstream_fix", "variables",
        "version", "version_source",
    ),
    "anon_rss_growth": (
        "anon_kb", "anon_mb_per_min", "cmdline", "comm", "map_count", "minutes_to_exhaust_available",
        "pid", "rss_kb", "rss_mb_per_min", "smaps_rollup", "thresholds", "unit", "unit_manager",
        "vsz_mb_per_min", "window_seconds",
    ),
    "ec2_scheduled_event": (
        "code", "description", "event_id", "not_after", "not_before", "source", "state",
    ),
    "ena_resets": ("ena_resets_critical", "interfaces", "recent", "window_seconds"),
    "cpu_starvation": ("cpus", "critical_pct", "warning_pct", "window_seconds"),
    "gpu_health": ("gpus", "new_xid_events", "smi_error", "xid"),
    "unexpected_unit": ("allowlist", "preset", "state", "unit"),
}  # fmt: skip

# The declaration policies are checked against (``fleetops policy check``): per check, every
# top-level key its findings' ``data`` may hold.
FINDING_DATA_KEYS: dict[str, frozenset[str]] = {
    check: frozenset(more) | frozenset(FINDING_DATA[check].model_fields if check in FINDING_DATA else ())
    for check, more in _MORE_DATA_KEYS.items()
}


class NextRung(_Open):
    """The policy's rung for a finding (``fleetops.next_steps``): its rule's ladder where the state directory
    records it, budgets, storm brakes and floors aside (``remediate auto --from`` judges those)."""

    policy: str = Field(description="the policy file as given, or 'default' (the one fleetops ships)")
    rule: str
    rung: Annotated[int, Field(ge=1)] = Field(description="counted from 1, as the text says 'rung 1/4'")
    rungs: Annotated[int, Field(ge=1)]
    action: str | None = Field(description="the rung's action: a remediation, or 'human'")
    status: DecisionStatus
    reason: str
    params: dict[str, Any] = Field(default_factory=dict, description="the rung's own parameters")
    note: str | None = None


class FindingNext(_Open):
    """What to do next about a finding (``fleetops.next_steps``): the remediation that acts on it and the
    dry-run command for its host, and the policy's rung."""

    remediation: str | None = Field(description="null: no remediation acts on it (the rung says who does)")
    command: str | None = Field(description="the dry-run command, quoted for a POSIX shell; null: none")
    argv: list[str] | None = Field(default=None, description="the command as its arguments")
    refused: str | None = Field(default=None, description="why there is no command for this host")
    rung: NextRung | None = None


class Finding(_Open):
    """One finding; for the checks in FINDING_DATA, ``data`` is also checked against that model
    (the JSON Schema leaves ``data`` open: it differs by check)."""

    check: str = Field(min_length=1)
    severity: Severity
    summary: str
    data: dict[str, Any]
    next: FindingNext | None = Field(default=None, description="what to do next; absent: nothing acts on it")

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


class CheckCoverage(_Open):
    """Whether a check could look on the host (plugins/module_utils/coverage.py)."""

    level: CoverageLevel = Field(
        description="full: it saw everything there is to see; partial: part of it; none: nothing"
    )
    reason: str | None = Field(
        default=None, description="partial and none: what it missed and why (null when full)"
    )


class ScanHost(_Open):
    status: Literal["ok", "partial", "unreachable", "failed", "not_scanned"] = Field(
        description="ok: answered, every check looked fully; partial: answered, a check could not look fully "
        "(coverage says which and why; its findings stand)"
    )
    msg: str | None = None
    timed_out: bool = False
    findings: list[Finding]
    facts: ScanFacts
    errors: list[DetectorError] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list)
    coverage: dict[str, CheckCoverage] = Field(
        default_factory=dict,
        description="per check that ran: whether it could look (absent in older reports)",
    )
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
    partial: NonNegInt = Field(default=0, description="hosts that answered with a check not fully covered")
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


class ScanSelection(_Open):
    """The hosts a scan selected (scan.selection_record); ``fleetops merge`` refuses different ones."""

    inventory: list[str] = Field(description="the inventory sources as given")
    limit: str | None = Field(description="--limit as given (null: none)")
    exclude: list[str] = Field(default_factory=list)
    hosts: str = Field(description="a digest (sha256:...) of the sorted names of every selected host")
    host_count: NonNegInt
    unmatched: list[str] = Field(default_factory=list, description="the limit's parts that matched no host")


class ScanTransport(_Open):
    """``fleetops scan --transport``: how the hosts were reached. auto (the default) and ssh, its alias: the
    direct path (fleetops' own ssh command a host) for every host but those in ``by_ansible``, which
    ansible-playbook scanned instead (and why); ansible: ansible-playbook for every host. A merge (``fleetops
    merge``): the name its sources all recorded, else mixed (each source's in ``merged.sources``)."""

    name: ScanTransportName | MixedTransport
    by_ansible: dict[HostName, str] | None = Field(
        default=None,
        description="auto and ssh: the hosts ansible-playbook scanned, and why; absent with ansible; a merge: "
        "those of its sources that went the direct path",
    )


class NextStepsRecord(_Open):
    """Where the findings' ``next`` came from: the policy, the ladders read (and why not)."""

    policy: str
    ladders: str | None = Field(default=None, description="the state directory's ladder.json")
    ladders_error: str | None = None


class MergedSource(_Open):
    path: str
    shard: ScanShard | None = None
    partial: bool = Field(
        description="a killed scan's .partial file: its hosts without an answer are not_scanned"
    )
    hosts: NonNegInt
    not_scanned: NonNegInt = 0
    transport: ScanTransportName | None = Field(
        default=None, description="its transport's name; null: not recorded (an older fleetops)"
    )
    next_steps: NextStepsRecord | None = Field(
        default=None,
        description="where its findings' next came from; null: not recorded (a partial file, an older fleetops)",
    )


class MergedFrom(_Open):
    """``fleetops merge``: the reports (or .partial files) the report was joined from."""

    sources: list[MergedSource]
    notes: list[str] = Field(default_factory=list)


class ScanReport(_Open):
    """``fleetops scan -o FILE`` / ``--format json`` / ``fleetops merge``: what ``drift --from`` and
    ``merge`` read."""

    model_config = ConfigDict(title=SCAN_SCHEMA)

    schema_: Literal["fleetops.scan/v1"] = Field(alias="schema")
    started_at: str
    duration_s: Seconds
    shard: ScanShard | None = Field(default=None, description="--shard I/N: absent for the whole selection")
    options: ScanOptionsRecord | None = Field(default=None, description="absent in older reports")
    selection: ScanSelection | None = Field(default=None, description="absent in older reports")
    merged: MergedFrom | None = Field(
        default=None, description="fleetops merge: absent in a scan's own report"
    )
    transport: ScanTransport | None = Field(
        default=None, description="absent in older reports (and merges of them)"
    )
    next_steps: NextStepsRecord | None = Field(
        default=None,
        description="absent in older reports; a merge: the record its sources share (absent when they differ)",
    )
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
    selection: ScanSelection | None = None
    transport: ScanTransport | None = Field(default=None, description="its name alone; absent in older files")


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
