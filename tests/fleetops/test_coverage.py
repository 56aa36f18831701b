"""Coverage is part of the result (issue 40 item 2): each check says whether it could look, and a host whose
checks did not all look fully is ``partial``, not ``ok``: in the report, ndjson, the table, the Prometheus
file and, with ``--fail-on partial``, the exit code.

The end-to-end tests are real scans of this machine: one where systemd is not PID 1 (a new PID and mount
namespace that hides ``/run/systemd`` where the machine has it) and one whose detectors run as ``nobody``
(ansible's ``su`` become, as root), not mocks.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.module_utils import (
    coverage,
    crashloop,
    findings,
    gauges,
    health,
    textfile,
)
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleetops import schemas
from fleetops.ansible import facts
from fleetops.cli.render import host_line, render_scan
from fleetops.exitcodes import ExitCode
from fleetops.metrics import textfile as scan_textfile
from fleetops.rollout.gate import generic_gate
from fleetops.scan import FAIL_ON, exit_code, host_record, report_document
from fleetops.schemas.models import CoverageLevel
from fleetops.schemas.reports import ScanHost
from tests.helpers import FLEETOPS, fleetops
from tests.paths import REPO

NOBODY = 65534

# ------------------------------------------------------------------------- the vocabulary, declared once


def test_one_vocabulary_and_one_rule_per_detector() -> None:
    assert facts.coverage_levels() == findings.COVERAGE_LEVELS == typing.get_args(CoverageLevel)
    assert facts.answered_statuses() == findings.ANSWERED_STATUSES
    status_type = ScanHost.model_fields["status"].annotation
    assert set(findings.ANSWERED_STATUSES) <= set(typing.get_args(status_type))
    assert list(coverage.RULES) == list(health.DETECTORS)
    with pytest.raises(ValueError, match="needs a reason"):
        findings.make_coverage("partial")
    with pytest.raises(ValueError, match="unknown coverage"):
        findings.make_coverage("most")


def test_a_check_that_could_not_run_has_no_coverage_and_the_host_is_partial(tmp_path: Path) -> None:
    """A detector error (here crashloop_unit with no command runner) is coverage none, with its message."""
    result = health.run_checks({"checks": ["crashloop_unit", "cpu_starvation"], "_run": None})
    if os.path.isdir("/run/systemd/system"):
        assert result["coverage"]["crashloop_unit"]["level"] == "none"
        assert "no command runner" in result["coverage"]["crashloop_unit"]["reason"]
    else:
        assert result["coverage"]["crashloop_unit"]["reason"].startswith("systemd is not PID 1")
    assert result["coverage"]["cpu_starvation"] == {"level": "full", "reason": None}
    assert findings.answered_status(result["coverage"]) == "partial"
    # a check that raised is none with the error's words
    assert coverage.of("gpu_health", None, [{"check": "gpu_health", "msg": "Failed to read x: y"}]) == {
        "level": "none",
        "reason": "Failed to read x: y",
    }


def test_crashloop_without_systemd_is_none_and_an_unreadable_journal_partial(tmp_path: Path) -> None:
    def run(argv: list[str]) -> tuple[int, str, str]:
        raise AssertionError(f"no command without systemd: {argv}")

    no_systemd = crashloop.collect(run, systemd_dir=str(tmp_path / "absent"))
    assert coverage.of("crashloop_unit", no_systemd)["level"] == "none"
    one_sample = {"systemd": True, "rate_basis": None, "journal_error": "No journal files were found."}
    assert coverage.of("crashloop_unit", one_sample) == {
        "level": "partial",
        "reason": "journal unreadable (No journal files were found.): no restart rate, only units between "
        "crashes or at their start limit count",
    }
    blind = {"systemd": True, "rate_basis": "journal", "journal_readable": False}
    assert coverage.of("crashloop_unit", blind)["level"] == "partial"
    assert coverage.of("crashloop_unit", dict(blind, journal_readable=True))["level"] == "full"
    assert coverage.of("crashloop_unit", dict(blind, rate_basis="samples"))["level"] == "full"


@pytest.fixture
def open_dir() -> typing.Iterator[Path]:
    """A folder any user can walk (pytest's tmp_path is under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="fleetops-coverage-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_the_system_journal_is_unreadable_to_a_user_outside_its_groups(open_dir: Path) -> None:
    """journalctl exits 0 for such a user and shows only the user's own entries: the file's mode tells."""
    tmp_path = open_dir
    machine = tmp_path / "journal" / "0123abcd"
    machine.mkdir(parents=True)
    (machine / "system.journal").write_bytes(b"LPKSHHRH")
    (machine / "system.journal").chmod(0o640)
    (tmp_path / "journal").chmod(0o755)
    machine.chmod(0o755)
    folders = [str(tmp_path / "journal"), str(tmp_path / "none")]
    assert crashloop.system_journal_readable(folders) is (os.geteuid() == 0 or None)
    assert crashloop.system_journal_readable([str(tmp_path / "none")]) is None
    if os.geteuid() != 0:
        return
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'collections')!r})\n"
        "from ansible_collections.fleetops.node.plugins.module_utils import crashloop\n"
        f"print(crashloop.system_journal_readable({folders!r}))"
    )
    out = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-I",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    ("check", "facts_", "level"),
    [
        ("zombie_memcg", {"zombies": 3, "scope": "host", "cgroup_version": 1}, "full"),
        ("zombie_memcg", {"zombies": None, "scope": "namespace", "cgroup_version": 1, "scope_reason": "r"}, "partial"),
        ("zombie_memcg", {"zombies": None, "scope": "host", "cgroup_version": None}, "full"),
        ("anon_rss_growth", {"processes": 4, "unreadable": 2}, "partial"),
        ("anon_rss_growth", {"processes": 0, "unreadable": 2}, "none"),
        ("ucx_mmap_hooks", {"processes_scanned": 6, "unreadable": 26, "processes": []}, "partial"),
        ("ucx_mmap_hooks", {"processes_scanned": 6, "unreadable": 0, "processes": [{"pid": 9, "environ_readable": False}]}, "partial"),
        ("crashloop_container", {"docker": False, "reason": "docker is not installed"}, "full"),
        (
            "crashloop_container",
            {"docker": False, "reason": "docker daemon not reachable: permission denied while trying to connect to "
             "the Docker daemon socket at unix:///var/run/docker.sock"},
            "none",
        ),
        ("ec2_scheduled_event", {"imds": False, "imds_error": "IMDS not reachable: timed out"}, "partial"),
        ("ec2_scheduled_event", {"imds": None, "on_ec2": False}, "full"),
        ("gpu_health", {"nvidia_driver": True, "kernel_log": {"error": "/dev/kmsg: Operation not permitted"}}, "partial"),
        ("gpu_health", {"nvidia_driver": False, "nvidia_smi": False, "kernel_log": {"error": "x"}}, "full"),
        ("ena_resets", {"interfaces": {"eth0": {"resets_basis": "kernel log"}}, "kernel_log": {"error": "x"}}, "partial"),
        ("ena_resets", {"interfaces": {"eth0": {"resets_basis": "total_resets"}}, "kernel_log": {"error": "x"}}, "full"),
    ],
)  # fmt: skip
def test_each_rule(check: str, facts_: dict[str, Any], level: str) -> None:
    found = coverage.of(check, facts_)
    assert found["level"] == level
    assert (found["reason"] is None) == (level == "full")


# ------------------------------------------------------------------------- the report and its outputs


def _entry(status: str, cov: dict[str, dict[str, Any]], severity: str | None = None) -> dict[str, Any]:
    found = [{"check": "zombie_memcg", "severity": severity, "summary": "s", "data": {}}] if severity else []
    return {
        "status": status,
        "findings": found,
        "facts": {},
        "errors": [],
        "checks": list(cov),
        "coverage": cov,
    }


NOT_PID1 = "systemd is not PID 1 on this host: no service to read"
PARTIAL = {
    "crashloop_unit": findings.make_coverage("none", NOT_PID1),
    "cpu_starvation": findings.make_coverage("full"),
}
FULL = {"cpu_starvation": findings.make_coverage("full")}


def _report(**hosts: dict[str, Any]) -> dict[str, Any]:
    return report_document(hosts, started=1_796_000_000.0, finished=1_796_000_002.0)


def test_partial_counts_in_the_summary_and_exits_by_fail_on() -> None:
    report = _report(a=_entry("partial", PARTIAL), b=_entry("ok", FULL))
    assert report["summary"]["partial"] == 1 and report["summary"]["ok"] == 1
    codes = {level: exit_code(report, level) for level in FAIL_ON}
    # the default keeps today's exit code: a partial host alone is no failure; --fail-on partial makes it one
    assert codes == {
        "never": ExitCode.OK,
        "warning": ExitCode.OK,
        "critical": ExitCode.OK,
        "partial": ExitCode.FINDINGS,
    }
    clean = _report(b=_entry("ok", FULL))
    assert exit_code(clean, "partial") == ExitCode.OK
    warned = _report(b=_entry("ok", FULL, "warning"))
    assert exit_code(warned, "partial") == ExitCode.FINDINGS  # partial is "warning" and more
    gone = _report(
        a=_entry("partial", PARTIAL), c={"status": "unreachable", "msg": "x", "findings": [], "facts": {}}
    )
    assert exit_code(gone, "partial") == ExitCode.FAILED
    schemas.validate_scan_report(report, "test")


def test_ndjson_lines_carry_status_and_coverage() -> None:
    line = host_record("a", _entry("partial", PARTIAL))
    assert line["status"] == "partial" and line["coverage"]["crashloop_unit"]["reason"] == NOT_PID1
    schemas.ScanHostLine.model_validate(line)


def test_prometheus_coverage_gauge_and_partial_hosts_are_up() -> None:
    report = _report(a=_entry("partial", PARTIAL), b=_entry("ok", FULL))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scan_textfile(report).decode())
        for s in family.samples
    }
    assert samples[("fleetops_check_coverage", (("check", "crashloop_unit"), ("host", "a")))] == 0.0
    assert samples[("fleetops_check_coverage", (("check", "cpu_starvation"), ("host", "a")))] == 1.0
    assert samples[("fleetops_check_coverage", (("check", "cpu_starvation"), ("host", "b")))] == 1.0
    assert samples[("fleetops_scan_host_up", (("host", "a"),))] == 1.0  # it answered
    assert samples[("fleetops_scan_host_status", (("host", "a"), ("status", "partial")))] == 1.0
    assert samples[("fleetops_scan_hosts", (("status", "partial"),))] == 1.0
    assert samples[("fleetops_scan_hosts", (("status", "ok"),))] == 1.0
    half = gauges.host_series(
        "c", _entry("partial", {"ucx_mmap_hooks": findings.make_coverage("partial", "r")})
    )
    assert ("check_coverage", ("c", "ucx_mmap_hooks"), 0.5) in half


def test_the_host_timer_writes_partial_too() -> None:
    result = {"facts": {}, "findings": [], "errors": [], "checks": ["crashloop_unit"], "duration_ms": 1.0,
              "coverage": {"crashloop_unit": findings.make_coverage("none", NOT_PID1)}}  # fmt: skip
    out = textfile.series({"host": "h"}, result, 1_796_000_000.0)
    assert ("scan_host_status", ("h", "partial"), 1) in out
    assert ("check_coverage", ("h", "crashloop_unit"), 0.0) in out


def test_the_table_says_partial_with_the_reason() -> None:
    report = _report(a=_entry("partial", PARTIAL), b=_entry("ok", FULL))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_scan(report, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"partial  a: crashloop_unit (none): {NOT_PID1}" in text
    assert "2 host(s): 1 ok, 1 partial, 0 unreachable" in text
    assert "no findings[/]" not in text and "no findings 1 host(s): b" in text  # a partial host is not clean
    wide = Console(file=io.StringIO(), width=200, color_system=None)
    render_scan(report, wide, wide=True)  # a row a host (--wide): its status
    text = wide.file.getvalue()  # type: ignore[attr-defined]
    rows = {cells[1].strip(): [c.strip() for c in cells[2:]] for line in text.splitlines()
            if len(cells := line.split("│")) > 2}  # fmt: skip
    assert "partial" in rows["a"] and "ok" in rows["b"], text
    line = host_line("a", report["hosts"]["a"])
    assert "a: partial" in line and "crashloop_unit (none)" in line
    # summarised (a large fleet): the reason once, with the hosts it holds for
    hosts = {f"n{i:03d}": _entry("partial", PARTIAL) for i in range(60)}
    big = Console(file=io.StringIO(), width=200, color_system=None)
    render_scan(_report(**hosts), big)
    out = big.file.getvalue()  # type: ignore[attr-defined]
    assert out.count(NOT_PID1) == 1 and "60 host(s) (n000 n001" in out and "... and 50 more)" in out
    assert "60 host(s): 0 ok, 60 partial" in out
    # reasons that hold counts differ host by host: still one line a check, its most common reason first
    hosts = {
        f"n{i:03d}": _entry("partial", {"ucx_mmap_hooks": findings.make_coverage("partial", f"{i % 3} of 9")})
        for i in range(60)
    }
    many = Console(file=io.StringIO(), width=200, color_system=None)
    render_scan(_report(**hosts), many)
    lines = [line for line in many.file.getvalue().splitlines() if "ucx_mmap_hooks (partial)" in line]  # type: ignore[attr-defined]
    assert lines == ["  partial  60 host(s) (n000 n001 n002 n003 n004 n005 n006 n007 n008 n009 ... and 50 more): "
                     "ucx_mmap_hooks (partial): 0 of 9 (and 2 other reason(s))"]  # fmt: skip


def test_a_partial_host_passes_the_rollout_gate() -> None:
    assert generic_gate(None, _entry("partial", PARTIAL)) is None
    assert generic_gate(None, {"status": "unreachable", "msg": "x", "findings": []}) is not None


# ------------------------------------------------------------------------- real scans of this machine


def _scan(*args: str, prefix: tuple[str, ...] = ()) -> tuple[int, dict[str, Any], str]:
    if prefix:
        proc = subprocess.run([*prefix, str(FLEETOPS), "scan", *args, "--format", "json", "-q"],
                              capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL)  # fmt: skip
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    result = fleetops("scan", *args, "--format", "json", "-q")
    return result.rc, result.json(), result.stderr


# A PID namespace whose PID 1 is a shell, and a mount namespace where /run/systemd (if the machine has it)
# is an empty tmpfs: systemd is not PID 1 there, as in a container.
NO_SYSTEMD = (
    "unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c",
    '[ -d /run/systemd/system ] && mount -t tmpfs none /run/systemd; exec "$@"', "sh",
)  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_scan_where_systemd_is_not_pid1_is_partial_not_ok() -> None:
    inventory = str(REPO / "inventory" / "localhost.yml")
    checks = "crashloop_unit,unexpected_unit,cpu_starvation"
    rc, report, err = _scan("-i", inventory, "--checks", checks, prefix=NO_SYSTEMD)
    host = report["hosts"]["localhost"]
    assert host["status"] == "partial", (host, err)
    assert host["coverage"]["crashloop_unit"] == {"level": "none", "reason": NOT_PID1}
    assert host["coverage"]["unexpected_unit"]["level"] == "none"
    assert "systemd is not PID 1" in host["coverage"]["unexpected_unit"]["reason"]
    assert host["coverage"]["cpu_starvation"] == {"level": "full", "reason": None}
    assert report["summary"]["partial"] == 1 and report["summary"]["ok"] == 0
    assert host["findings"] == [] and rc == ExitCode.OK, err  # clean, as before: the default --fail-on
    rc, report, err = _scan("-i", inventory, "--checks", checks, "--fail-on", "partial", prefix=NO_SYSTEMD)
    assert rc == ExitCode.FINDINGS, err
    # the check that can look there is ok, and --fail-on partial leaves it green
    rc, report, err = _scan(
        "-i", inventory, "--checks", "cpu_starvation", "--fail-on", "partial", prefix=NO_SYSTEMD
    )
    assert report["hosts"]["localhost"]["status"] == "ok" and rc == ExitCode.OK, err


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root (su)")
def test_a_scan_as_an_unprivileged_user_is_partial_with_the_reason(tmp_path: Path) -> None:
    """The detectors run as nobody (ansible's su become): other users' processes cannot be read."""
    vars_ = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    nobody = {"ansible_become": True, "ansible_become_method": "su", "ansible_become_user": "nobody",
              "ansible_become_flags": "-s /bin/sh"}  # fmt: skip
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"root": vars_, "unpriv": {**vars_, **nobody}}}}))
    rc, report, err = _scan("-i", str(inventory), "--checks", "ucx_mmap_hooks,cpu_starvation")
    root, unpriv = report["hosts"]["root"], report["hosts"]["unpriv"]
    ucx = unpriv["coverage"]["ucx_mmap_hooks"]
    assert unpriv["status"] == "partial", (unpriv, err)
    assert ucx["level"] in ("partial", "none") and "unreadable" in ucx["reason"], ucx
    assert unpriv["facts"]["ucx"]["unreadable"] > root["facts"]["ucx"]["unreadable"]
    assert unpriv["coverage"]["cpu_starvation"]["level"] == "full"
    assert report["summary"]["partial"] >= 1
    assert rc == ExitCode.OK, err
    rc, again, err = _scan("-i", str(inventory), "--checks", "ucx_mmap_hooks", "--fail-on", "partial")
    assert again["hosts"]["unpriv"]["status"] == "partial"
    assert rc == ExitCode.FINDINGS, err
