"""Human-readable rendering of scan and drift reports (their JSON contracts are built in fleetops.scan and
fleetops.drift)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetops.ansible.facts import severities

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
STATUS_STYLE = {"ok": "green", "unreachable": "bold red", "failed": "bold red"}


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def host_line(host: str, entry: dict[str, Any]) -> str:
    """One progress line for a host that just answered."""
    status = entry["status"]
    if status != "ok":
        return f"[{STATUS_STYLE.get(status, '')}]{host}: {status}[/] {entry.get('msg', '')}".rstrip()
    worst = worst_severity(entry["findings"])
    tail = f"{len(entry['findings'])} finding(s), worst {worst}" if worst else "no findings"
    return f"[green]{host}: ok[/] {tail}"


def worst_severity(findings: list[dict[str, Any]]) -> str | None:
    for sev in severities():
        if any(f.get("severity") == sev for f in findings):
            return sev
    return None


def render_scan(report: dict[str, Any], console: Console) -> None:
    table = Table(title="fleetops scan", show_lines=False)
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
    for host, entry in report["hosts"].items():
        memcg = entry.get("facts", {}).get("memcg", {})
        status = entry["status"]
        worst = worst_severity(entry["findings"])
        findings = ", ".join(f"{f['check']}:{f['severity']}" for f in entry["findings"]) or "-"
        if entry.get("errors"):
            findings += f" ({len(entry['errors'])} error(s))"
        if status != "ok":
            findings = entry.get("msg", "")[:80] or "-"
        table.add_row(
            host,
            f"[{STATUS_STYLE.get(status, '')}]{status}[/]",
            _num(memcg.get("cgroup_version")),
            str(memcg.get("scope", "-")),
            _num(memcg.get("total")),
            _num(memcg.get("live")),
            _num(memcg.get("zombies")),
            f"{_num(memcg.get('id_headroom'))} ({_num(memcg.get('id_headroom_pct'))}%)" if memcg else "-",
            f"[{SEVERITY_STYLE.get(worst or '', '')}]{findings}[/]" if worst else findings,
        )
    if not console.is_terminal:  # piped or captured (CI, AWX, a file): no width to honour, keep cells whole
        console.width = max(console.width, 160)
    console.print(table)
    for host, entry in report["hosts"].items():
        for f in entry["findings"]:
            style = SEVERITY_STYLE.get(f.get("severity", ""), "")
            console.print(
                f"  [{style}]{f.get('severity', '?'):8}[/] {host}: {f.get('check')}: {f.get('summary', '')}"
            )
        for err in entry.get("errors") or []:
            console.print(f"  [bold red]error   [/] {host}: {err.get('check')}: {err.get('msg')}")
    s = report["summary"]
    fs = s["findings"]
    console.print(
        f"{s['hosts']} host(s): {s['ok']} ok, {s['unreachable']} unreachable, {s['failed']} failed; "
        f"findings: {fs.get('critical', 0)} critical, {fs.get('warning', 0)} warning, {fs.get('info', 0)} info"
        + (f"; {s['errors']} detector error(s)" if s.get("errors") else "")
        + (" [bold yellow](interrupted: partial report)[/]" if report.get("interrupted") else "")
    )


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
