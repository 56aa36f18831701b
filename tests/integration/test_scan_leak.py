"""The issue's end-to-end case: `fleetops scan --sample-seconds 20 -e fleetops_anon_growth_warning_mb_per_min=50`
on this machine reports a real process leaking 90 MiB/min with its true rate, 94.4 MB/min (MB = 10^6 bytes).
The scan runs the playbook through ansible-runner against localhost, as an operator would."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers import fleetops
from tests.unit.plugins.module_utils.test_procs import LEAK_MIB_PER_MIN, LEAKER

pytestmark = pytest.mark.exclusive  # a rate measured on this machine: nothing else may compete for the CPU


def test_fleetops_scan_reports_a_90_mib_per_min_leak_at_its_true_rate() -> None:
    true_mb_per_min = LEAK_MIB_PER_MIN * 1024 * 1024 / 1e6  # 94.37
    child = subprocess.Popen(
        [sys.executable, "-c", LEAKER, str(LEAK_MIB_PER_MIN * 1024 * 1024 / 60.0)], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        time.sleep(11)  # processes under 10 s old are not rates (procs.MIN_AGE_SECONDS)
        result = fleetops(
            "scan", "--checks", "anon_rss_growth", "--sample-seconds", "20",
            "-e", "fleetops_anon_growth_warning_mb_per_min=50", "--format", "json",
            timeout=240,
        )  # fmt: skip
        assert child.poll() is None, "the leaking child died"
    finally:
        child.kill()
        child.wait()
    assert result.rc == 1, result.stderr  # a warning finding
    findings = [
        f
        for f in result.json()["hosts"]["localhost"]["findings"]
        if f["check"] == "anon_rss_growth" and f["data"].get("pid") == child.pid
    ]
    assert len(findings) == 1, result.stdout
    (finding,) = findings
    rate = finding["data"]["anon_mb_per_min"]
    assert finding["severity"] == "warning"
    assert abs(rate - true_mb_per_min) <= 0.10 * true_mb_per_min, finding
    assert abs(rate - true_mb_per_min) < abs(rate - LEAK_MIB_PER_MIN), finding  # MB, not MiB labelled MB
    assert "MB/min" in finding["summary"]
