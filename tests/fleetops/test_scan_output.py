"""What an operator reads at fleet size (issue 26 item 5): the summarised table, the progress on stderr
(plain lines when not a terminal) and ``--format ndjson``, one host a line as each answers.

The summary is checked on synthetic reports of thousands of hosts against counts made here another way;
the stream, on a real ansible-runner scan of local hosts, one of them slow (its lines come before the run
ends), and against a reader that goes away.
"""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetops import schemas
from fleetops.cli.args import PLAIN_EVERY_S, SUMMARY_ABOVE
from fleetops.cli.progress import NdjsonOutput, ScanProgress, duration_text, rate_eta
from fleetops.cli.render import host_line, render_scan
from fleetops.errors import FleetopsError
from fleetops.scan import report_document
from tests.helpers import FLEETOPS, fleetops
from tests.paths import REPO

CHECKS = ("zombie_memcg", "crashloop_unit", "ecc_errors", "unexpected_unit")
SEVERITIES = ("critical", "warning", "info")
AZS = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")


def finding(check: str, severity: str) -> dict[str, Any]:
    return {"check": check, "severity": severity, "summary": f"{check} {severity}", "data": {}}


def fleet(n: int, seed: int = 26) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """``n`` synthetic hosts (a random mix of findings, a few unreachable/failed) and their AZs; the
    three ``worst-*`` hosts have 9, 8 and 7 critical findings, more than any random host (at most 3)."""
    rng = random.Random(seed)
    hosts: dict[str, dict[str, Any]] = {}
    groups: dict[str, str | None] = {}
    for i in range(n):
        name = f"node-{i:05d}"
        roll = rng.random()
        if roll < 0.02:
            hosts[name] = {
                "status": "unreachable",
                "msg": "ssh: connect timed out",
                "findings": [],
                "facts": {},
            }
        elif roll < 0.03:
            hosts[name] = {"status": "failed", "msg": "module failed", "findings": [], "facts": {}}
        else:
            found = [
                finding(rng.choice(CHECKS), rng.choice(SEVERITIES))
                for _ in range(rng.choice((0, 0, 0, 1, 2, 3)))
            ]
            errors = [{"check": "ecc_errors", "msg": "no EDAC"}] if rng.random() < 0.01 else []
            hosts[name] = {
                "status": "ok",
                "findings": found,
                "facts": {},
                "errors": errors,
                "checks": list(CHECKS),
            }
        groups[name] = AZS[i % 3] if i % 50 else None  # us-east-1d has no host; every 50th has no AZ
    for k, crit in enumerate((9, 8, 7)):
        name = f"worst-{k}"
        hosts[name] = {"status": "ok", "findings": [finding("zombie_memcg", "critical")] * crit, "facts": {}}
        groups[name] = AZS[3]
    return hosts, groups


def render(report: dict[str, Any], **kw: Any) -> str:
    out = io.StringIO()
    render_scan(report, Console(file=out, width=200, color_system=None, highlight=False), **kw)
    return out.getvalue()


def rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the table titled ``title...`` in rendered text, as lists of cell texts."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    body: list[list[str]] = []
    seen_header_rule = False
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith(("├", "┡")):
            seen_header_rule = True
            continue
        if seen_header_rule and line.startswith("│"):
            body.append([c.strip() for c in line.strip("│").split("│")])
    return body


def number(cell: str) -> int:
    return int(cell.replace(",", ""))


def report_of(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return report_document(hosts, started=1_800_000_000.0, finished=1_800_000_100.0)


# --------------------------------------------------------------------------------- the summary


def test_a_large_scan_is_summarised_with_counts_per_check_and_severity() -> None:
    hosts, groups = fleet(4000)
    text = render(report_of(hosts), groups=groups)
    by_check = {r[0]: r[1:] for r in rows(text, "findings by check")}
    findings = Counter((f["check"], f["severity"]) for e in hosts.values() for f in e["findings"])
    with_check = Counter(c for e in hosts.values() for c in {f["check"] for f in e["findings"]})
    errors = Counter(err["check"] for e in hosts.values() for err in e.get("errors") or [])
    assert set(by_check) == {c for c, _ in findings} | set(errors)
    for check, cells in by_check.items():
        assert [number(c) for c in cells] == [
            *(findings[(check, sev)] for sev in SEVERITIES),
            with_check[check],
            errors[check],
        ], check
    # most critical findings first
    crits = [number(by_check[c][0]) for c in by_check]
    assert crits == sorted(crits, reverse=True)
    # one line a host nowhere: bounded output, and an ordinary host is not named
    assert len(text.splitlines()) < 100
    assert "node-00007" not in text
    assert f"summarised: 4,003 hosts (more than {SUMMARY_ABOVE}); --all lists every host" in text


def test_the_worst_hosts_come_first_ranked_by_critical_then_warning() -> None:
    hosts, groups = fleet(3000)
    worst = rows(render(report_of(hosts), groups=groups), "worst hosts")
    assert [r[0] for r in worst[:3]] == ["worst-0", "worst-1", "worst-2"]
    assert [number(r[2]) for r in worst[:3]] == [9, 8, 7]  # host, group, critical, warning, info, findings
    assert worst[0][5] == "zombie_memcg:critical x9"
    assert worst[0][1] == "us-east-1d"
    ranks = [tuple(number(c) for c in r[2:5]) for r in worst]
    assert ranks == sorted(ranks, reverse=True) and len(worst) == 20
    # no host outside the table ranks above its last row
    last = ranks[-1]
    listed = {r[0] for r in worst}
    for name, entry in hosts.items():
        if name not in listed:
            counts = Counter(f["severity"] for f in entry["findings"])
            assert tuple(counts[s] for s in SEVERITIES) <= last, name


def test_the_groups_most_affected_are_counted_per_az() -> None:
    hosts, groups = fleet(3000)
    table = rows(render(report_of(hosts), groups=groups), "groups most affected")
    expected: dict[str, Counter[str]] = {}
    for name, entry in hosts.items():
        c = expected.setdefault(groups[name] or "(unknown)", Counter())
        c["hosts"] += 1
        sevs = {f["severity"] for f in entry["findings"]}
        if entry["status"] != "ok":
            c["no result"] += 1
        elif "critical" in sevs:
            c["critical"] += 1
        elif "warning" in sevs:
            c["warning"] += 1
    got = {r[0]: [number(x) for x in r[1:5]] for r in table}
    assert got == {g: [c["hosts"], c["critical"], c["warning"], c["no result"]] for g, c in expected.items()}
    share = {g: (c["critical"] + c["warning"] + c["no result"]) / c["hosts"] for g, c in expected.items()}
    assert {r[0]: r[5] for r in table} == {g: f"{100 * share[g]:.0f}%" for g in share}
    affected = {g: c["critical"] + c["warning"] + c["no result"] for g, c in expected.items()}
    assert [r[0] for r in table] == sorted(share, key=lambda g: (-share[g], -affected[g], g))
    assert table[0][0] == "us-east-1d"  # three hosts, all critical: the AZ to look at first


def test_hosts_without_a_result_are_counted_and_the_first_named() -> None:
    hosts, _ = fleet(3000)
    text = render(report_of(hosts))
    unreachable = sorted(h for h, e in hosts.items() if e["status"] == "unreachable")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("unreachable "))
    assert line.strip().startswith(
        f"unreachable {len(unreachable):,} host(s): {' '.join(unreachable[:10])} ..."
    )
    assert line.endswith(f"and {len(unreachable) - 10:,} more")
    assert "groups most affected" not in text  # no AZs known (a merged report): no such table


@pytest.mark.parametrize("size", [3, 3000])
def test_the_hosts_ansible_playbook_scanned_instead_of_the_direct_path_are_said_once(size: int) -> None:
    """The default transport's hosts it could not serve (``transport.by_ansible``): one note line naming the
    first ten with why, in the rows and in the summary; never a failure (their status is their scan's)."""
    hosts, _ = fleet(size)
    names = sorted(hosts)[:12]
    by_ansible = {h: f"connection winrm {i}" for i, h in enumerate(names)}
    report = {**report_of(hosts), "transport": {"name": "auto", "by_ansible": by_ansible}}
    schemas.validate_scan_report(report, "the report")
    text = render(report)
    (note,) = [ln for ln in text.splitlines() if "scanned by ansible-playbook" in ln]
    shown = list(by_ansible.items())[: min(10, len(names))]
    assert note.startswith(
        f"note: {len(by_ansible)} host(s) scanned by ansible-playbook, which the direct path"
    )
    assert "; ".join(f"{h} ({why})" for h, why in shown) in note
    assert note.endswith(f"... and {len(names) - 10} more") == (len(names) > 10)
    assert not any(h in note for h in names[10:])
    plain = render({**report, "transport": {"name": "auto", "by_ansible": {}}})
    assert "ansible-playbook" not in plain and "ansible-playbook" not in render(
        {**report, "transport": {"name": "ansible"}}
    )


def test_all_lists_every_host_and_the_threshold_is_where_the_help_says() -> None:
    hosts, _ = fleet(400)
    text = render(report_of(hosts), show_all=True)
    assert all(h in text for h in hosts)
    assert "findings by check" not in text
    small = dict(list(hosts.items())[:SUMMARY_ABOVE])
    assert "summarised" not in render(report_of(small)) and all(h in render(report_of(small)) for h in small)
    one_more = dict(list(hosts.items())[: SUMMARY_ABOVE + 1])
    assert "summarised" in render(report_of(one_more))
    help_text = fleetops("scan", "--help").stdout
    assert f"more than {SUMMARY_ABOVE} hosts is summarised" in " ".join(help_text.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scan", "--format", "json", "--all"], "not json"),
        (["scan", "--format", "ndjson", "--all"], "not ndjson"),
        (["merge", "--format", "json", "--all", "/nonexistent/a.json"], "not json"),
        (["report", "--format", "json", "--all", "/nonexistent/state.json"], "not json"),
    ],
)
def test_all_with_another_format_is_refused_before_anything_runs(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "r.json"
    extra = ["-o", str(out)] if args[0] in ("scan", "merge") else []
    result = fleetops(*args, *extra, timeout=60)
    assert result.rc == 2 and result.stdout == ""
    assert result.stderr == f"fleetops: error: --all applies to --format table only, {message}\n"
    assert not out.exists() and not out.with_name("r.json.partial").exists()


# -------------------------------------------------------------------------------- the progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_large_scan_off_a_terminal_prints_plain_progress_lines_with_rate_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=200)  # a file: not a terminal
    progress = ScanProgress(console, host_line, clock=clock)
    assert not progress.live
    progress.start(3000)
    for i in range(200):  # 8 hosts/s for 25 s (an eighth of a second: exact in binary)
        clock.now += 0.125
        status = "unreachable" if i == 50 else "ok"
        findings = [finding("zombie_memcg", "warning")] if i % 10 == 0 else []
        progress.host(f"node-{i}", {"status": status, "msg": "timed out", "findings": findings})
    progress.finish()
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()  # plain lines only
    progress_lines = [ln for ln in lines if ln.startswith("progress:")]
    assert progress_lines == [  # every PLAIN_EVERY_S (10) seconds: at 80 and 160 hosts
        "progress: 80/3,000 hosts (2%), 8.0 hosts/s, ETA 6m05s; ok 79, unreachable 1; 8 with findings",
        "progress: 160/3,000 hosts (5%), 8.0 hosts/s, ETA 5m55s; ok 159, unreachable 1; 16 with findings",
    ]
    assert [ln for ln in lines if ln.startswith("node-")] == ["node-50: unreachable timed out"]
    assert (
        lines[-1] == "scanned 200/3,000 hosts in 25s (8.0 hosts/s); ok 199, unreachable 1; 20 with findings"
    )
    assert PLAIN_EVERY_S == 10.0


def test_a_small_scan_prints_a_line_a_host_and_no_progress_lines() -> None:
    out, clock = io.StringIO(), Clock()
    progress = ScanProgress(Console(file=out, width=200), host_line, clock=clock)
    progress.start(SUMMARY_ABOVE)
    for i in range(SUMMARY_ABOVE):
        clock.now += 1
        progress.host(f"h{i}", {"status": "ok", "findings": []})
    progress.host("h3", {"status": "failed", "msg": "a later task", "findings": []})  # counted once
    assert progress.done == SUMMARY_ABOVE
    progress.finish()
    assert out.getvalue().splitlines() == [f"h{i}: ok no findings" for i in range(SUMMARY_ABOVE)]


def test_on_a_terminal_the_bar_says_rate_and_eta() -> None:
    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    progress = ScanProgress(console, host_line, clock=clock)
    assert progress.live
    stdout = sys.stdout
    progress.start(7500)
    clock.now += 30
    for i in range(1500):
        progress.host(f"node-{i}", {"status": "ok", "findings": []})
    assert progress.describe() == "scan · 50.0 hosts/s, ETA 2m00s · ok 1,500; 0 with findings"
    assert sys.stdout is stdout  # the bar leaves stdout alone: ndjson lines go there, not above the bar
    progress.finish()


def test_rate_and_eta_text() -> None:
    assert rate_eta(0, 10, 5.0) == "ETA ?"
    assert rate_eta(5, 7505, 10.0) == "0.5 hosts/s, ETA 4h10m"
    assert rate_eta(1, 100, 60.0) == "1.0 hosts/min, ETA 1h39m"
    assert [duration_text(s) for s in (86399, 86400, 1811760)] == ["23h59m", "1d00h", "20d23h"]
    assert [duration_text(s) for s in (0, 59.4, 60, 125, 3600, 3725)] == [
        "0s",
        "59s",
        "1m00s",
        "2m05s",
        "1h00m",
        "1h02m",
    ]


# ---------------------------------------------------------------------------------- ndjson


def test_ndjson_lines_are_host_documents_and_the_silent_hosts_follow_once() -> None:
    out = io.StringIO()
    stream = NdjsonOutput(out)
    stream.host("b", {"status": "ok", "findings": [finding("zombie_memcg", "warning")], "facts": {}})
    stream.host("b", {"status": "ok", "findings": [], "facts": {}})  # a second result: the first line stands
    report = report_of({
        "a": {"status": "not_scanned", "msg": "no answer", "findings": [], "facts": {}},
        "b": {"status": "ok", "findings": [], "facts": {}},
    })  # fmt: skip
    stream.finish(report)
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert [(ln["host"], ln["status"], len(ln["findings"])) for ln in lines] == [
        ("b", "ok", 1),
        ("a", "not_scanned", 0),
    ]
    for i, line in enumerate(lines):
        assert schemas.validate_scan_host(line, f"line {i}") is line
    with pytest.raises(schemas.DocumentError, match="host"):
        schemas.validate_scan_host(
            {"schema": "fleetops.scan.host/v1", "status": "ok", "findings": [], "facts": {}}, "x"
        )


def test_a_closed_stream_stops_the_scan_once_with_one_line() -> None:
    out = io.StringIO()
    stopped: list[bool] = []
    stream = NdjsonOutput(out, on_closed=lambda: stopped.append(True))
    stream.host("a", {"status": "ok", "findings": [], "facts": {}})
    out.close()
    stream.host("b", {"status": "ok", "findings": [], "facts": {}})
    stream.host("c", {"status": "ok", "findings": [], "facts": {}})
    assert stopped == [True] and stream.closed
    with pytest.raises(FleetopsError) as err:
        stream.check()
    assert str(err.value) == "stdout closed before the scan ended (broken pipe): stopped after 1 host line(s)"


def local_fleet(tmp_path: Path, slow_s: float) -> Path:
    """Three local hosts (no ssh): two answer at once, ``slow`` takes ``slow_s`` s more (two samples)."""
    inv = tmp_path / "hosts.yml"
    lines = ["all:", "  vars:", "    ansible_connection: local", "    ansible_python_interpreter: '{{ ansible_playbook_python }}'",
             "    fleetops_checks: [zombie_memcg]", "  hosts:"]  # fmt: skip
    for name, sample in (("fast-1", 0), ("fast-2", 0), ("slow", slow_s)):
        lines += [f"    {name}:", f"      fleetops_sample_seconds: {sample}"]
    inv.write_text("\n".join(lines) + "\n")
    return inv


def test_ndjson_streams_each_host_as_it_answers_through_ansible_runner(tmp_path: Path) -> None:
    """A real scan (ansible-runner, node_health on three local hosts): the fast hosts' lines are on
    stdout while the scan still runs, seconds before the slow host's; every line is a whole host document."""
    inv = local_fleet(tmp_path, slow_s=4)
    proc = subprocess.Popen(
        [str(FLEETOPS), "scan", "-q", "--format", "ndjson", "-i", str(inv)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    arrivals: list[tuple[float, bool, dict[str, Any]]] = []
    for line in proc.stdout:
        arrivals.append((time.monotonic(), proc.poll() is None, json.loads(line)))
    rc = proc.wait(timeout=120)
    ended = time.monotonic()
    assert rc == 0, proc.stderr.read() if proc.stderr else rc
    assert {a[2]["host"] for a in arrivals[:2]} == {"fast-1", "fast-2"}
    assert arrivals[-1][2]["host"] == "slow"
    for at, running, doc in arrivals[:2]:
        assert running, f"{doc['host']}'s line came after the scan ended"
        assert ended - at > 2.0, f"{doc['host']}'s line came only {ended - at:.1f} s before the end"
    for i, (_, _, doc) in enumerate(arrivals):
        schemas.validate_scan_host(doc, f"line {i + 1}")
        assert doc["status"] == "ok" and doc["checks"] == ["zombie_memcg"]


def test_ndjson_to_a_reader_that_went_away_is_one_line_and_exit_2(tmp_path: Path) -> None:
    inv = local_fleet(tmp_path, slow_s=3)
    # bash: the scan's stdout piped into a reader of one line
    piped = subprocess.run(
        ["/bin/bash", "-c", f"{FLEETOPS} scan -q --format ndjson -i {inv} 2>{tmp_path / 'err'} | "
                            "python3 -c \"import sys; print(sys.stdin.readline(), end='')\"; echo ${PIPESTATUS[0]}"],
        capture_output=True, text=True, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    first, rc = piped.stdout.splitlines()
    assert json.loads(first)["host"] in ("fast-1", "fast-2")
    err = (tmp_path / "err").read_text()
    assert rc == "2", err
    assert re.fullmatch(
        r"fleetops: error: stdout closed before the scan ended \(broken pipe\): stopped after [12] host line\(s\)\n",
        err,
    ), err


# ------------------------------------------------------------------------------- a rollout's


class FakeRollout:
    """What ConsoleObserver reads of a rollout: its plan, batches and hosts' states."""

    def __init__(self, hosts: int, batches: int, done: int = 0) -> None:
        self.plan = {"batches": [[f"h{i}"] for i in range(batches)]}
        self.batches: list[dict[str, Any]] = []
        self.apply, self.state_path = False, "state.json"
        self.hosts = {f"h{i}": "pending" for i in range(hosts)}
        self.finish(done)

    def finish(self, done: int) -> None:
        for i in range(done):
            self.hosts[f"h{i}"] = "done"


def test_a_rollout_s_plain_lines_carry_this_run_s_rate_and_eta() -> None:
    from fleetops.cli.observer import ConsoleObserver

    out, clock = io.StringIO(), Clock()
    observer = ConsoleObserver(Console(file=out, width=300), clock=clock)
    rollout = FakeRollout(hosts=1000, batches=10, done=200)  # resumed: 200 done, 2 batches, before this run
    rollout.batches = [{"finished": 1.0}] * 2
    observer.rollout_started(rollout)  # type: ignore[arg-type]
    observer.batch_started(3, 10, [f"h{i}" for i in range(100)])
    clock.now += 50
    rollout.finish(300)
    observer.batch_finished(3, 10)
    lines = out.getvalue().splitlines()
    assert (
        lines[0]
        == f"batch 3/10 (dry run, 100 host(s)): {' '.join(f'h{i}' for i in range(SUMMARY_ABOVE))} ... and 50 more"
    )
    assert lines[1].endswith("hosts finished 200/1000, failed 0; ETA ?")
    # 100 hosts in 50 s: 2 hosts/s; 700 left: 350 s
    assert lines[2] == (
        "progress: batch 3/10 finished: batches done 3/10, hosts finished 300/1000, failed 0; 2.0 hosts/s, ETA 5m50s"
    )


# --------------------------------------------------------------------------- fleetops report


def large_rollout(tmp_path: Path) -> Any:
    """3,000 hosts in 30 batches of 100, all done but: 25 failed in batch 7 (timed out), the last batch
    cut short (its 100 hosts in doubt), 5 skipped in batch 12."""
    from fleetops.rollout.outcome import HostOutcome
    from fleetops.rollout.state import new_rollout

    batches = [[f"node-{b:02d}-{i:03d}" for i in range(100)] for b in range(30)]
    rollout = new_rollout(
        action="reboot", apply=True, inventory=[tmp_path / "inv.yml"], extravars={},
        plan={"batches": batches, "hosts": 3000}, max_failures=100, cooldown=0, gate=True,
        state_path=tmp_path / "state.json",
    )  # fmt: skip
    for b, hosts in enumerate(batches):
        last = b == len(batches) - 1
        rollout.batches.append(
            {
                "index": b + 1,
                "hosts": hosts,
                "started": 1.8e9 + 60 * b,
                "finished": None if last else 1.8e9 + 60 * b + 42,
            }
        )
        for i, host in enumerate(hosts):
            if last:
                rollout.hosts[host] = "running"
            elif b == 6 and i < 25:
                rollout.hosts[host] = "failed"
                rollout.results[host] = HostOutcome(status="failed", msg=f"timed out after {i} s")
            elif b == 11 and i < 5:
                rollout.hosts[host] = "skipped"
                rollout.results[host] = HostOutcome(status="skipped", msg="preflight: ssh refused")
            else:
                rollout.hosts[host] = "done"
                rollout.results[host] = HostOutcome(status="ok", changed=True)
    return rollout


def render_report(rollout: Any, show_all: bool = False) -> str:
    from fleetops.cli.report import render_rollout

    out = io.StringIO()
    render_rollout(
        rollout, Console(file=out, width=250, color_system=None, highlight=False), show_all=show_all
    )
    return out.getvalue()


def test_report_of_a_large_rollout_counts_clean_batches_and_names_the_first_failures(tmp_path: Path) -> None:
    from fleetops.cli.report import NAMED_HOSTS

    rollout = large_rollout(tmp_path)
    text = render_report(rollout)
    batch_rows = [ln for ln in text.splitlines() if ln.startswith("│")]  # the body (the header is ┃)
    cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in batch_rows]
    assert [(c[0], c[1], c[3], c[4]) for c in cells] == [
        ("7", "100", "42.0s", "done 75, failed 25"),
        ("12", "100", "42.0s", "done 95, skipped 5"),
        ("30", "100", "(cut short)", "running 100"),
    ]
    assert "27 of 30 batches: every host done (--all lists them)" in text
    named = [ln.strip() for ln in text.splitlines() if ln.startswith("  node-")]
    assert len(named) == NAMED_HOSTS
    assert named[:2] == [
        "node-06-000: failed: timed out after 0 s",
        "node-06-001: failed: timed out after 1 s",
    ]
    assert (
        f"... and {25 + 5 + 100 - NAMED_HOSTS:,} more host(s) failed, skipped or in doubt (--all lists them)"
        in text
    )
    assert len(text.splitlines()) < 60


def test_report_all_lists_every_batch_and_host(tmp_path: Path) -> None:
    rollout = large_rollout(tmp_path)
    text = render_report(rollout, show_all=True)
    assert all(f"{h}:{st}" in text for h, st in rollout.hosts.items())
    named = [ln for ln in text.splitlines() if ln.startswith("  node-")]
    assert (
        len(named) == 25 + 5 + 100 and "more host(s)" not in text and "batches: every host done" not in text
    )


# ------------------------------------------------------------------------- the CLI's wiring


def test_scan_cli_wires_targets_to_progress_and_azs_to_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fleetops scan`` (api.scan stood in for: the real one is driven above): the targets listed
    before the scan size the progress, their AZs group the table, each host is printed as it answers."""
    from fleetops import api
    from fleetops.ansible.inventory import InventoryHost
    from fleetops.cli.app import main
    from fleetops.exitcodes import ExitCode

    hosts, groups = fleet(120)
    seen: list[str] = []
    err: list[str] = []

    def fake_scan(request: Any, on_host: Any = None, cancel: Any = None, on_targets: Any = None) -> Any:
        on_targets([InventoryHost(name=h, group=groups[h]) for h in hosts])
        for h, entry in hosts.items():
            on_host(h, entry)
            out = capsys.readouterr()
            seen.append(out.out)  # what stdout holds as each host answers
            err.append(out.err)
        return api.ScanResult(report_of(hosts), ExitCode.FAILED)

    monkeypatch.setattr(api, "scan", fake_scan)
    assert main(["scan", "--format", "ndjson"]) == ExitCode.FAILED
    assert [json.loads(s)["host"] for s in seen] == list(hosts)  # one line as each host answered
    lines = "".join([*err, capsys.readouterr().err]).splitlines()
    assert lines[-1].startswith("scanned 123/123 hosts in ")
    no_result = [h for h, e in hosts.items() if e["status"] != "ok"]
    assert no_result
    assert [ln.split(":")[0] for ln in lines[:-1]] == no_result  # only they get a line

    assert main(["scan", "-q"]) == ExitCode.FAILED
    captured = capsys.readouterr()
    assert captured.err == ""
    table = rows(captured.out, "groups most affected")
    assert {r[0] for r in table} == {"us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "(unknown)"}
