"""The CLI's usage errors: one clear line, exit 2, no traceback, nothing run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import fleetops


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["scan", "-i", "/nonexistent/inventory.yml"], "inventory not found: /nonexistent/inventory.yml"),
        (["scan", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["scan", "--zombie-warning", "lots"], "--zombie-warning: not an integer: 'lots'"),
        (["scan", "--zombie-warning", "-5"], "--zombie-warning: must be >= 0: '-5'"),
        (["scan", "--headroom-critical", "120"], "--headroom-critical: must be between 0 and 100"),
        (["scan", "--sample-seconds", "x"], "--sample-seconds: not a number of seconds"),
        (
            ["scan", "--zombie-warning", "500", "--zombie-critical", "100"],
            "must not exceed --zombie-critical",
        ),
        (["scan", "--format", "xml"], "invalid choice: 'xml'"),
        (["scan", "-e", "foo"], "-e 'foo': expected KEY=VALUE, a mapping or @FILE, got 'foo'"),
        (["scan", "-e", "@/nonexistent/vars.yml"], "cannot read /nonexistent/vars.yml"),
        (["scan", "-e", "{a: [1"], "-e: not YAML/JSON"),
        (["scan", "-e", "{a: 1, 2: b}"], "-e: expected a mapping of variable names to values"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (["scan", "-o", "/tmp"], "cannot write /tmp: /tmp is a directory"),
        (
            ["scan", "-o", "/nonexistent/r.json"],
            "cannot write /nonexistent/r.json: no such directory /nonexistent",
        ),
        (["scan", "--prometheus", "/etc/hostname/x.prom"], "/etc/hostname is not a directory"),
        (["drift", "-o", "/nonexistent/d.json"], "cannot write /nonexistent/d.json: no such directory"),
        (["scan", "--forks", "0"], "--forks: must be >= 1: '0'"),
        (["scan", "--sample-seconds", "nan"], "--sample-seconds: must be between 0 and 3600: 'nan'"),
        (["scan", "--headroom-critical", "inf"], "--headroom-critical: must be between 0 and 100"),
        (["drift", "--host-timeout", "-1"], "--host-timeout: must be between 0 and 86400: '-1'"),
        (["remediate", "reclaim", "--min-zombies", "-1"], "--min-zombies: must be >= 0: '-1'"),
        (["remediate", "reclaim", "--reboot-threshold", "x"], "--reboot-threshold: not an integer: 'x'"),
        (["remediate", "reclaim", "--cooldown", "nan"], "--cooldown: must be a finite number of seconds"),
        (["remediate", "reclaim", "--cooldown", "-1"], "--cooldown: must be at least 0 and at most 86400"),
        (
            ["remediate", "reboot", "--drain-timeout", "0"],
            "--drain-timeout: must be between 1 and 86400: '0'",
        ),
        (["remediate", "reboot", "--reboot-timeout", "0"], "--reboot-timeout: must be between 1 and 86400"),
        (["remediate", "fix", "--sample-seconds", "inf"], "--sample-seconds: must be between 0 and 3600"),
        (["remediate", "fix", "--reboot-threshold", "-5"], "--reboot-threshold: must be >= 0: '-5'"),
        (
            ["remediate", "reclaim", "--lease-ttl", "0"],
            "--lease-ttl: the lease TTL must be a number of seconds",
        ),
        (
            ["remediate", "reclaim", "--lease-ttl", "inf"],
            "--lease-ttl: the lease TTL must be a number of seconds",
        ),
        (["remediate", "reclaim", "--lease-settle", "-1"], "--lease-settle:"),
        (
            ["remediate", "reclaim", "--lease-ttl", "60", "--lease-settle", "100"],
            "the lease TTL must be a number of seconds above the settle time (100s)",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str) -> None:
    result = fleetops(*args, timeout=60)
    assert result.rc == 2, result
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_help_lists_commands_and_exit_codes() -> None:
    result = fleetops("--help", timeout=60)
    assert result.rc == 0
    for word in ("scan", "remediate", "exit codes:", "examples:"):
        assert word in result.stdout


def test_extra_vars_reach_the_scan_playbook(tmp_path: Path) -> None:
    """-e sets scan.yml's knobs: here only two detectors, and CPU marks (0%) that every CPU passes."""
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text("fleetops_cpu_system_warning_pct: 0\nfleetops_cpu_system_critical_pct: 0\n")
    result = fleetops(
        "scan", "-q", "--format", "json",
        "-e", "fleetops_checks=[zombie_memcg,cpu_starvation] fleetops_sample_seconds=0.3",
        "-e", f"@{vars_file}",
        timeout=120,
    )  # fmt: skip
    host = result.json()["hosts"]["localhost"]
    assert host["checks"] == ["zombie_memcg", "cpu_starvation"], result
    (finding,) = [f for f in host["findings"] if f["check"] == "cpu_starvation"]
    assert finding["severity"] == "critical"
    assert len(finding["data"]["cpus"]) == host["facts"]["cpu"]["cpus"] == os.cpu_count()
