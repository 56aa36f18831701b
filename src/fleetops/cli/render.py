"""Human-readable rendering of scan and drift reports (their JSON contracts are built in fleetops.scan and
fleetops.drift)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetops.ansible.facts import answered_statuses, severities
from fleetops.cli.args import SUMMARY_ABOVE
from fleetops.cli.render_findings import SEVERITY_STYLE, STATUS_STYLE, render_findings, render_next_summary
from fleetops.drift import UNKNOWN_GROUP
from fleetops.scan import node_out

__all__ = ["SEVERITY_STYLE", "STATUS_STYLE", "host_line", "node_cell", "render_drift", "render_scan"]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def node_cell(node: Mapping[str, Any] | None) -> str:
    """A host's scheduler node in a few words (``-``: no node read): ``slurm in``, ``slurm drained by
    fleetops``, ``slurm down: <reason>`` (someone else's), ``slurm unknown`` (not read)."""
    if not node:
        return "-"
    text = f"{node.get('backend')} {node.get('phase')}"
    if node_out(node):
        text += " by fleetops" if node.get("ours") else (f": {node['reason']}" if node.get("reason") else "")
    return text


def host_line(host: str, entry: dict[str, Any]) -> str:
    """One progress line for a host that just answered."""
    status = entry["status"]
    node = f" ({escape(node_cell(entry['node']))})" if entry.get("node") else ""
    if status not in answered_statuses():
        return f"[{STATUS_STYLE.get(status, '')}]{host}: {status}[/] {entry.get('msg', '')}".rstrip() + node
    worst = worst_severity(entry["findings"])
    tail = f"{len(entry['findings'])} finding(s), worst {worst}" if worst else "no findings"
    blind = not_full(entry)
    if blind:
        tail += "; could not look fully: " + escape(
            ", ".join(f"{c} ({cov['level']})" for c, cov in blind.items())
        )
    return f"[{STATUS_STYLE.get(status, '')}]{host}: {status}[/] {tail}{node}"


def not_full(entry: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The checks of a host's entry that could not look fully: {check: {level, reason}}."""
    return {str(c): cov for c, cov in (entry.get("coverage") or {}).items() if cov.get("level") != "full"}


def coverage_lines(hosts: Mapping[str, Mapping[str, Any]], named: int | None = None) -> list[str]:
    """A line per check and reason that could not look fully, with its hosts. ``named`` (a summarised
    fleet): a line per check and level, its hosts counted and the first ``named`` of them named, and its
    most common reason (reasons that hold counts differ from host to host)."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for host, entry in hosts.items():
        for check, cov in not_full(entry).items():
            reason = "" if named is not None else str(cov.get("reason") or "")
            grouped.setdefault((check, str(cov.get("level")), reason), []).append(host)
    lines = []
    for (check, level, reason), names in grouped.items():
        if named is None:
            who = escape(" ".join(names))
        else:
            common = Counter(
                str(hosts[h]["coverage"][check].get("reason") or "") for h in names
            ).most_common()
            reason = common[0][0] + (f" (and {len(common) - 1:,} other reason(s))" if len(common) > 1 else "")
            who = f"{len(names):,} host(s) ({_names(names, named)})"
        lines.append(f"  [yellow]{'partial':8}[/] {who}: {escape(check)} ({level}): {escape(reason)}")
    return lines


def node_lines(hosts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The scheduler nodes of a scan in a few lines: how many are out of service, by phase and by whom, and
    each distinct reason the scheduler could not be read (once, with its host count)."""
    nodes = [e["node"] for e in hosts.values() if e.get("node")]
    if not nodes:
        return []
    out = Counter(
        f"{n['phase']} by {'fleetops' if n.get('ours') else 'someone else'}" for n in nodes if node_out(n)
    )
    missing = sum(1 for n in nodes if n.get("phase") == "missing")
    line = f"  scheduler: {len(nodes):,} node(s) read, {sum(out.values()):,} out of service"
    line += (": " + ", ".join(f"{k} {v:,}" for k, v in sorted(out.items()))) if out else ""
    line += f"; {missing:,} not listed by the scheduler" if missing else ""
    errors = Counter(str(n["error"]) for n in nodes if n.get("error"))
    return [escape(line)] + [
        f"  [bold red]error   [/] {escape(err)} ({count:,} host(s))" for err, count in errors.items()
    ]


def worst_severity(findings: list[dict[str, Any]]) -> str | None:
    for sev in severities():
        if any(f.get("severity") == sev for f in findings):
            return sev
    return None


# What a summarised table shows: the worst hosts, the groups most affected, the hosts named per status.
WORST_HOSTS = 20
TOP_GROUPS = 10
NAMED_PER_STATUS = 10
NO_RESULT = ("unreachable", "failed", "not_scanned")


def severity_counts(entry: Mapping[str, Any]) -> tuple[int, ...]:
    """A host's findings per severity, worst first (``severities()`` order): how hosts are ranked."""
    found = Counter(f.get("severity") for f in entry.get("findings") or [])
    return tuple(found.get(sev, 0) for sev in severities())


def check_counts(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per check: its findings per severity, the hosts with one (``hosts``) and its detector errors
    (``errors``); checks with the most critical, then warning, ... findings first."""
    out: dict[str, dict[str, int]] = {}

    def row(check: str) -> dict[str, int]:
        return out.setdefault(check, {**dict.fromkeys(severities(), 0), "hosts": 0, "errors": 0})

    for entry in hosts.values():
        for check in {str(f.get("check")) for f in entry.get("findings") or []}:
            row(check)["hosts"] += 1
        for f in entry.get("findings") or []:
            r = row(str(f.get("check")))
            sev = str(f.get("severity", "info"))
            r[sev] = r.get(sev, 0) + 1
        for err in entry.get("errors") or []:
            row(str(err.get("check")))["errors"] += 1
    rank = (*severities(), "errors")
    return dict(sorted(out.items(), key=lambda kv: (*(-kv[1].get(k, 0) for k in rank), kv[0])))


def worst_hosts(hosts: Mapping[str, Mapping[str, Any]], n: int = WORST_HOSTS) -> list[str]:
    """The ``n`` hosts with the worst findings: most critical, then most warning, ... (then by name)."""
    found = [(tuple(-c for c in severity_counts(e)), h) for h, e in hosts.items() if e.get("findings")]
    return [h for _, h in sorted(found)[:n]]


def group_counts(
    hosts: Mapping[str, Mapping[str, Any]], groups: Mapping[str, str | None]
) -> dict[str, dict[str, int]]:
    """Per group (a host's AZ, ``UNKNOWN_GROUP`` when it has none): its hosts, those whose worst finding
    is each severity, those without a result (``no_result``) and ``affected``, the hosts with a
    critical or warning finding or no result; the groups with the largest share of their hosts
    affected first (an AZ where most hosts fail stands out, whatever its size), then by count."""
    out: dict[str, dict[str, int]] = {}
    for host, entry in hosts.items():
        group = groups.get(host) or UNKNOWN_GROUP
        row = out.setdefault(
            group, {"hosts": 0, **dict.fromkeys(severities(), 0), "no_result": 0, "affected": 0}
        )
        row["hosts"] += 1
        if entry.get("status") in NO_RESULT:
            row["no_result"] += 1
            row["affected"] += 1
        elif (worst := worst_severity(entry.get("findings") or [])) is not None:
            row[worst] += 1
            row["affected"] += worst in severities()[:2]
    return dict(
        sorted(out.items(), key=lambda kv: (-kv[1]["affected"] / kv[1]["hosts"], -kv[1]["affected"], kv[0]))
    )


def _names(names: list[str], n: int = NAMED_PER_STATUS) -> str:
    more = f" ... and {len(names) - n:,} more" if len(names) > n else ""
    return escape(" ".join(names[:n])) + more


def _findings_cell(entry: Mapping[str, Any], width: int = 80) -> str:
    """``zombie_memcg:critical x3, ecc_errors:warning``: each check and severity once, worst first."""
    order = {sev: i for i, sev in enumerate(severities())}
    found = Counter((f["check"], f["severity"]) for f in entry["findings"])
    ranked = sorted(found.items(), key=lambda kv: (order.get(kv[0][1], len(order)), -kv[1], kv[0][0]))
    text = ", ".join(f"{c}:{sev}" + (f" x{n}" if n > 1 else "") for (c, sev), n in ranked) or "-"
    return escape(text if len(text) <= width else text[: width - 3] + "...")


def render_scan_summary(
    report: Mapping[str, Any], console: Console, groups: Mapping[str, str | None] | None = None
) -> None:
    """A large scan for people: counts per check and severity, the worst hosts, the groups most
    affected (when ``groups`` gives hosts' AZ), the hosts without a result by status (first ones named)."""
    hosts: Mapping[str, Mapping[str, Any]] = report["hosts"]
    sevs = severities()
    checks = Table(title=f"findings by check ({len(hosts):,} hosts)", title_justify="left")
    checks.add_column("check")
    for sev in sevs:
        checks.add_column(sev, justify="right")
    checks.add_column("hosts", justify="right")
    checks.add_column("detector errors", justify="right")
    for check, counts in check_counts(hosts).items():
        checks.add_row(
            escape(check), *(_num(counts[sev]) for sev in sevs), _num(counts["hosts"]), _num(counts["errors"])
        )
    if checks.row_count:
        console.print(checks)
    else:
        console.print("[green]no findings[/]")
    worst = worst_hosts(hosts)
    if worst:
        with_findings = sum(1 for e in hosts.values() if e.get("findings"))
        t = Table(
            title=f"worst hosts ({len(worst)} of {with_findings:,} with findings)", title_justify="left"
        )
        t.add_column("host")
        if groups:
            t.add_column("group")
        for sev in sevs:
            t.add_column(sev, justify="right")
        t.add_column("findings")
        for h in worst:
            entry = hosts[h]
            style = SEVERITY_STYLE.get(worst_severity(entry["findings"]) or "", "")
            cells = [escape(h), *([escape(groups.get(h) or UNKNOWN_GROUP)] if groups else [])]
            cells += [_num(c) for c in severity_counts(entry)]
            t.add_row(*cells, f"[{style}]{_findings_cell(entry)}[/]")
        console.print(t)
    if groups:
        by_group = group_counts(hosts, groups)
        top = list(by_group.items())[:TOP_GROUPS]
        t = Table(
            title=f"groups most affected ({len(top)} of {len(by_group)} groups, by AZ)", title_justify="left"
        )
        t.add_column("group")
        t.add_column("hosts", justify="right")
        for sev in sevs[:2]:
            t.add_column(f"worst {sev}", justify="right")
        t.add_column("no result", justify="right")
        t.add_column("affected", justify="right")
        for name, counts in top:
            t.add_row(
                escape(name),
                _num(counts["hosts"]),
                *(_num(counts[sev]) for sev in sevs[:2]),
                _num(counts["no_result"]),
                f"{100 * counts['affected'] / counts['hosts']:.0f}%",
            )
        console.print(t)
    render_next_summary(report, console)
    for status in NO_RESULT:
        names = [h for h, e in hosts.items() if e.get("status") == status]
        if names:
            console.print(
                f"  [{STATUS_STYLE.get(status, 'bold red')}]{status}[/] {len(names):,} host(s): {_names(names)}"
            )
    for line in coverage_lines(hosts, NAMED_PER_STATUS):
        console.print(line)
    for line in node_lines(hosts):
        console.print(line)
    console.print(
        f"[dim]summarised: {len(hosts):,} hosts (more than {SUMMARY_ABOVE}); --all lists every host[/]"
    )


def render_scan(
    report: dict[str, Any],
    console: Console,
    *,
    show_all: bool = False,
    groups: Mapping[str, str | None] | None = None,
    wide: bool = False,
) -> None:
    """The scan report for people: up to SUMMARY_ABOVE hosts (or with ``show_all``) its findings first, one
    row each with the next step (``render_scan_rows``; ``wide``: then a row a host with its memory-cgroup
    columns), else summarised (``render_scan_summary``); then the counts line."""
    if not console.is_terminal:  # piped or captured (CI, AWX, a file): no width to honour, keep cells whole
        console.width = max(console.width, 160)
    if show_all or len(report["hosts"]) <= SUMMARY_ABOVE:
        render_scan_rows(report, console, wide=wide)
    else:
        render_scan_summary(report, console, groups)
    by_ansible = transport_note(report)
    if by_ansible:
        console.print(by_ansible, soft_wrap=True)  # one line, whatever the width
    s = report["summary"]
    fs = s["findings"]
    console.print(
        f"{s['hosts']:,} host(s): {s['ok']:,} ok, {s.get('partial', 0):,} partial, {s['unreachable']:,} "
        f"unreachable, {s['failed']:,} failed"
        + (f", {s['not_scanned']:,} not scanned" if s.get("not_scanned") else "")
        + f"; findings: {fs.get('critical', 0):,} critical, {fs.get('warning', 0):,} warning, "
        f"{fs.get('info', 0):,} info"
        + (f"; {s['errors']:,} detector error(s)" if s.get("errors") else "")
        + (f"; {s['node_errors']:,} scheduler node(s) not read" if s.get("node_errors") else "")
        + (" [bold yellow](interrupted: partial report)[/]" if report.get("interrupted") else "")
    )


def transport_note(report: Mapping[str, Any], n: int = NAMED_PER_STATUS) -> str | None:
    """The one line that says which hosts ansible-playbook scanned because the direct path (``--transport``
    auto or ssh) cannot serve them, and why (the first ``n`` named); None when there are none."""
    by_ansible: Mapping[str, str] = (report.get("transport") or {}).get("by_ansible") or {}
    if not by_ansible:
        return None
    named = "; ".join(f"{host} ({why})" for host, why in list(by_ansible.items())[:n])
    more = f" ... and {len(by_ansible) - n:,} more" if len(by_ansible) > n else ""
    return (
        f"[dim]note: {len(by_ansible):,} host(s) scanned by ansible-playbook, which the direct path cannot "
        f"serve: {escape(named)}{more}[/]"
    )


def render_scan_rows(report: dict[str, Any], console: Console, *, wide: bool = False) -> None:
    """The findings first (``render_findings``: host, check, severity, cause, next), then the hosts
    without a result and the detector errors (each reason in full), the hosts with no finding in one
    line, the scheduler nodes; ``wide``: a row a host with its memory-cgroup columns too."""
    hosts: Mapping[str, Mapping[str, Any]] = report["hosts"]
    render_findings(report, console)
    if wide:
        render_host_table(report, console)
    for host, entry in hosts.items():
        status = entry["status"]
        if status not in ("ok", "partial"):  # a partial host: its coverage lines below say why
            msg = f" {escape(str(entry['msg']))}" if entry.get("msg") else ""
            console.print(f"  [{STATUS_STYLE.get(status, 'bold red')}]{status}[/] {escape(host)}:{msg}")
        for err in entry.get("errors") or []:
            console.print(
                f"  [bold red]error[/] {escape(host)}: {escape(str(err.get('check')))}: {escape(str(err.get('msg')))}"
            )
    if not wide:  # the --wide table has a node column: here the nodes out of service or not read
        for host, entry in hosts.items():
            node = entry.get("node")
            if node and (node_out(node) or node.get("phase") == "unknown"):
                console.print(f"  node {escape(host)}: {escape(node_cell(node))}")
    for line in coverage_lines(hosts):
        console.print(line)
    clean = [h for h, e in hosts.items() if e["status"] == "ok" and not e.get("findings")]
    if clean:
        console.print(f"  [green]no findings[/] {len(clean):,} host(s): {escape(' '.join(clean))}")
    for line in node_lines(hosts):
        console.print(line)


def render_host_table(report: dict[str, Any], console: Console) -> None:
    """``--wide``: a row a host, its memory-cgroup columns and its findings in a few words."""
    table = Table(title="hosts (--wide)", title_justify="left", show_lines=False)
    for col, justify in (
        ("host", "left"),
        ("status", "left"),
        ("cgroup", "right"),
        ("scope", "left"),
        ("memcg total", "right"),
        ("live", "right"),
        ("zombies", "right"),
        ("ID headroom", "right"),
        ("findings", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    with_nodes = any(e.get("node") for e in report["hosts"].values())
    if with_nodes:
        table.add_column("node", justify="left")
    for host, entry in report["hosts"].items():
        memcg = entry.get("facts", {}).get("memcg", {})
        status = entry["status"]
        worst = worst_severity(entry["findings"])
        findings = _findings_cell(entry) if status in answered_statuses() else "-"
        if entry.get("errors"):
            findings += f" ({len(entry['errors'])} error(s))"
        table.add_row(
            escape(host),
            f"[{STATUS_STYLE.get(status, '')}]{status}[/]",
            _num(memcg.get("cgroup_version")),
            escape(str(memcg.get("scope", "-"))),
            _num(memcg.get("total")),
            _num(memcg.get("live")),
            _num(memcg.get("zombies")),
            f"{_num(memcg.get('id_headroom'))} ({_num(memcg.get('id_headroom_pct'))}%)" if memcg else "-",
            f"[{SEVERITY_STYLE.get(worst or '', '')}]{findings}[/]" if worst else findings,
            *([escape(node_cell(entry.get("node")))] if with_nodes else []),
        )
    console.print(table)


# ------------------------------------------------------------------------------------- rendering


def _odd_text(odd: Mapping[str, str]) -> str:
    return ", ".join(f"{h}: {v}" for h, v in odd.items())


def render_drift(drift: Mapping[str, Any], console: Console) -> None:
    """The drift report for people: fleet-wide odd hosts, then per group, then between groups."""
    if not console.is_terminal:
        console.width = max(console.width, 160)
    s = drift["summary"]
    dims = ", ".join(f"{d} ({len(drift['groups'][d])})" for d in drift["group_by"] if d in drift["groups"])
    console.print(
        f"fleetops drift: {s['compared']} host(s) compared, {s['not_compared']} not compared; "
        f"{s['facts_compared']} facts; grouped by {dims or 'nothing'}"
    )
    for dim, why in drift["skipped_dimensions"].items():
        console.print(f"  [dim]{dim}: not grouped: {why}[/]")

    def table(title: str, items: list[dict[str, Any]]) -> None:
        t = Table(title=title, title_justify="left", show_lines=False)
        for col in ("fact", "majority", "hosts that differ"):
            t.add_column(col)
        for item in items:
            maj = f"{item['majority']} ({item['majority_hosts']}/{item['hosts']}{', tie' if item['tie'] else ''})"
            t.add_row(item["label"], maj, f"[yellow]{_odd_text(item['odd'])}[/]")
        console.print(t)

    if drift["fleet"]:
        table("fleet-wide", drift["fleet"])
    for dim, by_name in drift["groups"].items():
        for name, body in by_name.items():
            if body["drift"]:
                table(f"{dim}={name} ({len(body['hosts'])} hosts)", body["drift"])
        rows = drift["between_groups"].get(dim) or []
        if rows:
            names = list(by_name)
            t = Table(title=f"between {dim} groups", title_justify="left")
            t.add_column("fact")
            for name in names:
                t.add_column(name)
            for row in rows:
                t.add_row(row["label"], *(row["groups"].get(n, "-") for n in names))
            console.print(t)
    for h, info in drift["not_compared"].items():
        console.print(f"  [bold red]not compared[/] {h}: {info['status']} {info['msg']}".rstrip())
    if drift["odd_hosts"]:
        console.print("[bold]odd hosts:[/]")
        for h, notes in drift["odd_hosts"].items():
            seen: dict[str, str] = {}
            for n in notes:
                seen.setdefault(n["label"], f"{n['value']} (others: {n['majority']})")
            console.print(f"  [yellow]{h}[/]: " + "; ".join(f"{k} {v}" for k, v in seen.items()))
    elif not drift["summary"]["drifting_facts"]:
        console.print("[green]no drift[/]")
