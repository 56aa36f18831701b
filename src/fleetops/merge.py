"""`fleetops merge`: shard reports joined into the one report the unsharded scan would have written.

Each input is a ``fleetops.scan/v1`` report (``fleetops scan --shard I/N -o FILE``) or, for a shard
that was killed before it wrote one, its ``FILE.partial`` (``fleetops.scan.partial/v1``: the targets
first, then one line per host that answered). The merge is the same report as one scan of the whole
selection: the same hosts and entries, the summary counted again from them (``scan.summarize``), and
so the same exit code (``scan.exit_code``). What it refuses (``MergeError``, exit 2, one line):

- reports of different schema versions;
- a mix of shard reports and reports that are not shards, shards of different counts (``1/4`` with
  ``2/3``), a shard given twice, a missing shard (its hosts are unknown here: a merge without them
  would look like the whole fleet and could exit 0), a host in a shard that does not hold it;
- a host in two reports (overlapping shards or limits);
- different options (checks, thresholds, extra vars): named field by field;
- shards of different selections (inventory sources, limit, exclude, the selected hosts' digest): shards
  of different ``-l`` would merge into a report that silently lacks hosts; named field by field. Reports
  that are not shards (scans of disjoint limits) are parts of no one selection: they merge.

A partial file's targets without an answer are ``not_scanned``, never dropped; an older partial file
without its targets cannot say which hosts it missed: the merged report says so in its notes.

How the hosts were reached (``transport``) and where the findings' ``next`` came from (``next_steps``) are
the sources', recorded in each of ``merged.sources`` (None: not recorded) and joined at the top as a scan
records them (``merged_transport``, ``merged_next_steps``). Each finding keeps the ``next`` its shard gave it:
the merge does not compute them again, which would read this machine's policy and ladders (a merge has no
``--policy``, and runs elsewhere and later than the shards) and give the findings steps their scans did not.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.documents import DocumentError, parse_json, read_document
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.scan import (
    DIRECT_TRANSPORTS,
    PARTIAL_SCHEMA,
    exit_code,
    not_scanned_entry,
    read_partial_text,
    report_document,
)
from fleetops.schemas import validate_partial_header, validate_scan_report
from fleetops.util import MIXED_TRANSPORT, SCAN_SCHEMA
from fleetops.values import Shard

# The report schema each partial schema's lines belong to (a v1 partial holds v1 entries).
PARTIAL_OF = {PARTIAL_SCHEMA: SCAN_SCHEMA}
SHOWN = 5  # hosts named in an error before "(N in all)"


class MergeError(UsageError):
    """The reports cannot be merged into one scan's report (exit 2)."""


@dataclass(frozen=True)
class Source:
    """One input: a report, or a killed shard's partial file."""

    path: str
    partial: bool
    shard: Shard | None
    options: dict[str, Any] | None  # None: not recorded (an older fleetops)
    hosts: dict[str, dict[str, Any]]  # every host it accounts for (a partial's silent targets not_scanned)
    started: float
    finished: float
    interrupted: bool
    not_scanned: int
    notes: tuple[str, ...] = ()
    selection: dict[str, Any] | None = None  # None: not recorded (an older fleetops)
    transport: dict[str, Any] | None = None  # None: not recorded (an older fleetops)
    next_steps: dict[str, Any] | None = None  # None: not recorded (a partial file, an older fleetops)

    @property
    def label(self) -> str:
        return f"{self.path} (shard {self.shard})" if self.shard is not None else self.path


@dataclass(frozen=True)
class Merged:
    report: dict[str, Any]  # fleetops.scan/v1, with "merged"
    exit_code: ExitCode
    notes: list[str]


def _names(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:SHOWN])
    return shown + (f" ({len(hosts)} in all)" if len(hosts) > SHOWN else "")


def _epoch(iso: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0


def _first_line(raw: bytes) -> Any:
    line = raw.split(b"\n", 1)[0]
    try:
        return json.loads(line)
    except ValueError:
        return None


def read_raw(path: Path) -> tuple[str, bytes, Any]:
    """(schema, bytes, parsed report or None for a partial file): enough to compare schema versions
    before validating anything."""
    raw = read_document(path)
    head = _first_line(raw)
    if (
        isinstance(head, dict)
        and isinstance(head.get("schema"), str)
        and head["schema"].startswith("fleetops.scan.partial/")
    ):
        return str(head["schema"]), raw, None
    data = parse_json(raw, str(path))
    schema = data.get("schema") if isinstance(data, dict) else None
    return (schema if isinstance(schema, str) else "?"), raw, data


def _shard(value: Any) -> Shard | None:
    return Shard(int(value["index"]), int(value["count"])) if isinstance(value, dict) else None


def report_source(path: Path, data: Any) -> Source:
    """A validated report."""
    report = validate_scan_report(data, str(path))
    started = _epoch(report["started_at"])
    hosts = report["hosts"]
    return Source(
        path=str(path),
        partial=False,
        shard=_shard(report.get("shard")),
        options=report.get("options"),
        hosts=hosts,
        started=started,
        finished=started + float(report["duration_s"]),
        interrupted=bool(report.get("interrupted")),
        not_scanned=sum(1 for e in hosts.values() if e["status"] == "not_scanned"),
        selection=report.get("selection"),
        transport=report.get("transport"),
        next_steps=report.get("next_steps"),
    )


def partial_source(path: Path, raw: bytes) -> Source:
    """A killed shard's ``.partial``: its answers, and its targets without one as not_scanned."""
    source = str(path)
    # a killed writer may tear the last character too: that line is skipped (read_partial_text)
    header, answered = read_partial_text(raw.decode("utf-8", errors="replace"))
    if header is None:
        raise DocumentError(source, f"not a {PARTIAL_SCHEMA} file: its first line is no header")
    validate_partial_header(header, f"{source}: line 1")
    shard = _shard(header.get("shard"))
    targets = header.get("targets")
    notes: list[str] = []
    hosts = dict(answered)
    if targets is None:
        notes.append(
            f"{source}: an older partial file without its targets: hosts it never reached are not listed"
        )
    else:
        strays = sorted(set(answered) - set(targets))
        if strays:
            raise MergeError(f"{source}: answers from hosts it does not target: {_names(strays)}")
        why = f"not scanned: {'shard ' + str(shard) if shard else 'the scan'} was cut short ({source})"
        for host in targets:
            hosts.setdefault(host, not_scanned_entry(why))
    # every entry as a report holds it (the same checks as a report's hosts)
    validate_scan_report(report_document(hosts, started=0, finished=0), f"{source} (its host lines)")
    started = _epoch(str(header["started_at"]))
    try:
        finished = max(started, os.stat(path).st_mtime)  # its last line's time
    except OSError:
        finished = started
    missing = sum(1 for h in hosts if h not in answered)
    return Source(source, True, shard, header.get("options"), hosts, started, finished, True,
                  missing + sum(1 for e in answered.values() if e.get("status") == "not_scanned"),
                  tuple(notes), header.get("selection"), header.get("transport"))  # fmt: skip


def read_sources(paths: Sequence[Path]) -> list[Source]:
    """Every input, after the check that all are of one schema version."""
    if not paths:
        raise UsageError("nothing to merge: give the shards' reports")
    raws = [(path, *read_raw(path)) for path in paths]
    versions = {PARTIAL_OF.get(schema, schema) for _, schema, _, _ in raws}
    if len(versions) > 1:
        each = ", ".join(f"{path} is {schema}" for path, schema, _, _ in raws)
        raise MergeError(f"reports of different schema versions: {each}")
    return [
        partial_source(path, raw) if data is None else report_source(path, data)
        for path, _, raw, data in raws
    ]


def check_shards(sources: Sequence[Source]) -> None:
    """All shards of one count, each once, none missing, each holding only its own hosts; or no shards."""
    sharded = [s for s in sources if s.shard is not None]
    if not sharded:
        return
    if len(sharded) < len(sources):
        plain = next(s for s in sources if s.shard is None)
        raise MergeError(
            f"{sharded[0].label} is a shard but {plain.path} is not: merge the shards of one scan"
        )
    counts = {s.shard.count for s in sharded if s.shard is not None}
    if len(counts) > 1:
        each = ", ".join(s.label for s in sharded)
        raise MergeError(f"shards of different counts: {each}")
    count = counts.pop()
    seen: dict[int, Source] = {}
    for s in sharded:
        assert s.shard is not None
        if s.shard.index in seen:
            raise MergeError(f"shard {s.shard} given twice: {seen[s.shard.index].path} and {s.path}")
        seen[s.shard.index] = s
        strays = sorted(h for h in s.hosts if not s.shard.holds(h))
        if strays:
            raise MergeError(f"{s.label} holds hosts of another shard: {_names(strays)}")
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in seen]
    if missing:
        raise MergeError(
            f"shard {', '.join(missing)} missing (given {len(seen)} of {count}): its hosts are unknown here; "
            "merge every shard's report, or the .partial file of one that was killed, or scan it again "
            "(a host stays in its shard)"
        )


def check_options(sources: Sequence[Source]) -> dict[str, Any] | None:
    """The options every report shares (None when none recorded them); MergeError naming each field
    that differs."""
    return _same(sources, "options", "options", "they ran the same checks and thresholds")


def check_selection(sources: Sequence[Source]) -> dict[str, Any] | None:
    """The selection every report shares (None when none recorded it); MergeError naming each field
    that differs (``scan.selection_record``)."""
    return _same(sources, "selection", "selections", "they selected the same hosts")


def _same(sources: Sequence[Source], key: str, plural: str, proves: str) -> dict[str, Any] | None:
    first = sources[0]
    recorded: list[dict[str, Any] | None] = [getattr(s, key) for s in sources]
    for s, value in zip(sources[1:], recorded[1:], strict=True):
        if (value is None) != (recorded[0] is None):
            old, new = (s, first) if value is None else (first, s)
            raise MergeError(f"{key}: recorded in {new.path}, not in {old.path} (an older fleetops): "
                             f"cannot tell that {proves}")  # fmt: skip
    if recorded[0] is None:
        return None
    fields = sorted({k for r in recorded for k in (r or {})})
    differ: list[str] = []
    for name in fields:
        values = [(s, (r or {}).get(name)) for s, r in zip(sources, recorded, strict=True)]
        if any(v != values[0][1] for _, v in values[1:]):
            each = ", ".join(f"{json.dumps(v)} in {s.path}" for s, v in values)
            differ.append(f"{name}: {each}")
    if differ:
        raise MergeError(f"the reports are of different scans: {plural} differ: " + "; ".join(differ))
    return recorded[0]


def check_overlap(sources: Sequence[Source]) -> None:
    owner: dict[str, str] = {}
    twice: dict[str, list[str]] = {}
    for s in sources:
        for host in s.hosts:
            if host in owner:
                twice.setdefault(host, [owner[host]]).append(s.path)
            else:
                owner[host] = s.path
    if twice:
        hosts = sorted(twice)
        shown = "; ".join(f"{h} ({', '.join(twice[h])})" for h in hosts[:SHOWN])
        more = "; ..." if len(hosts) > SHOWN else ""
        raise MergeError(f"overlapping reports: {len(hosts)} host(s) in more than one: {shown}{more}")


def merged_transport(sources: Sequence[Source], notes: list[str]) -> dict[str, Any] | None:
    """The sources' ``transport`` as one: the name they all recorded, else ``mixed`` (they differ, or some did
    not record one); ``by_ansible``: every source's hosts the direct path could not serve (a partial file
    cannot say which: ``notes`` says so). None when no source recorded how it reached its hosts."""
    recorded = [s.transport for s in sources]
    if all(t is None for t in recorded):
        return None
    names = {t["name"] if t is not None else None for t in recorded}
    out: dict[str, Any] = {"name": names.pop() if len(names) == 1 else MIXED_TRANSPORT}
    by_ansible: dict[str, str] = {}
    direct = False
    for s, t in zip(sources, recorded, strict=True):
        if t is None:
            continue
        if "by_ansible" in t:
            direct = True
            by_ansible.update(t["by_ansible"] or {})
        elif s.partial and t["name"] in DIRECT_TRANSPORTS:
            direct = True
            notes.append(
                f"{s.label}: a partial file does not say which of its hosts ansible-playbook scanned"
            )
    if direct:
        out["by_ansible"] = {h: by_ansible[h] for h in sorted(by_ansible)}
    return out


def merged_next_steps(sources: Sequence[Source], notes: list[str]) -> dict[str, Any] | None:
    """The sources' ``next_steps`` record (the policy and ladders their findings' ``next`` came from) when all
    that recorded one recorded the same; None when none did, or they differ (``notes`` says so: each one's is
    in ``merged.sources``)."""
    records = [s.next_steps for s in sources if s.next_steps is not None]
    if not records:
        return None
    if any(r != records[0] for r in records[1:]):
        notes.append(
            "the reports' next steps came from different policies or ladders: each one's is in merged.sources"
        )
        return None
    return records[0]


def merge(paths: Sequence[Path]) -> Merged:
    """The shards' reports (or partial files) at ``paths`` as one scan report; MergeError when they
    are not the parts of one scan."""
    sources = read_sources(paths)
    check_shards(sources)
    options = check_options(sources)
    # shards are the parts of one selection; reports that are not shards (disjoint --limit's) merge as parts
    selection = check_selection(sources) if sources[0].shard is not None else None
    check_overlap(sources)
    hosts: dict[str, dict[str, Any]] = {}
    for s in sources:
        hosts.update(s.hosts)
    if not hosts:
        raise MergeError("the reports hold no host: nothing to merge (an empty selection never means all)")
    notes = [n for s in sources for n in s.notes]
    for s in sources:
        if s.partial:
            notes.append(f"{s.label}: a killed scan's partial file: {s.not_scanned} host(s) not scanned")
        elif s.interrupted:
            notes.append(f"{s.label}: an interrupted scan: {s.not_scanned} host(s) not scanned")
    transport = merged_transport(sources, notes)
    steps = merged_next_steps(sources, notes)
    merged = {
        "sources": [
            {"path": s.path, "shard": s.shard.to_dict() if s.shard else None, "partial": s.partial,
             "hosts": len(s.hosts), "not_scanned": s.not_scanned,
             "transport": s.transport["name"] if s.transport is not None else None,
             "next_steps": s.next_steps}
            for s in sources
        ],
        "notes": notes,
    }  # fmt: skip
    selected: dict[str, Any] = {"selection": selection} if selection is not None else {}
    selected |= {"transport": transport} if transport is not None else {}
    selected |= {"next_steps": steps} if steps is not None else {}
    report = report_document(
        hosts,
        started=min(s.started for s in sources),
        finished=max(s.finished for s in sources),
        interrupted=any(s.interrupted for s in sources),
        options=options,
        **selected,
        merged=merged,
    )
    return Merged(report, exit_code(report), notes)
