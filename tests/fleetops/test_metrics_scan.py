"""Prometheus gauges of a real scan report (tests/unit/fixtures/documents/scan-3hosts.json), read back from
the written textfile: findings by detector and severity, and when the scan ran (the alert rules in
extensions/prometheus/ read both)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetops.metrics import write_textfile
from tests.paths import FIXTURES

SEVERITIES = ("critical", "warning", "info")


def _report() -> dict[str, Any]:
    report: dict[str, Any] = json.loads((FIXTURES / "documents" / "scan-3hosts.json").read_text())
    return report


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(report: dict[str, Any], tmp_path: Path, name: str = "fleetops.prom") -> Samples:
    prom = tmp_path / name
    write_textfile(report, prom)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(prom.read_text())
        for s in family.samples
    }


def _check_findings(samples: Samples, host: str) -> dict[tuple[str, str], float]:
    return {
        (labels["check"], labels["severity"]): value
        for (name, key), value in samples.items()
        if name == "fleetops_check_findings" and (labels := dict(key))["host"] == host
    }


def test_findings_by_check_and_severity_for_every_detector_that_ran(tmp_path: Path) -> None:
    report = _report()
    samples = _samples(report, tmp_path)
    local2 = report["hosts"]["local2"]
    assert [(f["check"], f["severity"]) for f in local2["findings"]] == [("zombie_memcg", "warning")]
    by_check = _check_findings(samples, "local2")
    # every detector the host ran, every severity: a zero is "ran, found nothing", absent "did not run"
    assert set(by_check) == {(check, sev) for check in local2["checks"] for sev in SEVERITIES}
    assert len(local2["checks"]) == 10
    assert {key: v for key, v in by_check.items() if v} == {("zombie_memcg", "warning"): 1.0}
    # the per-severity totals are the same findings summed over the detectors
    for sev in SEVERITIES:
        total = sum(v for (_, s), v in by_check.items() if s == sev)
        assert samples[("fleetops_findings", (("host", "local2"), ("severity", sev)))] == total
    # an unreachable host ran nothing: no findings gauges at all
    assert _check_findings(samples, "gone") == {}
    assert samples[("fleetops_scan_host_up", (("host", "gone"),))] == 0


def test_findings_of_a_check_the_host_did_not_list_still_count(tmp_path: Path) -> None:
    report = _report()
    entry = report["hosts"]["localhost"]
    entry["checks"] = ["zombie_memcg"]
    entry["findings"].append({"check": "crashloop_unit", "severity": "critical", "summary": "x", "data": {}})
    by_check = _check_findings(_samples(report, tmp_path), "localhost")
    assert {check for check, _ in by_check} == {"zombie_memcg", "crashloop_unit"}
    assert by_check["crashloop_unit", "critical"] == 1 and by_check["crashloop_unit", "warning"] == 0


def test_scan_timestamp_is_the_reports_start(tmp_path: Path) -> None:
    report = _report()
    assert report["started_at"] == "2026-12-01T14:22:43Z"
    samples = _samples(report, tmp_path)
    expected = datetime(2026, 12, 1, 14, 22, 43, tzinfo=UTC).timestamp()
    assert samples[("fleetops_scan_timestamp_seconds", ())] == expected
    # a report without a start time (an older one read back) writes no timestamp rather than a wrong one
    del report["started_at"]
    assert ("fleetops_scan_timestamp_seconds", ()) not in _samples(report, tmp_path, "again.prom")
