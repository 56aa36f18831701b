"""`fleetops scan --shard I/N` and `fleetops merge`: the shard function, the merge's equality with one
unsharded scan, and every input the merge refuses (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetops import api, scan
from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult
from fleetops.cli.app import main
from fleetops.exitcodes import ExitCode
from fleetops.merge import MergeError, merge
from fleetops.scan import PartialReport, ScanOptions, exit_code, report_document, shard_hosts
from fleetops.schemas import validate_scan_report
from fleetops.values import Shard, shard, shard_of

# ------------------------------------------------------------------------------ the shard function


def test_a_host_never_changes_shard_as_the_fleet_grows() -> None:
    fleet = [f"gpu-{i:05d}" for i in range(2000)]
    before = {h: shard_of(h, 8) for h in fleet}
    grown = [*fleet, *(f"ip-10-1-{i // 250}-{i % 250}.ec2.internal" for i in range(3000))]
    after = {h: shard_of(h, 8) for h in grown}
    assert all(after[h] == before[h] for h in fleet)
    # ...and the shards of N partition the fleet: every host in exactly one
    for h in grown[:300]:
        assert [i for i in range(1, 9) if Shard(i, 8).holds(h)] == [after[h]]


@pytest.mark.parametrize("count", [2, 4, 7, 16])
def test_shards_are_about_even(count: int) -> None:
    hosts = [f"lab-{i:04d}-a{i % 7:03d}" for i in range(8000)]
    sizes = [len(shard_hosts(hosts, Shard(i, count))) for i in range(1, count + 1)]
    assert sum(sizes) == len(hosts)
    mean = len(hosts) / count
    # as a fair hash spreads them: binomial, each shard within 4 standard deviations of the mean, and
    # the spread between shards about one (a hash of the first or last characters would fail both)
    sd = math.sqrt(len(hosts) * (1 / count) * (1 - 1 / count))
    assert max(abs(s - mean) for s in sizes) < 4 * sd, sizes
    assert statistics.pstdev(sizes) < 2 * sd, sizes


def test_shard_is_the_names_sha256() -> None:
    # pinned: another controller (or a later fleetops) must put each host in the same shard
    assert [shard_of(h, 4) for h in ("lab-01", "lab-02", "lab-03", "lab-04", "lab-05")] == [4, 2, 2, 1, 4]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0/4", "the shard index I must be between 1 and N (4): '0/4'"),
        ("5/4", "the shard index I must be between 1 and N (4): '5/4'"),
        ("1/0", "the shard count N must be at least 1: '1/0'"),
        ("-1/4", "between 1 and N"),
        ("x/y", "expected I/N with whole numbers I and N, got 'x/y'"),
        ("1.5/4", "whole numbers"),
        ("4", "expected I/N"),
        ("", "expected I/N"),
    ],
)
def test_bad_shards_are_one_line_exit_2(text: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as bad:
        shard(text)
    assert needle in str(bad.value)
    with pytest.raises(SystemExit) as exc:
        main(["scan", f"--shard={text}"])
    assert exc.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_good_shards_parse() -> None:
    assert shard("1/1") == Shard(1, 1)
    assert shard("4/4") == Shard(4, 4) and str(Shard(3, 4)) == "3/4"
    assert Shard(2, 4).to_dict() == {"index": 2, "count": 4}


# ------------------------------------------------------------------------------ reports to merge

OPTIONS = ScanOptions(checks=["gpu_health", "unexpected_unit"], sample_seconds=0).record()


def _finding(check: str, severity: str) -> dict[str, Any]:
    return {"check": check, "severity": severity, "summary": f"{check} on this host", "data": {}}


def _entry(i: int) -> dict[str, Any]:
    """Distinct hosts: statuses, findings and errors vary with i."""
    if i % 11 == 3:
        return {"status": "unreachable", "msg": "No route to host", "findings": [], "facts": {}}
    if i % 13 == 5:
        return {"status": "failed", "msg": "MODULE FAILURE", "findings": [], "facts": {}}
    findings = []
    if i % 3 == 0:
        findings.append(_finding("gpu_health", "critical"))
    if i % 4 == 1:
        findings.append(_finding("unexpected_unit", "warning"))
    if i % 5 == 2:
        findings.append(_finding("unexpected_unit", "info"))
    errors = [{"check": "gpu_health", "msg": "nvidia-smi: timed out"}] if i % 17 == 9 else []
    return {"status": "ok", "findings": findings, "facts": {"host": {"kernel": f"6.1.{i}"}}, "errors": errors,
            "checks": ["gpu_health", "unexpected_unit"]}  # fmt: skip


HOSTS = {f"gpu-{i:03d}": _entry(i) for i in range(40)}


def _whole(hosts: dict[str, dict[str, Any]] = HOSTS) -> dict[str, Any]:
    return report_document(hosts, started=1_764_700_000, finished=1_764_700_012, options=OPTIONS)


def _shard_report(
    index: int, count: int, hosts: dict[str, dict[str, Any]] = HOSTS, **extra: Any
) -> dict[str, Any]:
    mine = {h: e for h, e in hosts.items() if Shard(index, count).holds(h)}
    start = 1_764_700_000 + index
    report = report_document(
        mine, started=start, finished=start + 5, shard=Shard(index, count), options=OPTIONS
    )
    return {**report, **extra}


def _write(tmp_path: Path, name: str, report: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _shards(tmp_path: Path, count: int = 4, **extra: Any) -> list[Path]:
    return [_write(tmp_path, f"s{i}.json", _shard_report(i, count, **extra)) for i in range(1, count + 1)]


def test_the_merge_of_4_shards_is_the_unsharded_report(tmp_path: Path) -> None:
    whole = _whole()
    assert exit_code(whole) == ExitCode.FAILED  # unreachable and failed hosts: 3
    paths = _shards(tmp_path)
    assert all(json.loads(p.read_text())["hosts"] for p in paths)  # each shard holds some hosts
    merged = merge(paths)
    assert merged.report["hosts"] == whole["hosts"]
    assert list(merged.report["hosts"]) == sorted(HOSTS)
    assert merged.report["summary"] == whole["summary"]
    assert merged.exit_code == exit_code(whole)
    assert merged.report["options"] == OPTIONS
    assert merged.report["started_at"] == "2025-12-02T18:26:41Z" and merged.report["duration_s"] == 8.0
    assert [s["shard"]["index"] for s in merged.report["merged"]["sources"]] == [1, 2, 3, 4]
    assert merged.notes == [] and "interrupted" not in merged.report
    validate_scan_report(merged.report, "merged")  # a report every reader takes (drift --from, merge)


@pytest.mark.parametrize(
    ("pick", "code"),
    [
        (lambda i: {"status": "ok", "findings": [], "facts": {}}, ExitCode.OK),
        (
            lambda i: {
                "status": "ok",
                "findings": [_finding("gpu_health", "warning")] * (i == 7),
                "facts": {},
            },
            ExitCode.FINDINGS,
        ),
        (lambda i: {"status": "ok", "findings": [_finding("gpu_health", "info")], "facts": {}}, ExitCode.OK),
    ],
)
def test_the_merge_exits_as_the_scan_would(
    tmp_path: Path, pick: Callable[[int], dict[str, Any]], code: ExitCode
) -> None:
    hosts = {f"h{i}": pick(i) for i in range(12)}
    paths = [_write(tmp_path, f"{i}.json", _shard_report(i, 3, hosts)) for i in (1, 2, 3)]
    merged = merge(paths)
    assert merged.exit_code == exit_code(_whole(hosts)) == code
    assert merged.report["hosts"] == _whole(hosts)["hosts"]


def test_the_cli_merges_writes_and_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _shards(tmp_path)
    out = tmp_path / "merged.json"
    rc = main(["merge", *map(str, reversed(paths)), "-o", str(out), "--format", "json"])
    printed = json.loads(capsys.readouterr().out)
    assert rc == exit_code(_whole()) and printed == json.loads(out.read_text())
    assert printed["hosts"] == _whole()["hosts"] and out.stat().st_mode & 0o777 == 0o600
    assert main(["merge", *map(str, paths)]) == rc  # the table
    table = capsys.readouterr().out
    assert "40 host(s):" in table and "gpu-003" in table


# ------------------------------------------------------------------------------ transport and next steps

STEPS = {"policy": "default", "ladders": "/var/lib/fleetops/auto/ladder.json"}


def _with_next(hosts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``hosts`` with each finding's ``next`` as a scan gives it (fleetops.next_steps): the command names the host."""

    def step(host: str) -> dict[str, Any]:
        argv = ["fleetops", "remediate", "reboot", "-l", host]
        return {"remediation": "reboot", "command": " ".join(argv), "argv": argv}

    return {h: {**e, "findings": [{**f, "next": step(h)} for f in e["findings"]]} for h, e in hosts.items()}


def _by_ansible(index: int, count: int) -> dict[str, str]:
    """The first host of the shard, scanned by ansible-playbook (as the direct path hands over a host)."""
    first = min(h for h in HOSTS if Shard(index, count).holds(h))
    return {first: "ansible_connection is local, not ssh"}


def test_the_merge_keeps_the_shards_transport_and_next_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = _with_next(HOSTS)
    paths = [
        _write(tmp_path, f"s{i}.json", _shard_report(
            i, 4, hosts, transport={"name": "auto", "by_ansible": _by_ansible(i, 4) if i != 3 else {}},
            next_steps=STEPS))
        for i in range(1, 5)
    ]  # fmt: skip
    merged = merge(paths).report
    validate_scan_report(merged, "merged")
    by_ansible = {**_by_ansible(1, 4), **_by_ansible(2, 4), **_by_ansible(4, 4)}
    assert merged["transport"] == {"name": "auto", "by_ansible": dict(sorted(by_ansible.items()))}
    assert merged["next_steps"] == STEPS
    assert merged["hosts"] == hosts  # each finding keeps the next its shard gave it
    assert [(s["transport"], s["next_steps"]) for s in merged["merged"]["sources"]] == [("auto", STEPS)] * 4
    assert merge(paths).notes == []
    # the table's note names the hosts the direct path handed to ansible-playbook, from every shard
    assert main(["merge", *map(str, paths)]) == exit_code(merged)
    assert "3 host(s) scanned by ansible-playbook" in capsys.readouterr().out


def test_shards_of_different_transports_merge_as_mixed(tmp_path: Path) -> None:
    transports = {1: {"name": "auto", "by_ansible": _by_ansible(1, 3)}, 2: {"name": "ansible"}, 3: None}
    paths = [
        _write(tmp_path, f"s{i}.json", _shard_report(
            i, 3, **({"transport": t} if t is not None else {}), next_steps=STEPS))
        for i, t in transports.items()
    ]  # fmt: skip
    merged = merge(paths).report
    validate_scan_report(merged, "merged")
    # not one name: mixed, each source's own (null: an older report that did not record it)
    assert merged["transport"] == {"name": "mixed", "by_ansible": _by_ansible(1, 3)}
    assert [s["transport"] for s in merged["merged"]["sources"]] == ["auto", "ansible", None]
    # every source of one transport: that name, as the scan wrote it (ansible: no by_ansible)
    alike = [
        _write(tmp_path, f"a{i}.json", _shard_report(i, 3, transport={"name": "ansible"})) for i in (1, 2, 3)
    ]
    assert merge(alike).report["transport"] == {"name": "ansible"}
    # none recorded (older reports): none claimed
    assert (
        "transport" not in merge(_shards(tmp_path)).report
        and "next_steps" not in merge(_shards(tmp_path)).report
    )


def test_next_steps_of_different_policies_are_not_claimed_as_one(tmp_path: Path) -> None:
    other = {"policy": "/etc/fleetops/strict.yml", "ladders": STEPS["ladders"]}
    paths = [
        _write(tmp_path, f"s{i}.json", _shard_report(i, 2, next_steps=STEPS if i == 1 else other))
        for i in (1, 2)
    ]
    result = merge(paths)
    assert "next_steps" not in result.report
    assert [s["next_steps"] for s in result.report["merged"]["sources"]] == [STEPS, other]
    assert any("next steps came from different policies or ladders" in n for n in result.notes)
    validate_scan_report(result.report, "merged")


def test_a_killed_shard_keeps_its_transport_name(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path, f"s{i}.json", _shard_report(
            i, 4, transport={"name": "auto", "by_ansible": _by_ansible(i, 4)}, next_steps=STEPS))
        for i in (1, 3, 4)
    ]  # fmt: skip
    targets = sorted(h for h in HOSTS if Shard(2, 4).holds(h))
    killed = tmp_path / "s2.json.partial"
    partial = PartialReport(killed, targets=targets, shard=Shard(2, 4), options=OPTIONS, transport="auto")
    partial.add(targets[0], HOSTS[targets[0]])
    partial.close(done=False)
    result = merge([paths[0], killed, *paths[1:]])
    validate_scan_report(result.report, "merged")
    by_ansible = {**_by_ansible(1, 4), **_by_ansible(3, 4), **_by_ansible(4, 4)}
    assert result.report["transport"] == {"name": "auto", "by_ansible": dict(sorted(by_ansible.items()))}
    assert (
        f"{killed} (shard 2/4): a partial file does not say which of its hosts ansible-playbook scanned"
        in result.notes
    )
    # the reports' record; the partial file holds none (its source says null)
    assert result.report["next_steps"] == STEPS
    assert [s["next_steps"] for s in result.report["merged"]["sources"]] == [STEPS, None, STEPS, STEPS]


# ------------------------------------------------------------------------------ refused inputs


def _refused(paths: list[Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    out = tmp_path / "never.json"
    rc = main(["merge", *map(str, paths), "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == ExitCode.USAGE, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert not out.exists()  # bad input changes nothing
    return captured.err


def test_different_schema_versions_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _shards(tmp_path)
    _write(tmp_path, "s2.json", {**_shard_report(2, 4), "schema": "fleetops.scan/v2"})
    err = _refused(paths, capsys, tmp_path)
    assert "different schema versions" in err and f"{paths[1]} is fleetops.scan/v2" in err
    assert f"{paths[0]} is fleetops.scan/v1" in err


def test_overlapping_shards_name_the_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # two plain reports (not shards: two --limit scans) that share hosts
    a = _write(tmp_path, "a.json", _whole({h: HOSTS[h] for h in list(HOSTS)[:25]}))
    b = _write(tmp_path, "b.json", _whole({h: HOSTS[h] for h in list(HOSTS)[20:]}))
    err = _refused([a, b], capsys, tmp_path)
    assert (
        "overlapping reports: 5 host(s) in more than one: " in err and f"gpu-020 ({a}, {b}); gpu-021" in err
    )


def test_a_shard_given_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _shards(tmp_path)
    again = _write(tmp_path, "again.json", _shard_report(3, 4))
    err = _refused([*paths, again], capsys, tmp_path)
    assert f"shard 3/4 given twice: {paths[2]} and {again}" in err


def test_a_missing_shard_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _shards(tmp_path)
    err = _refused([paths[0], paths[1], paths[3]], capsys, tmp_path)
    assert "shard 3/4 missing (given 3 of 4)" in err


def test_shards_of_different_counts_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    four = _shards(tmp_path)
    three = _write(tmp_path, "t.json", _shard_report(2, 3))
    err = _refused([four[0], three], capsys, tmp_path)
    assert "shards of different counts" in err and "(shard 1/4)" in err and "(shard 2/3)" in err


def test_a_shard_and_a_plain_report_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused([_shards(tmp_path)[0], _write(tmp_path, "w.json", _whole())], capsys, tmp_path)
    assert "is a shard but" in err and "w.json is not" in err


def test_a_host_outside_its_shard_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _shards(tmp_path)
    stray = next(h for h in HOSTS if not Shard(1, 4).holds(h))
    report = _shard_report(1, 4)
    report["hosts"][stray] = HOSTS[stray]
    _write(tmp_path, "s1.json", report)
    err = _refused(paths, capsys, tmp_path)
    assert f"(shard 1/4) holds hosts of another shard: {stray}" in err


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"checks": ["gpu_health"]}, 'checks: ["gpu_health", "unexpected_unit"] in'),
        ({"zombie_warning": 10}, "zombie_warning: null in"),
        ({"sample_seconds": 10.0}, "sample_seconds: 0 in"),
        ({"extra_vars": "sha256:0123456789ab"}, "extra_vars: null in"),
    ],
)
def test_different_checks_or_thresholds_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], needle: str
) -> None:
    paths = _shards(tmp_path)
    report = _shard_report(4, 4)
    report["options"] = {**OPTIONS, **change}
    _write(tmp_path, "s4.json", report)
    err = _refused(paths, capsys, tmp_path)
    assert "options differ" in err and needle in err, err
    (field,) = change
    assert f"{json.dumps(change[field])} in {paths[3]}" in err


def test_options_recorded_in_one_report_only_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _shards(tmp_path)
    old = _shard_report(2, 4)
    del old["options"]  # written by a fleetops before --shard
    _write(tmp_path, "s2.json", old)
    err = _refused(paths, capsys, tmp_path)
    assert f"recorded in {paths[0]}, not in {paths[1]}" in err


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON (truncated?)"),
        (lambda text: "", "empty file"),
        (lambda text: text.replace('"status": "ok"', '"status": "fine"', 1), "hosts."),
    ],
)
def test_a_broken_report_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[str], str], needle: str
) -> None:
    paths = _shards(tmp_path)
    paths[2].write_text(damage(paths[2].read_text()))
    err = _refused(paths, capsys, tmp_path)
    assert str(paths[2]) in err and needle in err, err


def test_nothing_to_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = [_write(tmp_path, f"e{i}.json", _shard_report(i, 2, {})) for i in (1, 2)]
    assert "the reports hold no host" in _refused(empty, capsys, tmp_path)
    assert "no such file" in _refused([tmp_path / "nope.json"], capsys, tmp_path)


# ------------------------------------------------------------------------------ killed shards


def _killed(tmp_path: Path, index: int, count: int, answered: int, torn: bool = True) -> Path:
    """What `scan --shard index/count -o s.json` leaves when killed after ``answered`` hosts: the
    partial file, its last line torn."""
    targets = sorted(h for h in HOSTS if Shard(index, count).holds(h))
    path = tmp_path / f"s{index}.json.partial"
    partial = PartialReport(path, targets=targets, shard=Shard(index, count), options=OPTIONS)
    for host in targets[:answered]:
        partial.add(host, HOSTS[host])
    partial.close(done=False)
    if torn:
        with path.open("a") as fh:
            fh.write('{"host": "' + targets[answered] + '", "entry": {"status": "o')
    return path


def test_a_killed_shard_merges_with_its_unscanned_hosts_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _shards(tmp_path)
    killed = _killed(tmp_path, 2, 4, answered=3)
    targets = sorted(h for h in HOSTS if Shard(2, 4).holds(h))
    assert len(targets) > 4
    merged = merge([paths[0], killed, paths[2], paths[3]])
    hosts = merged.report["hosts"]
    assert set(hosts) == set(HOSTS)  # never dropped
    for host in targets[3:]:
        assert hosts[host]["status"] == "not_scanned", host
        assert f"shard 2/4 was cut short ({killed})" in hosts[host]["msg"]
    for host in set(HOSTS) - set(targets[3:]):
        assert hosts[host] == HOSTS[host]
    assert merged.report["summary"]["not_scanned"] == len(targets) - 3
    assert merged.exit_code == ExitCode.FAILED and merged.report["interrupted"] is True
    source = merged.report["merged"]["sources"][1]
    assert source == {"path": str(killed), "shard": {"index": 2, "count": 4}, "partial": True,
                      "hosts": len(targets), "not_scanned": len(targets) - 3, "transport": None,
                      "next_steps": None}  # fmt: skip
    rc = main(["merge", str(paths[0]), str(killed), str(paths[2]), str(paths[3]), "--format", "json"])
    err = capsys.readouterr().err
    assert rc == ExitCode.FAILED and f"note: {killed} (shard 2/4): a killed scan's partial file" in err


def test_a_shard_killed_before_any_answer_still_names_its_hosts(tmp_path: Path) -> None:
    paths = _shards(tmp_path)
    killed = _killed(tmp_path, 4, 4, answered=0, torn=False)
    merged = merge([*paths[:3], killed])
    four = [h for h in HOSTS if Shard(4, 4).holds(h)]
    assert all(merged.report["hosts"][h]["status"] == "not_scanned" for h in four)
    assert merged.report["summary"]["hosts"] == len(HOSTS)


def test_an_older_partial_without_targets_says_so(tmp_path: Path) -> None:
    old = tmp_path / "old.json.partial"
    partial = PartialReport(old)
    partial.add("gpu-001", HOSTS["gpu-001"])
    partial.close(done=False)
    other = _write(
        tmp_path, "rest.json", report_document({"gpu-002": HOSTS["gpu-002"]}, started=0, finished=1)
    )
    merged = merge([old, other])
    assert set(merged.report["hosts"]) == {"gpu-001", "gpu-002"}
    assert any("without its targets" in n for n in merged.notes)


def test_a_partial_with_answers_from_hosts_it_does_not_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _shards(tmp_path)
    killed = _killed(tmp_path, 1, 4, answered=2, torn=False)
    with killed.open("a") as fh:
        fh.write(json.dumps({"host": "intruder", "entry": HOSTS["gpu-000"]}) + "\n")
    err = _refused([killed, *paths[1:]], capsys, tmp_path)
    assert "answers from hosts it does not target: intruder" in err


# ------------------------------------------------------------------------------ api.scan --shard


@pytest.fixture()
def inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv.yml"
    lines = ["all:", "  hosts:"] + [f"    {h}:" for h in sorted(HOSTS)[:12]]
    inv.write_text("\n".join(lines) + "\n")
    return inv


class FakeRunner:
    """ansible-runner's stand-in: answers for each host the limit names, recording each run's limit;
    ``die_after``: raise (a killed controller) after that many answers."""

    def __init__(self, die_after: int | None = None) -> None:
        self.limits: list[str | None] = []
        self.hosts: list[list[str]] = []  # the names each run's limit file held
        self.die_after = die_after

    def __call__(
        self,
        opts: RunnerOptions,
        on_result: Callable[[TaskResult], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> PlaybookRun:
        self.limits.append(opts.limit)
        limit = str(opts.limit)
        assert limit.startswith("@"), limit  # a shard's names go in a limit file, one a line
        self.hosts.append(Path(limit[1:]).read_text().split("\n"))
        run = PlaybookRun(status="successful", rc=0)
        for n, host in enumerate(self.hosts[-1]):
            if self.die_after is not None and n == self.die_after:
                raise KeyboardInterrupt
            result = {k: v for k, v in HOSTS[host].items() if k != "status"}
            tr = TaskResult(host, "ok", "scan", "fleetops.node.node_health", result)
            run.tasks[host] = [tr]
            if on_result is not None:
                on_result(tr)
        return run


def test_scan_shard_runs_exactly_its_hosts_and_records_the_shard(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeRunner()
    monkeypatch.setattr(scan, "run_playbook", fake)
    selected = sorted(HOSTS)[:12]
    reports = []
    for i in (1, 2, 3):
        out = tmp_path / f"shard{i}.json"
        result = api.scan(
            api.ScanRequest(inventory=[inventory], shard=Shard(i, 3), output=out, transport="ansible")
        )
        mine = [h for h in selected if Shard(i, 3).holds(h)]
        assert mine and fake.hosts[-1] == mine  # exact names, no pattern
        assert not Path(str(fake.limits[-1])[1:]).exists()  # the limit file is gone after the run
        assert list(result.report["hosts"]) == mine and result.report["shard"] == {"index": i, "count": 3}
        assert not out.with_name(out.name + ".partial").exists()
        reports.append(out)
    merged = merge(reports)
    assert set(merged.report["hosts"]) == set(selected)
    assert merged.report["options"]["checks"] is None
    # how the hosts were reached and where their next steps came from, as each shard's scan recorded them
    record = json.loads(reports[0].read_text())["next_steps"]
    assert record["policy"] == "default" and all(
        json.loads(r.read_text())["next_steps"] == record for r in reports
    )
    assert merged.report["transport"] == {"name": "ansible"} and merged.report["next_steps"] == record
    assert [s["transport"] for s in merged.report["merged"]["sources"]] == ["ansible"] * 3


def test_a_killed_shard_scan_leaves_its_targets_first(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "run_playbook", FakeRunner(die_after=1))
    out = tmp_path / "shard.json"
    with pytest.raises(KeyboardInterrupt):
        api.scan(api.ScanRequest(inventory=[inventory], shard=Shard(2, 3), output=out, transport="ansible"))
    partial = out.with_name("shard.json.partial")
    lines = [json.loads(line) for line in partial.read_text().splitlines()]
    mine = [h for h in sorted(HOSTS)[:12] if Shard(2, 3).holds(h)]
    assert lines[0]["targets"] == mine and lines[0]["shard"] == {"index": 2, "count": 3}
    assert lines[0]["transport"] == {"name": "ansible"}  # its name is known before any answer
    assert [r["host"] for r in lines[1:]] == mine[:1]  # the answers come after the targets
    assert not out.exists()
    with pytest.raises(MergeError, match=r"^shard 1/3, 3/3 missing \(given 1 of 3\)"):
        merge([partial])  # a shard alone: the others are missing


def test_an_empty_shard_scans_nothing_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = tmp_path / "one.yml"
    inv.write_text("all:\n  hosts:\n    lab-04:\n")  # shard 1 of 4 (test_shard_is_the_names_sha256)
    fake = FakeRunner()
    monkeypatch.setattr(scan, "run_playbook", fake)
    result = api.scan(api.ScanRequest(inventory=[inv], shard=Shard(2, 4)))
    assert fake.limits == [] and result.report["hosts"] == {} and result.exit_code == ExitCode.OK
    assert result.report["shard"] == {"index": 2, "count": 4}


# ------------------------------------------------------------------------------ one selection

LOCAL = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  hosts:
    lab-01:
    lab-02:
    lab-03:
    lab-04:
"""


def test_shards_of_different_selections_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # real scans, real ansible-inventory: shard 1/2 of every lab host holds lab-04, shard 2/2 taken over
    # -l lab-01,lab-02 holds two of the three hosts it would hold over every host: lab-03 is in neither
    inv = tmp_path / "lab.yml"
    inv.write_text(LOCAL)
    assert [shard_of(h, 2) for h in ("lab-01", "lab-02", "lab-03", "lab-04")] == [2, 2, 2, 1]
    one, two = tmp_path / "s1.json", tmp_path / "s2.json"
    common = ["scan", "-i", str(inv), "-q", "--checks", "zombie_memcg", "-e", "fleetops_imds=never"]
    assert main([*common, "-l", "lab-0*", "--shard", "1/2", "-o", str(one)]) in (0, 1)
    assert main([*common, "-l", "lab-01,lab-02", "--shard", "2/2", "-o", str(two)]) in (0, 1)
    capsys.readouterr()
    selection = json.loads(one.read_text())["selection"]
    assert selection["inventory"] == [str(inv)] and selection["limit"] == "lab-0*"
    assert selection["host_count"] == 4 and selection["hosts"].startswith("sha256:")
    assert selection["exclude"] == [] and "unmatched" not in selection
    err = _refused([one, two], capsys, tmp_path)
    assert "selections differ" in err, err
    assert f'limit: "lab-0*" in {one}, "lab-01,lab-02" in {two}' in err
    assert "host_count: 4 in" in err and "hosts: " in err
    # the same selection merges, and the merged report records it
    assert main([*common, "-l", "lab-0*", "--shard", "2/2", "-o", str(two)]) in (0, 1)
    capsys.readouterr()
    merged = merge([one, two]).report
    assert sorted(merged["hosts"]) == ["lab-01", "lab-02", "lab-03", "lab-04"]
    assert merged["selection"] == selection
    # a killed shard's partial file carries its selection too
    header = json.loads(two.read_text())
    partial = tmp_path / "s2.json.partial"
    partial.write_text(json.dumps({"schema": "fleetops.scan.partial/v1", "started_at": header["started_at"],
                                   "targets": ["lab-01", "lab-02"], "shard": header["shard"],
                                   "options": header["options"],
                                   "selection": {**selection, "limit": "lab-01,lab-02"}}) + "\n")  # fmt: skip
    assert "limit: " in _refused([one, partial], capsys, tmp_path)


def test_a_selection_recorded_in_one_report_only_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _shards(tmp_path)
    recorded = scan.selection_record(["inv.yml"], None, list(HOSTS))
    _write(tmp_path, "s3.json", {**_shard_report(3, 4), "selection": recorded})
    validate_scan_report(json.loads(paths[2].read_text()), "s3.json")  # the schema holds it
    err = _refused(paths, capsys, tmp_path)
    assert f"selection: recorded in {paths[2]}, not in {paths[0]}" in err


def test_reports_that_are_not_shards_merge_whatever_their_selections(tmp_path: Path) -> None:
    # two scans of disjoint --limit's: parts of no one selection (README: they merge)
    names = sorted(HOSTS)
    paths = []
    for n, part in enumerate((names[:20], names[20:])):
        hosts = {h: HOSTS[h] for h in part}
        report = report_document(hosts, started=1_764_700_000, finished=1_764_700_005, options=OPTIONS)
        selected = scan.selection_record(["inv.yml"], ",".join(part), part)
        paths.append(_write(tmp_path, f"part{n}.json", {**report, "selection": selected}))
    merged = merge(paths).report
    assert merged["hosts"] == _whole()["hosts"] and "selection" not in merged
