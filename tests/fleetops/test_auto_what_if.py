"""``fleetops remediate auto --from scan.json [--policy P]`` through the real CLI: the pass's decisions
against a saved scan report, every action marked a what-if, and nothing run or recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from fleetops.auto_schema import AUTO_SCHEMA, AutoPass
from fleetops.cli.app import main
from tests.fleetops.test_policy import crashloop_finding, gpu_xid_finding, report


@pytest.fixture
def scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A saved scan: gpu-1 with the captured Xid 79 kernel log, w-1 with a crash-looping unit, c-1 clean,
    gone unreachable. Any ansible run fails the test; the state home is tmp_path's."""

    def no_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a what-if ran ansible")

    monkeypatch.setattr(ansible_runner, "run", no_run)
    monkeypatch.setattr(ansible_runner.interface, "run", no_run)
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    path = tmp_path / "scan.json"
    doc = report(
        {"gpu-1": [gpu_xid_finding()], "w-1": [crashloop_finding()], "c-1": [], "gone": "unreachable"}
    )
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["remediate", "auto", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_is_the_pass_document_with_every_action_a_what_if(
    scan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(["--from", str(scan), "--format", "json"], capsys)
    doc = json.loads(out)
    AutoPass.model_validate(doc)
    assert doc["schema"] == AUTO_SCHEMA and doc["apply"] is False
    assert doc["what_if"] == {"from": str(scan)}
    assert doc["actions"] == [] and doc["ladder_tags"] == {} and doc["spent_tags"] == {}
    by_host = {d["host"]: d for d in doc["decisions"]}
    assert set(by_host) == {"gpu-1", "w-1", "c-1", "gone"}
    assert by_host["gpu-1"]["rule"] == "gpu-fatal" and by_host["gpu-1"]["rung"] == 1
    assert by_host["gpu-1"]["action"] and by_host["gpu-1"]["what_if"] is True
    assert by_host["c-1"]["status"] == "clean" and "what_if" not in by_host["c-1"]
    assert by_host["gone"]["status"] == "not_scanned"
    assert all(d["what_if"] is True for d in doc["decisions"] if d["action"])
    assert rc == doc["exit_code"] == 3  # the unreachable host fails the pass, as it would a real one
    assert not (tmp_path / "home").exists()  # no state directory written, no rollout, no audit


def test_text_marks_each_action_and_a_policy_decides(
    scan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yml"
    policy.write_text(
        """\
schema: fleetops.policy/v1
budgets:
  reboot: {per_group: 1}
rules:
  - name: loops
    match: [{check: crashloop_unit}]
    ladder:
      - {action: reboot, clear_after: 15m}
      - {action: human}
""",
        encoding="utf-8",
    )
    state = tmp_path / "state"
    rc, out, _ = run(["--from", str(scan), "--policy", str(policy), "--state-dir", str(state)], capsys)
    lines = out.splitlines()
    assert (
        "w-1: crashloop_unit (warning) rule loops rung 1/2 reboot: reboot now (first rung) -> what-if: would reboot"
        in lines
    ), out
    assert not any("gpu-1" in line and "what-if" in line for line in lines)  # no rule of this policy takes it
    assert lines[-1].endswith(f"(what-if against {scan}: nothing run, nothing recorded)")
    assert rc == 3 and not state.exists() and not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("content", "extra", "problem"),
    [
        (None, [], "no such file"),
        ('{"schema": "fleetops.drift/v1"}', [], "fleetops.scan/v1"),
        ("not json", [], "not valid JSON"),
        ('{"schema": "fleetops.scan/v1"}', [], "required"),
        ("SCAN", ["--apply"], "--apply cannot go with it"),
        ("SCAN", ["-l", "gpu-1", "--cause", "ticket 1"], "--reason, -l/--limit cannot go with it"),
    ],
)
def test_a_file_that_is_not_a_scan_report_or_an_option_that_acts_is_exit_2(
    scan: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    extra: list[str],
    problem: str,
) -> None:
    path = scan if content == "SCAN" else tmp_path / "other.json"
    if content not in (None, "SCAN"):
        path.write_text(content, encoding="utf-8")
    rc, out, err = run(["--from", str(path), *extra], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and problem in err, err
    assert not (tmp_path / "home").exists()
