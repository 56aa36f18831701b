"""The scan's findings first: one row a finding (host, check, severity, the cause in full, the next step),
hosts with the same finding on one row past ``GROUP_ABOVE`` of them, and a table of the next steps by
finding for a summarised scan. A finding's ``next`` is the report's (``fleetops.next_steps``): this module
only lays it out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetops.ansible.facts import severities
from fleetops.next_steps import DEFAULT_POLICY

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
STATUS_STYLE = {"ok": "green", "partial": "yellow", "unreachable": "bold red", "failed": "bold red"}
# The same finding on more hosts than this is one row naming them (the lab's fleet, a rack: each host its
# row up to here); a group's command names at most LIMIT_HOSTS of them in its -l.
GROUP_ABOVE = 3
LIMIT_HOSTS = 20
NAMED_HOSTS = 6


def rung_text(rung: Mapping[str, Any]) -> str:
    """``rule zombie-memcg rung 1/4 fix: fix now (first rung)`` (the policy named unless the default)."""
    policy = "" if rung.get("policy") == DEFAULT_POLICY else f"policy {rung.get('policy')}: "
    return (
        f"{policy}rule {rung.get('rule')} rung {rung.get('rung')}/{rung.get('rungs')} {rung.get('action')}: "
        f"{rung.get('reason')}"
    )


def _limit_at(argv: Sequence[str]) -> int | None:
    """The index of the ``-l`` that ends a next step's argv (``next_steps.NextSteps.argv``), or None."""
    return len(argv) - 2 if len(argv) >= 2 and argv[-2] == "-l" else None


@dataclass
class Group:
    """Findings alike on several hosts: the first one, and every host it is on."""

    finding: Mapping[str, Any]
    hosts: list[str] = field(default_factory=list)
    commands: list[Sequence[str] | None] = field(default_factory=list)

    def command(self) -> str | None:
        """The group's dry-run command: its hosts (the first LIMIT_HOSTS) in one -l, when each has one."""
        import shlex

        if not self.commands or any(c is None for c in self.commands):
            return None
        argv = list(self.commands[0] or ())
        at = _limit_at(argv)
        if at is None:
            return None
        return shlex.join([*argv[: at + 1], ",".join(self.hosts[:LIMIT_HOSTS])])


def _key(finding: Mapping[str, Any], with_cause: bool) -> tuple[Any, ...]:
    step = finding.get("next") or {}
    argv = step.get("argv")
    at = _limit_at(argv) if argv else None
    template = tuple(argv[:at]) if argv and at is not None else None
    rung = step.get("rung") or {}
    return (
        finding.get("check"),
        finding.get("severity"),
        finding.get("summary") if with_cause else None,
        step.get("remediation"),
        template,
        step.get("refused") is not None,
        tuple(rung.get(k) for k in ("policy", "rule", "rung", "action", "status", "reason")),
    )


def finding_groups(hosts: Mapping[str, Mapping[str, Any]], *, with_cause: bool = True) -> list[Group]:
    """The findings of ``hosts`` grouped when alike (check, severity, the cause unless ``with_cause`` is
    off, the next step but its host), worst severity first, then the most hosts, then by check."""
    groups: dict[tuple[Any, ...], Group] = {}
    for host, entry in hosts.items():
        keys = (
            set()
        )  # a host is in a group once, however many alike findings it has (a set: no scan of g.hosts)
        for f in entry.get("findings") or []:
            key = _key(f, with_cause)
            g = groups.setdefault(key, Group(f))
            if key not in keys:
                keys.add(key)
                g.hosts.append(host)
                g.commands.append((f.get("next") or {}).get("argv"))
    order = {sev: i for i, sev in enumerate(severities())}
    return sorted(
        groups.values(),
        key=lambda g: (
            order.get(str(g.finding.get("severity")), len(order)),
            -len(g.hosts),
            str(g.finding.get("check")),
        ),
    )


def _hosts_cell(hosts: Sequence[str], named: int | None = NAMED_HOSTS) -> str:
    """The hosts of a row: every one (``named`` None), or the first ``named`` and how many more."""
    cut = len(hosts) if named is None else named
    more = f" and {len(hosts) - cut:,} more" if len(hosts) > cut else ""
    return escape(", ".join(hosts[:cut])) + more + (f" ({len(hosts):,} hosts)" if len(hosts) > 1 else "")


def next_cell(finding: Mapping[str, Any], group: Group | None = None) -> str:
    """The next step: the dry-run command (a ``group``'s: its hosts in one -l, else the finding's), then the
    rung, dim; ``-`` when nothing acts on the finding."""
    step = finding.get("next")
    if not step:
        return "-"
    lines = []
    cmd = group.command() if group is not None else step.get("command")
    if cmd:
        lines.append(escape(cmd))
        if group is not None and len(group.hosts) > LIMIT_HOSTS:
            lines.append(
                f"[dim](-l: the first {LIMIT_HOSTS} of {len(group.hosts):,} hosts; each host's is in --format json)[/]"
            )
    elif step.get("refused"):
        lines.append(f"[yellow]no command: {escape(step['refused'])}[/]")
    if step.get("rung"):
        lines.append(f"[dim]{escape(rung_text(step['rung']))}[/]")
    return "\n".join(lines) or "-"


def _columns(table: Table, *names: str) -> None:
    """The columns by name: the host names narrow, check and severity whole, the cause and the next step
    sharing the rest (the next step more: a command on one line where the width allows)."""
    for name in names:
        if name in ("host", "hosts"):
            table.add_column(name, overflow="fold", max_width=32)
        elif name in ("check", "severity"):
            table.add_column(name, no_wrap=True)
        else:
            table.add_column(name, overflow="fold", ratio=3 if name == "next" else 2)


def render_findings(report: Mapping[str, Any], console: Console) -> None:
    """One row a finding (host, check, severity, cause, next); alike findings on more than GROUP_ABOVE
    hosts on one row naming them all, its command with their names in one -l (the first LIMIT_HOSTS)."""
    hosts: Mapping[str, Mapping[str, Any]] = report["hosts"]
    groups = finding_groups(hosts)
    if not groups:
        return
    table = Table(title="findings, and what to do next", title_justify="left", show_lines=True)
    _columns(table, "host", "check", "severity", "cause", "next")
    for g in groups:
        rows = [([h], None) for h in g.hosts] if len(g.hosts) <= GROUP_ABOVE else [(g.hosts, g)]
        for names, group in rows:
            f = g.finding if group is not None else _finding_of(hosts[names[0]], g.finding)
            sev = str(f.get("severity", "?"))
            table.add_row(
                _hosts_cell(names, None),
                escape(str(f.get("check"))),
                f"[{SEVERITY_STYLE.get(sev, '')}]{escape(sev)}[/]",
                escape(str(f.get("summary", ""))),
                next_cell(f, group),
            )
    console.print(table)


def _finding_of(entry: Mapping[str, Any], like: Mapping[str, Any]) -> Mapping[str, Any]:
    """The finding of ``entry`` alike ``like`` (its own ``next``: its own host in the command)."""
    key = _key(like, True)
    return next((f for f in entry.get("findings") or [] if _key(f, True) == key), like)


def render_next_summary(report: Mapping[str, Any], console: Console, top: int = 20) -> None:
    """A summarised scan's next steps: per kind of finding (check, severity, next step), its hosts (the
    first named) and the command for the first LIMIT_HOSTS of them; the ``top`` groups with most hosts."""
    groups = [g for g in finding_groups(report["hosts"], with_cause=False) if g.finding.get("next")]
    if not groups:
        return
    t = Table(
        title=f"next steps ({min(top, len(groups))} of {len(groups)} kinds of finding)",
        title_justify="left",
        show_lines=True,
    )
    _columns(t, "check", "severity", "hosts", "next")
    for g in groups[:top]:
        sev = str(g.finding.get("severity", "?"))
        t.add_row(
            escape(str(g.finding.get("check"))),
            f"[{SEVERITY_STYLE.get(sev, '')}]{escape(sev)}[/]",
            _hosts_cell(g.hosts),
            next_cell(g.finding, g),
        )
    console.print(t)
