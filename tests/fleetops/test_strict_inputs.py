"""Documents fleetops reads back (rollout state, scan report) are validated: a malformed, truncated or
foreign file is one line and exit 2 through the real CLI, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetops.rollout.state import new_rollout
from fleetops.scan import summarize
from tests.helpers import CliResult, fleetops


def _state(tmp_path: Path) -> Path:
    path = tmp_path / "state.json"
    rollout = new_rollout(
        action="reclaim",
        apply=True,
        inventory=[tmp_path / "hosts.yml"],
        extravars={"fleetops_min_zombies": 1000},
        plan={"schema": "fleetops.plan/v1", "hosts": 1, "batches": [["h1"]]},
        max_failures=0,
        cooldown=0.0,
        gate=True,
        state_path=path,
    )
    rollout.hosts["h1"] = "done"
    rollout.status = "done"
    rollout.save()
    return path


def _one_line_exit_2(result: CliResult, needle: str) -> None:
    rc, stdout, stderr = result.rc, result.stdout, result.stderr
    assert rc == 2, (rc, stdout, stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], stderr
    assert "Traceback" not in stderr and stdout == ""


def test_a_valid_state_reports(tmp_path: Path) -> None:
    state = _state(tmp_path)
    result = fleetops("report", str(state), "--format", "json", timeout=60)
    assert result.rc == 0, result.stderr
    assert result.json()["hosts"] == {"h1": "done"}


@pytest.mark.parametrize("command", [["report"], ["remediate", "--resume"]])
@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON (truncated?)"),
        (lambda text: "", "empty file"),
        (
            lambda text: text.replace('"reclaim"', '"format-disks"', 1),
            "action: unknown remediation 'format-disks'",
        ),
        (lambda text: text.replace('"max_failures": 0', '"max_failures": "0"', 1), "max_failures"),
        (lambda text: json.dumps([1, 2]), "not a "),
    ],
)
def test_a_bad_state_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str], mangle: Callable[[str], str], needle: str
) -> None:
    state = _state(tmp_path)
    state.write_text(mangle(state.read_text()))
    result = fleetops(*command, str(state), timeout=60)
    _one_line_exit_2(result, needle)
    assert str(state) in result.stderr


def test_a_truncated_scan_report_is_one_line_and_exit_2(tmp_path: Path) -> None:
    hosts = {"h1": {"status": "ok", "findings": [], "facts": {}, "errors": []}}
    report = {"schema": "fleetops.scan/v1", "started_at": "2026-01-01T00:00:00Z", "duration_s": 1.0,
              "hosts": hosts, "summary": summarize(hosts)}  # fmt: skip
    saved = tmp_path / "scan.json"
    text = json.dumps(report, indent=2)
    saved.write_text(text[: len(text) - 20])
    _one_line_exit_2(fleetops("drift", "--from", str(saved), timeout=60), "not valid JSON (truncated?)")
    del report["summary"]
    saved.write_text(json.dumps(report))
    _one_line_exit_2(fleetops("drift", "--from", str(saved), timeout=60), "summary")
