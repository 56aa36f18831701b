"""The share of a pass's hosts that may be unreachable (the policy's ``unreachable.max_pct``): within it the
hosts are reported, left at their ladders and counted against the floors, and the pass does not fail for
them; beyond it, or for a host whose scan failed or whose detector errored, the pass fails (exit 3). The
actions' rollouts are test_auto.py's recorded stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetops import auto
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.metrics import build_auto_registry
from fleetops.policy import load_policy, parse_policy
from fleetops.policy.language import default_policy_path
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, report

POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {{window: 1h, max: 100}}
  fix: {{unlimited: true}}
{unreachable}
floor: {{min_available_pct: {floor_pct}, min_available: 0}}
storm: {{fleet_pct: 100, group_pct: 100}}
rules:
  - name: crashloop
    match: [{{check: crashloop_unit}}]
    ladder:
      - {{action: reboot, clear_after: 10m}}
      - {{action: human}}
"""


def _pass(
    tmp_path: Path, scan: dict[str, Any], unreachable: str = "", floor_pct: int = 0
) -> tuple[auto.PassResult, list[str], Runner]:
    policy = parse_policy(POLICY.format(unreachable=unreachable, floor_pct=floor_pct), "policy.yml")
    lines: list[str] = []
    runner = Runner()
    inputs = auto.PassInputs(
        policy=policy,
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=True,
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: T0)
    return result, lines, runner


def _fleet(size: int, unreachable: int, status: str = "unreachable") -> dict[str, Any]:
    """``size`` hosts h000..: h000 crash-looping, the last ``unreachable`` with ``status``, the rest clean."""
    hosts: dict[str, list[dict[str, Any]] | str] = {f"h{i:03d}": [] for i in range(size)}
    hosts["h000"] = [CRASHLOOP]
    for i in range(size - unreachable, size):
        hosts[f"h{i:03d}"] = status
    return report(**hosts)


def _gauges(result: auto.PassResult) -> dict[str, float]:
    body = generate_latest(build_auto_registry(result.document(), T0)).decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("fleetops_auto_unreachable")
    }


def test_within_the_share_the_pass_acts_reports_them_and_exits_clean(tmp_path: Path) -> None:
    result, lines, runner = _pass(tmp_path, _fleet(100, 2), "unreachable: {max_pct: 2}")
    assert result.unreachable == ["h098", "h099"] and result.unreachable_limit == 2
    assert result.tolerated == {"h098", "h099"}
    assert runner.calls == [("reboot", ["h000"], runner.calls[0][2])]  # the faulty host is still acted on
    assert result.exit_code == ExitCode.OK
    decided = {d.host: d.status for d in result.decisions}
    assert decided["h098"] == decided["h099"] == "not_scanned"  # reported, ladders left as they are
    doc = result.document()
    assert doc["unreachable"] == {"hosts": ["h098", "h099"], "limit": 2, "tolerated": True}
    assert doc["exit_code"] == 0
    assert any("2 of 100 host(s) unreachable, within the policy's 2% (2)" in line for line in lines), lines
    assert _gauges(result) == {"fleetops_auto_unreachable": 2.0, "fleetops_auto_unreachable_tolerated": 1.0}


def test_one_more_than_the_share_fails_the_pass_and_says_why(tmp_path: Path) -> None:
    result, _lines, runner = _pass(tmp_path, _fleet(100, 3), "unreachable: {max_pct: 2}")
    assert result.tolerated == frozenset()
    assert result.exit_code == ExitCode.FAILED
    assert runner.calls and runner.calls[0][1] == ["h000"]  # the pass still acts on what it could judge
    assert result.document()["unreachable"]["tolerated"] is False
    assert any(
        "more than the policy's unreachable.max_pct 2% (2): the pass fails" in w for w in result.warnings
    )
    assert _gauges(result) == {"fleetops_auto_unreachable": 3.0, "fleetops_auto_unreachable_tolerated": 0.0}


@pytest.mark.parametrize("size", [49, 1])
def test_the_share_rounds_down_so_a_small_fleet_tolerates_none(tmp_path: Path, size: int) -> None:
    result, _, _ = _pass(tmp_path, _fleet(size, 1), "unreachable: {max_pct: 2}")
    assert result.unreachable_limit == 0 and result.exit_code == ExitCode.FAILED


def test_without_the_setting_any_unreachable_host_fails_the_pass(tmp_path: Path) -> None:
    result, _, _ = _pass(tmp_path, _fleet(1000, 1))
    assert result.unreachable_limit == 0 and result.exit_code == ExitCode.FAILED


@pytest.mark.parametrize("status", ["failed", "not_scanned"])
def test_a_host_whose_scan_failed_fails_the_pass_whatever_the_share(tmp_path: Path, status: str) -> None:
    result, _, _ = _pass(tmp_path, _fleet(100, 1, status), "unreachable: {max_pct: 50}")
    assert result.unreachable == [] and result.exit_code == ExitCode.FAILED


def test_a_detector_error_fails_the_pass_whatever_the_share(tmp_path: Path) -> None:
    # h001's crash-loop ladder is in progress; on the next pass its detector errors (the pass cannot judge
    # the ladder: blind) while one host is unreachable, within a generous share
    first = _fleet(100, 0)
    first["hosts"]["h001"]["findings"] = [CRASHLOOP]
    assert _pass(tmp_path, first, "unreachable: {max_pct: 50}")[0].exit_code == ExitCode.OK
    scan = _fleet(100, 1)
    scan["hosts"]["h001"]["errors"] = [{"check": "crashloop_unit", "msg": "systemctl timed out"}]
    result, _, _ = _pass(tmp_path, scan, "unreachable: {max_pct: 50}")
    assert result.tolerated == {"h099"}
    assert [d.host for d in result.decisions if d.blind] == ["h001"]
    assert result.exit_code == ExitCode.FAILED


def test_tolerated_hosts_still_count_against_the_floor(tmp_path: Path) -> None:
    # 4 hosts, 1 unreachable (tolerated at 25%), a floor keeping 75%: the crash-looping host's reboot would
    # leave 2 of 4 in service, so it waits, and the pass does not fail for the unreachable host
    result, _, runner = _pass(tmp_path, _fleet(4, 1), "unreachable: {max_pct: 25}", floor_pct=75)
    assert result.tolerated == {"h003"}
    (held,) = [d for d in result.decisions if d.host == "h000"]
    assert held.status == "floor", held.to_dict()
    assert runner.calls == []
    assert result.exit_code == ExitCode.OK
    (group,) = result.capacity
    assert group["unavailable"] == {"h003": "unreachable"}, group


@pytest.mark.parametrize("value", ["-1", "101", "'lots'"])
def test_a_share_out_of_range_is_refused_at_load(value: str) -> None:
    with pytest.raises(UsageError, match="unreachable"):
        parse_policy(POLICY.format(unreachable=f"unreachable: {{max_pct: {value}}}", floor_pct=0), "p.yml")


def test_the_default_policy_tolerates_two_percent() -> None:
    assert load_policy(default_policy_path()).unreachable.limit(7500) == 150
