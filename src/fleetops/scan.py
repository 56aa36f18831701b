"""`fleetops scan`: run playbooks/scan.yml (one module call per host) and build the scan report.

The report is the JSON contract ``fleetops.scan/v1`` that every other command reads:
``{"schema", "hosts": {name: {"status", "findings", "facts", ...}}, "summary": {...}}``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleetops.ansible import facts
from fleetops.ansible.facts import SCAN_ACTIONS
from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook
from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.util import (
    SCAN_HOST_SCHEMA,
    SCAN_SCHEMA,
    SCAN_TRANSPORTS,
    atomic_write,
    digest_value,
    iso_utc,
    open_append,
)
from fleetops.values import Shard

SCHEMA = SCAN_SCHEMA
SCAN_PLAYBOOK = "fleetops.node.scan"

# Default forks: min(targeted hosts, MAX_FORKS). ansible-playbook itself starts
# min(forks, hosts in the play) workers (TaskQueueManager._initialize_processes), so passing the cap
# gives exactly that without listing the inventory first. Measured by bench/scan_fleet.py.
MAX_FORKS = 100
# ssh's connect timeout (banner exchange included) is ansible's `timeout` (10 s in ansible.cfg),
# lowered to half of --host-timeout when that is shorter, so that ssh gives up on a host whose
# sshd hangs (unreachable, with ssh's own reason) before the task timeout fires.
CONNECT_TIMEOUT_S = 10
NOT_SCANNED_MSG = "no answer before the scan was interrupted"
NO_RESULT_MSG = "no result: the scan ended without an answer from this host"
PARTIAL_SCHEMA = "fleetops.scan.partial/v1"
# --transport, how hosts are reached (ScanOptions.transport; the report's ``transport``):
# - "auto", the default: fleetops' own ssh command a host (fleetops.ansible.direct, the runner node_health's
#   action stages, a seventh of ansible-playbook's controller CPU) for every host it can serve, and
#   ansible-playbook for the others (``direct``'s ``fallback``: another connection type, a become password, a
#   template, a host whose runner gives no answer) in the same scan, named with why in ``transport.by_ansible``;
# - "ansible": ansible-playbook (playbooks/scan.yml) for every host, as AWX's scan template runs it;
# - "ssh": what "auto" was called before it was the default, kept as its alias (a scan that wanted the direct
#   path alone would have to fail the hosts it cannot serve, which no transport does).
TRANSPORTS = SCAN_TRANSPORTS
DEFAULT_TRANSPORT = "auto"
DIRECT_TRANSPORTS = ("auto", "ssh")  # the direct path first, ansible-playbook for the rest
# --fail-on: what makes a scan exit 1 (FINDINGS): findings of these severities, and with PARTIAL a host that
# answered partial (a check could not look fully). "warning", the default, is the exit code a scan always
# had (a partial host alone exits 0: its status, reason and gauge say it); "critical" lets a schedule (a
# timer, a CI job) stay green on warnings; "partial" is "warning" that also fails on blind spots; "never"
# leaves findings to the report and the metrics. A host that could not be scanned exits 3 whatever it says.
PARTIAL = "partial"
FAIL_ON: dict[str, tuple[str, ...]] = {
    "never": (),
    "warning": ("critical", "warning"),
    "critical": ("critical",),
    "partial": ("critical", "warning", PARTIAL),
}
FAIL_ON_DEFAULT = "warning"


@dataclass
class ScanOptions:
    inventory: Sequence[Path] = ()
    limit: str | None = None
    checks: Sequence[str] | None = None
    # node_health's own options: None leaves the module's default (plugins/module_utils/memcg.py
    # DEFAULT_THRESHOLDS, node_health's argument_spec); only what the caller set is passed
    sample_seconds: float | None = None
    zombie_warning: int | None = None
    zombie_critical: int | None = None
    headroom_critical_pct: float | None = None
    forks: int | None = None  # None: min(targeted hosts, MAX_FORKS)
    host_timeout: int = 120
    extravars: dict[str, Any] = field(default_factory=dict)
    # --shard I/N: only the selected hosts that shard holds (fleetops.values.Shard), named exactly
    shard: Shard | None = None
    # how hosts are reached (TRANSPORTS): "auto" (the default) and its alias "ssh", one ssh command a host from
    # this process (fleetops.ansible.direct) and ansible-playbook for the hosts it cannot serve; "ansible",
    # ansible-playbook (playbooks/scan.yml) for every host
    transport: str = DEFAULT_TRANSPORT

    def runner_forks(self) -> int:
        return self.forks or MAX_FORKS

    def connect_timeout(self) -> int | None:
        """ssh connect timeout to pass, or None to keep ansible's (when --host-timeout is generous)."""
        if self.host_timeout <= 0 or self.host_timeout // 2 >= CONNECT_TIMEOUT_S:
            return None
        return max(1, self.host_timeout // 2)

    def playbook_vars(self) -> dict[str, Any]:
        """Extra vars for playbooks/scan.yml (its documented knobs)."""
        xv: dict[str, Any] = {"fleetops_host_timeout": self.host_timeout}
        for name in ("sample_seconds", "zombie_warning", "zombie_critical", "headroom_critical_pct"):
            value = getattr(self, name)
            if value is not None:
                xv[f"fleetops_{name}"] = value
        if self.checks:
            xv["fleetops_checks"] = list(self.checks)
        xv.update(self.extravars)
        return xv

    def record(self) -> dict[str, Any]:
        """What decides the scan's findings, as its report records it (``options``): the checks and
        thresholds as given (None: the module's default) and a digest of the extra vars (a -e value
        may be a secret). ``fleetops merge`` refuses reports whose options differ."""
        extra = json.dumps(self.extravars, sort_keys=True, default=str) if self.extravars else None
        return {
            "checks": sorted(self.checks) if self.checks else None,
            "sample_seconds": self.sample_seconds,
            "zombie_warning": self.zombie_warning,
            "zombie_critical": self.zombie_critical,
            "headroom_critical_pct": self.headroom_critical_pct,
            "extra_vars": digest_value(extra) if extra is not None else None,
        }


def host_entry(results: Sequence[TaskResult]) -> dict[str, Any]:
    """One host's part of the report, from its task results (the node_health call, or the failure)."""
    for tr in results:
        if tr.status == "unreachable":
            return {"status": "unreachable", "msg": tr.msg, "findings": [], "facts": {}}
        if tr.status == "failed" and tr.result.get("timedout"):
            # No answer within --host-timeout: a hung sshd behind a live ControlPersist connection
            # (a fresh connection would have hit ssh's connect timeout: unreachable), or a hung host.
            msg = f"no answer within the per-host timeout: {tr.msg}"
            return {"status": "unreachable", "timed_out": True, "msg": msg, "findings": [], "facts": {}}
    scan = next((tr for tr in results if tr.action in SCAN_ACTIONS), None)
    if scan is None:
        failed = next((tr for tr in results if tr.status == "failed"), None)
        msg = failed.msg if failed else "no scan result"
        return {"status": "failed", "msg": msg, "findings": [], "facts": {}}
    if scan.status == "failed":
        return {"status": "failed", "msg": scan.msg, "findings": [], "facts": {}}
    res = scan.result
    coverage = {str(check): dict(c) for check, c in (res.get("coverage") or {}).items()}
    entry: dict[str, Any] = {
        # partial: a check could not look fully (coverage: each check's level and reason)
        "status": facts.answered_status(coverage),
        "findings": list(res.get("findings") or []),
        "facts": dict(res.get("facts") or {}),
        "errors": list(res.get("errors") or []),
        "checks": list(res.get("checks") or []),
    }
    if "coverage" in res:  # every node_health of this collection says it; an older one's answer has none
        entry["coverage"] = coverage
    if res.get("duration_ms") is not None:
        entry["duration_ms"] = res["duration_ms"]
    return entry


def host_record(host: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One host as ``scan --format ndjson`` writes it (``fleetops.scan.host/v1``, schemas.ScanHostLine):
    its report entry with its name, so each line stands alone."""
    return {"schema": SCAN_HOST_SCHEMA, "host": host, **entry}


def not_scanned_entry(msg: str = NOT_SCANNED_MSG) -> dict[str, Any]:
    """A targeted host that never answered (the scan was interrupted first)."""
    return {"status": "not_scanned", "msg": msg, "findings": [], "facts": {}}


def build_report(
    run: PlaybookRun,
    *,
    started: float,
    finished: float,
    targeted: Sequence[str] = (),
    shard: Shard | None = None,
    options: dict[str, Any] | None = None,
    transport: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report; ``targeted`` hosts that have no result (an interrupted scan) show as not_scanned.
    ``shard`` and ``options``, when given, are recorded (``fleetops merge`` reads them); ``transport``: how
    the hosts were reached (its ``name``; ``by_ansible``, with auto and ssh: the hosts ansible-playbook
    scanned instead of the direct path, and why)."""
    answered = {h: host_entry(run.results_for(h)) for h in run.hosts()}
    why = NOT_SCANNED_MSG if run.interrupted else NO_RESULT_MSG
    missing = {h: not_scanned_entry(why) for h in targeted if h not in answered}
    hosts = {h: (answered.get(h) or missing[h]) for h in sorted({**answered, **missing})}
    return report_document(
        hosts,
        started=started,
        finished=finished,
        interrupted=run.interrupted,
        shard=shard,
        options=options,
        **({"transport": transport} if transport is not None else {}),
    )


def report_document(
    hosts: dict[str, dict[str, Any]],
    *,
    started: float,
    finished: float,
    interrupted: bool = False,
    shard: Shard | None = None,
    options: dict[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``fleetops.scan/v1`` document of ``hosts`` (sorted by name), with its summary."""
    return {
        "schema": SCHEMA,
        "started_at": iso_utc(started),
        "duration_s": round(finished - started, 3),
        **({"shard": shard.to_dict()} if shard is not None else {}),
        **({"options": options} if options is not None else {}),
        **more,
        "hosts": {h: hosts[h] for h in sorted(hosts)},
        "summary": summarize(hosts),
        **({"interrupted": True} if interrupted else {}),
    }


def summarize(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    findings = dict.fromkeys(facts.severities(), 0)
    # ok, partial (answered, a check could not look fully), unreachable, failed; plus not_scanned, in an
    # interrupted scan
    status = dict.fromkeys((*facts.answered_statuses(), "unreachable", "failed"), 0)
    errors = node_errors = 0
    for entry in hosts.values():
        status[entry["status"]] = status.get(entry["status"], 0) + 1
        errors += len(entry.get("errors") or [])
        node_errors += 1 if (entry.get("node") or {}).get("error") else 0
        for f in entry["findings"]:
            sev = f.get("severity", "info")
            findings[sev] = findings.get(sev, 0) + 1
    return {"hosts": len(hosts), **status, "findings": findings, "errors": errors} | (
        {"node_errors": node_errors} if node_errors else {}
    )


def node_out(node: Mapping[str, Any]) -> bool:
    """A report entry's scheduler node (``node``) takes no new work: any phase but in, missing (the scheduler
    does not list it) and unknown (it could not be read)."""
    return node.get("phase") not in ("in", "missing", "unknown")


def with_nodes(report: dict[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``report`` with each host's scheduler node (``nodes``: ``fleetops.nodes.scan_view``) in its entry
    (``node``), and its summary counted again (``node_errors``: hosts whose node could not be read)."""
    if not nodes:
        return report
    hosts = {h: ({**e, "node": dict(nodes[h])} if h in nodes else e) for h, e in report["hosts"].items()}
    return {**report, "hosts": hosts, "summary": summarize(hosts)}


def selection_record(
    inventory: Sequence[Path | str], limit: str | None, hosts: Sequence[str], unmatched: Sequence[str] = ()
) -> dict[str, Any]:
    """What a scan selected, as its report records it (``selection``; ``fleetops merge`` refuses shards of
    different ones, naming the field): the inventory sources, the limit and the exclude (a scan has none)
    as given, a digest of the sorted names of every selected host (before a shard took its part) and their
    count; ``unmatched``: the limit's parts that matched no host (a scan keeps ansible's behaviour)."""
    names = sorted(hosts)
    return {"inventory": [str(p) for p in inventory], "limit": limit, "exclude": [],
            "hosts": digest_value("\n".join(names)), "host_count": len(names),
            **({"unmatched": list(unmatched)} if unmatched else {})}  # fmt: skip


def exit_code(report: dict[str, Any], fail_on: str = FAIL_ON_DEFAULT) -> ExitCode:
    """3 if any host was unreachable/failed/not scanned (or a detector could not run, or its scheduler
    could not be read), else 1 on a finding at least as severe as ``fail_on`` (FAIL_ON: by default a
    warning or critical one; "never": none) or, with ``partial``, a host that answered partial, else 0.
    (The CLI exits 130 for an interrupted scan whatever this says.)"""
    s = report["summary"]
    if s["unreachable"] or s["failed"] or s.get("not_scanned") or s.get("errors") or s.get("node_errors"):
        return ExitCode.FAILED
    counted = FAIL_ON[fail_on]
    if any(s["findings"].get(severity) for severity in counted if severity != PARTIAL):
        return ExitCode.FINDINGS
    if PARTIAL in counted and s.get(PARTIAL):
        return ExitCode.FINDINGS
    return ExitCode.OK


def shard_hosts(hosts: Sequence[str], shard: Shard | None) -> list[str]:
    """The ``hosts`` that ``shard`` holds (all of them when there is no shard), in their order."""
    return list(hosts) if shard is None else [h for h in hosts if shard.holds(h)]


def run_scan(
    opts: ScanOptions,
    on_host: Callable[[str, dict[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
    targets: Sequence[str] | None = None,
    hosts: Sequence[InventoryHost] | None = None,
) -> dict[str, Any]:
    """Scan every targeted host in one playbook run and return the report.

    ``on_host`` gets each host's entry as it answers. When ``cancel`` stops the run, the report is
    marked interrupted and lists the targeted hosts that never answered as ``not_scanned`` (the one
    case that lists the inventory, unless the caller gave the ``targets`` it listed).

    With ``opts.shard`` the scan runs on exactly the targets that shard holds (``targets``: those
    hosts, already selected; None: the inventory is listed for them), each shown in the report,
    ``not_scanned`` when it gave no answer; a shard that holds none of them is an empty report,
    nothing run (an empty selection never means all).

    With ``opts.transport`` auto (the default) or ssh the hosts (``hosts``: the listed targets with their
    variables; None: listed here) are scanned by ``fleetops.ansible.direct``, and those it cannot serve by
    the playbook, in one report; with ansible, every host by the playbook.
    """
    if opts.transport not in TRANSPORTS:
        raise UsageError(f"--transport: {opts.transport!r} is not one of {', '.join(TRANSPORTS)}")
    started = time.time()
    limit = opts.limit
    if opts.shard is not None:
        if targets is None:
            from fleetops.ansible.inventory import load_hosts

            targets = shard_hosts([h.name for h in load_hosts(opts.inventory, opts.limit)], opts.shard)
        if not targets:
            return report_document({}, started=started, finished=time.time(), shard=opts.shard,
                                   options=opts.record())  # fmt: skip
        # exactly these names, one a line in a limit file (ansible's --limit @FILE): joined with commas, a
        # shard of a large fleet passes Linux's 128 KiB limit on one argument (7,500 EC2 names: 210 KB)
        limit_dir = tempfile.mkdtemp(prefix="fleetops-shard-")  # 0700
        atomic_write(Path(limit_dir, "limit"), "\n".join(targets))
        limit = f"@{Path(limit_dir, 'limit')}"
    else:
        limit_dir = None

    def on_result(tr: TaskResult) -> None:
        if on_host is not None and (tr.action in SCAN_ACTIONS or tr.status in ("unreachable", "failed")):
            on_host(tr.host, host_entry([tr]))

    def playbook(limit: str | None) -> PlaybookRun:
        return run_playbook(
            RunnerOptions(
                playbook=SCAN_PLAYBOOK,
                inventory=opts.inventory,
                limit=limit,
                extravars=opts.playbook_vars(),
                forks=opts.runner_forks(),
                connect_timeout=opts.connect_timeout(),
            ),
            on_result=on_result,
            cancel=cancel,
        )

    transport: dict[str, Any] = {"name": opts.transport}
    try:
        if opts.transport in DIRECT_TRANSPORTS:
            run, by_ansible = _run_direct(opts, playbook, on_result, cancel, targets, hosts)
            transport["by_ansible"] = by_ansible
        else:
            run = playbook(limit)
    finally:
        if limit_dir is not None:
            shutil.rmtree(limit_dir, ignore_errors=True)
    if opts.shard is not None:
        targeted = list(targets or ())
    elif run.interrupted:
        targeted = list(targets) if targets is not None else targeted_hosts(opts)
    else:
        targeted = []
    return build_report(
        run,
        started=started,
        finished=time.time(),
        targeted=targeted,
        shard=opts.shard,
        options=opts.record(),
        transport=transport,
    )


def _run_direct(
    opts: ScanOptions,
    playbook: Callable[[str | None], PlaybookRun],
    on_result: Callable[[TaskResult], None],
    cancel: threading.Event | None,
    targets: Sequence[str] | None,
    hosts: Sequence[InventoryHost] | None,
) -> tuple[PlaybookRun, dict[str, str]]:
    """The scan over ssh from this process, and the hosts it could not serve -> why: those went through
    ``playbook`` (one run, limited to them), their results joined in."""
    from fleetops.ansible import direct
    from fleetops.ansible.inventory import load_hosts

    listed = list(hosts) if hosts is not None else load_hosts(opts.inventory, opts.limit)
    if targets is not None:
        wanted = set(targets)
        listed = [h for h in listed if h.name in wanted]
    done = direct.run(
        listed,
        opts.playbook_vars(),
        forks=opts.runner_forks(),
        host_timeout=opts.host_timeout or None,  # 0: no limit
        connect_timeout=opts.connect_timeout(),
        on_result=on_result,
        cancel=cancel,
    )
    run = done.run
    if not done.fallback:
        return run, {}
    limit_dir = tempfile.mkdtemp(prefix="fleetops-fallback-")  # 0700
    try:
        atomic_write(Path(limit_dir, "limit"), "\n".join(done.fallback))
        rest = playbook(f"@{Path(limit_dir, 'limit')}")
    finally:
        shutil.rmtree(limit_dir, ignore_errors=True)
    for host, results in rest.tasks.items():
        run.tasks.setdefault(host, []).extend(results)
    run.warnings.extend(rest.warnings)
    run.interrupted = run.interrupted or rest.interrupted
    if rest.status != "successful":
        run.status, run.rc = rest.status, rest.rc
    return run, dict(sorted(done.fallback.items()))


def targeted_hosts(opts: ScanOptions) -> list[str]:
    """The hosts the scan's inventory and limit select (ansible-inventory); [] when it cannot tell."""
    from fleetops.ansible.inventory import load_hosts

    try:
        return [h.name for h in load_hosts(opts.inventory, opts.limit)]
    except FleetopsError:
        return []


class PartialReport:
    """The scan so far, one JSON line per host as it answers, so an interrupted scan keeps it.

    Line 1 is ``{"schema": "fleetops.scan.partial/v1", "started_at": ...}``, with, when the caller
    knows them, ``"targets"`` (every host the scan targets, before any answer: a scan killed half way
    still says which hosts it did not scan), ``"shard"``, ``"options"``, ``"selection"`` and ``"transport"``
    (its ``name`` alone: which hosts ansible-playbook scanned is known at the end) as the report records them;
    each next line is ``{"host": NAME, "entry": {...}}`` with the entry as in the final report.
    Appending a line is O(1) per host at any fleet size (rewriting a whole report per host would be
    quadratic). The file is removed once the final report has been written (``close(done=True)``).
    ``fleetops merge`` reads it (``read_partial_file``) in place of a killed shard's report.
    """

    def __init__(
        self,
        path: Path,
        *,
        targets: Sequence[str] | None = None,
        shard: Shard | None = None,
        options: dict[str, Any] | None = None,
        selection: dict[str, Any] | None = None,
        transport: str | None = None,
    ) -> None:
        self.path = path
        self.hosts = 0
        try:  # append-only, 0600, never through a symbolic link planted at the path
            fd = open_append(path, truncate=True)
        except OSError as exc:
            why = "a symbolic link (not followed)" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            raise UsageError(f"cannot write {path}: {why}") from None
        self._fh: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8")
        header: dict[str, Any] = {"schema": PARTIAL_SCHEMA, "started_at": iso_utc(time.time())}
        if targets is not None:
            header["targets"] = list(targets)
        if shard is not None:
            header["shard"] = shard.to_dict()
        if options is not None:
            header["options"] = options
        if selection is not None:
            header["selection"] = selection
        if transport is not None:
            header["transport"] = {"name": transport}
        self._write(header)
        self.targeted = targets is not None

    def add(self, host: str, entry: dict[str, Any]) -> None:
        self._write({"host": host, "entry": entry})
        self.hosts += 1

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._fh.flush()

    def close(self, done: bool) -> None:
        """Close; remove the file when the final report is written (done) or nothing arrived."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if done or not (self.hosts or self.targeted):  # the targets alone say what was not scanned
            self.path.unlink(missing_ok=True)


def write_report(path: Path, text: str) -> None:
    """Write the report atomically (a reader sees the old file or the whole new one, never a torn
    one), 0600: a report names hosts, units and their environment."""
    atomic_write(path, text)


def read_partial(path: Path) -> dict[str, dict[str, Any]]:
    """Host entries from a partial file (a torn last line, from a killed scan, is skipped)."""
    return read_partial_text(path.read_text(encoding="utf-8"))[1]


def read_partial_text(text: str) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """A partial file's header (its first line, None when that is not one) and host entries (a torn
    line, from a killed scan, is skipped)."""
    header: dict[str, Any] | None = None
    hosts: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(text.splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if number == 0 and record.get("schema") == PARTIAL_SCHEMA:
            header = record
        elif "host" in record and isinstance(record.get("entry"), dict):
            hosts[str(record["host"])] = record["entry"]
    return header, hosts
