"""The storm brake (issue: a driver bug that makes every GPU log Xid 79 must cordon at most the budget
and stop-start nothing): a rule matching more hosts in one pass than its storm limits trips a brake that
holds the rule's reboot, stop-start and replace rungs fleet-wide until a person lifts it; quarantine,
which only protects work, goes on within its budget. The actions' rollouts are test_auto.py's recorded
stand-in; the policy, the state files, the store's contract (MemoryStore) and the audit log are real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetops import api, auto, store
from fleetops.ansible.collection import module_utils
from fleetops.documents import DocumentError
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from fleetops.policy.language import Storm
from fleetops.remediations import REMEDIATIONS
from tests.fleetops.test_auto import T0, Runner, ecc, report

mu = module_utils("store")

POLICY = """
schema: fleetops.policy/v1
budgets:
  quarantine: {window: 1h, max: 2}
  stop-start: {window: 1h, max: 10}
  reboot: {window: 1h, max: 10}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 1m}
      - {action: stop-start, clear_after: 30m}
      - {action: human}
"""
HOSTS = [f"lab-0{i}" for i in range(1, 7)]


def run(
    tmp_path: Path,
    faulty: list[str],
    runner: Runner,
    now: float,
    *,
    shared: store.Store | None = None,
    state: str = "auto",
) -> tuple[auto.PassResult, list[tuple[str, str]]]:
    lines: list[tuple[str, str]] = []
    scan = report(**{h: ([ecc()] if h in faulty else []) for h in HOSTS})
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" if i % 2 else "az-b" for i, h in enumerate(HOSTS)},
        state_dir=tmp_path / state,
        apply=True,
        store=shared,
        operator="alice@bastion",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append((text, style)), clock=lambda: now)
    return result, lines


def test_only_disruptive_rungs_that_do_not_protect_work_are_braked() -> None:
    braked = sorted(name for name, r in REMEDIATIONS.items() if r.braked)
    assert braked == ["reboot", "replace", "stop-start"]


def test_the_limits_take_the_larger_of_the_share_and_the_floor() -> None:
    storm = Storm()
    assert storm.tripped(3, 6, {"a": (3, 3)}) is None  # 3 is the floor: not more than it
    assert "4 of 6 hosts" in (storm.tripped(4, 6, {"a": (2, 3), "b": (2, 3)}) or "")
    assert storm.tripped(10, 100, {"a": (3, 10)}) is None  # 10% of 100 is 10; 30% of 10 is 3
    assert "4 of 10 hosts in group a" in (storm.tripped(4, 100, {"a": (4, 10)}) or "")


def test_a_storm_cordons_the_budget_and_stop_starts_nothing_and_is_told_once(tmp_path: Path) -> None:
    runner = Runner()
    one, lines = run(tmp_path, HOSTS, runner, T0)
    assert runner.calls == [("quarantine", ["lab-01", "lab-02"], runner.calls[0][2])]  # the budget: 2 an hour
    assert one.brakes["gpu-fatal"]["new"] is True and "6 of 6 hosts" in one.brakes["gpu-fatal"]["why"]
    tripped = [text for text, style in lines if text.startswith("storm brake tripped")]
    assert len(tripped) == 1 and "'fleetops brake lift gpu-fatal'" in tripped[0]
    # a person must lift it: the pass did not fail (exit 0), unless --fail-on human (exit 1)
    assert one.exit_code == ExitCode.OK and one.document()["waiting_for_person"]["brakes"] == ["gpu-fatal"]
    one.fail_on = "human"
    assert one.exit_code == ExitCode.FINDINGS
    # after quarantine's clear time: the two quarantined hosts would climb to stop-start: held
    two, lines = run(tmp_path, HOSTS, runner, T0 + 120)
    assert [c[0] for c in runner.calls] == ["quarantine"]  # nothing more ran
    status = {d.host: d.status for d in two.decisions}
    assert status["lab-01"] == status["lab-02"] == "brake" and {status[h] for h in HOSTS[2:]} == {"budget"}
    assert two.brakes["gpu-fatal"]["new"] is False
    assert not any(text.startswith("storm brake tripped") for text, _ in lines)  # told once
    assert any(
        text.startswith("storm brake on rule gpu-fatal holds") and style == "dim" for text, style in lines
    )
    # a later hour: quarantine goes on within its budget; stop-start still held
    three, _ = run(tmp_path, HOSTS, runner, T0 + 3700)
    assert [c[0] for c in runner.calls] == ["quarantine", "quarantine"]
    assert runner.calls[1][1] == ["lab-03", "lab-04"]
    assert {d.status for d in three.decisions if d.host in ("lab-01", "lab-02")} == {"brake"}


def test_one_faulty_host_is_no_storm(tmp_path: Path) -> None:
    runner = Runner()
    result, _ = run(tmp_path, ["lab-03"], runner, T0)
    assert result.brakes == {} and [c[0] for c in runner.calls] == ["quarantine"]
    climbed, _ = run(tmp_path, ["lab-03"], runner, T0 + 120)
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start"] and climbed.exit_code == ExitCode.OK


def test_a_brake_holds_after_the_storm_ends_until_a_person_lifts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    runner = Runner()
    run(tmp_path, HOSTS, runner, T0)
    # the storm is over but for lab-01: its ladder would climb, the brake still holds
    held, _ = run(tmp_path, ["lab-01"], runner, T0 + 120)
    assert {d.host: d.status for d in held.decisions}["lab-01"] == "brake" and len(runner.calls) == 1
    with pytest.raises(UsageError, match="no storm brake on rule 'nope'"):
        api.lift_brake(api.LiftBrakeRequest(rule="nope", state_dir=tmp_path / "auto"))
    lifted = api.lift_brake(
        api.LiftBrakeRequest(rule="gpu-fatal", state_dir=tmp_path / "auto", reason="driver fixed")
    )
    assert lifted.exit_code == ExitCode.OK and "lifted" in lifted.lines[0]
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any(
        e["event"] == "lift-brake" and e["rule"] == "gpu-fatal" and e["reason"] == "driver fixed"
        for e in audit
    )
    climbed, _ = run(tmp_path, ["lab-01"], runner, T0 + 180)
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start"] and climbed.brakes == {}


def test_an_unreadable_brakes_file_stops_the_pass(tmp_path: Path) -> None:
    (tmp_path / "auto").mkdir()
    (tmp_path / "auto" / auto.BRAKES_FILE).write_text('{"schema": "something else"}')
    runner = Runner()
    with pytest.raises(DocumentError, match=r"not a fleetops\.auto\.brakes/v1 document"):
        run(tmp_path, ["lab-01"], runner, T0)
    assert runner.calls == []


def test_a_brake_in_the_shared_store_holds_every_controller(tmp_path: Path) -> None:
    clock = {"now": T0}
    shared = store.Store(mu.MemoryStore(clock=lambda: clock["now"]), clock=lambda: clock["now"])
    runner = Runner()
    run(tmp_path, HOSTS, runner, T0, shared=shared, state="a")
    assert "gpu-fatal" in shared.brakes()
    assert [e["event"] for e in shared.audit_trail()] == ["brake"]
    clock["now"] = T0 + 120
    other, _ = run(tmp_path, ["lab-01"], runner, T0 + 120, shared=shared, state="b")  # a fresh controller
    assert {d.host: d.status for d in other.decisions}["lab-01"] == "brake"
    assert [c[0] for c in runner.calls] == ["quarantine"]
    assert shared.lift_brake("gpu-fatal", "carol@ops", "fixed") is True
    assert [e["event"] for e in shared.audit_trail()] == ["brake", "lift-brake"]
    clock["now"] = T0 + 180
    run(tmp_path, ["lab-01"], runner, T0 + 180, shared=shared, state="c")
    assert [c[0] for c in runner.calls] == ["quarantine", "stop-start"]
