"""Capacity floors from the live fleet (the policy's ``floor``): per group, hosts unreachable, quarantined or
left half done by a dead pass count as out of service, and a disruptive rung that would leave its group
below the floor waits. The actions' rollouts are test_auto.py's recorded stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops import auto, store
from fleetops.ansible.collection import module_utils
from fleetops.auto import finish as auto_finish
from fleetops.errors import UsageError
from fleetops.exitcodes import ExitCode
from fleetops.policy import Decision, hold_for_floors, parse_policy
from fleetops.rollout.lease import Ec2Connection
from tests.fleetops.test_auto import CRASHLOOP, T0, Clock, Runner, ecc, report

POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {{window: 1h, max: 100}}
  quarantine: {{window: 1h, max: 100}}
  stop-start: {{window: 1h, max: 100}}
  fix: {{unlimited: true}}
floor: {floor}
storm: {{fleet_pct: 100, group_pct: 100}}
rules:
  - name: gpu-fatal
    match: [{{check: gpu_health, severity: [critical]}}]
    ladder:
      - {{action: quarantine, clear_after: 1m}}
      - {{action: stop-start, clear_after: 30m}}
      - {{action: human}}
  - name: crashloop
    match: [{{check: crashloop_unit}}]
    ladder:
      - {{action: reboot, clear_after: 10m}}
      - {{action: human}}
"""
FLOOR = "{min_available_pct: 50, min_available: 1}"


def run(
    tmp_path: Path,
    scan: dict,  # type: ignore[type-arg]
    now: float,
    floor: str = FLOOR,
    runner: Runner | None = None,
    groups: dict[str, str] | None = None,
) -> tuple[auto.PassResult, list[str], Runner]:
    runner = runner if runner is not None else Runner()
    lines: list[str] = []
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY.format(floor=floor), "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of=groups if groups is not None else {h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=True,
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines, runner


def test_a_group_keeps_its_floor_and_the_rest_waits(tmp_path: Path) -> None:
    scan = report(**{f"h{i}": [CRASHLOOP] for i in range(4)})
    result, lines, runner = run(tmp_path, scan, T0)
    assert runner.calls == [("reboot", ["h0", "h1"], runner.calls[0][2])]  # 50% of 4 stays available
    status = {d.host: d.status for d in result.decisions}
    assert status == {"h0": "act", "h1": "act", "h2": "floor", "h3": "floor"}
    assert "floor: group az-a keeps 2 of 4 available" in next(
        d.reason for d in result.decisions if d.host == "h2"
    )
    assert (
        "group az-a: 4 hosts, 0 unavailable, 2 taken now, keeps 2 available: 0 more may be taken; held by the floor: h2 h3"
        in lines
    )
    assert result.exit_code == ExitCode.OK  # waiting, like a budget


def test_unreachable_and_quarantined_hosts_count_against_the_floor(tmp_path: Path) -> None:
    # h0 unreachable; h1 quarantined by an earlier pass (its ladder says so); h2, h3 need a reboot
    run(tmp_path, report(h1=[ecc()], h0=[], h2=[], h3=[]), T0)  # h1 quarantined
    scan = report(h0="unreachable", h1=[ecc()], h2=[CRASHLOOP], h3=[CRASHLOOP])
    result, lines, runner = run(tmp_path, scan, T0 + 30)  # h1's quarantine gets 1m: it waits
    assert runner.calls == []  # h1 waits out its quarantine; h2 and h3 would leave 1 of 4 available
    assert {d.host: d.status for d in result.decisions if d.host in ("h2", "h3")} == {
        "h2": "floor",
        "h3": "floor",
    }
    assert any(
        line.startswith("group az-a: 4 hosts, 2 unavailable (h0 unreachable, h1 quarantined)")
        for line in lines
    )


def test_a_host_already_out_of_service_climbs_without_costing_its_group(tmp_path: Path) -> None:
    # h0 and h1 quarantined (2 of 4: at the floor); after the clear time both climb to stop-start
    run(tmp_path, report(h0=[ecc()], h1=[ecc()], h2=[], h3=[]), T0)
    _, _, runner = run(tmp_path, report(h0=[ecc()], h1=[ecc()], h2=[], h3=[]), T0 + 120)
    assert runner.calls[-1][:2] == ("stop-start", ["h0", "h1"])


def test_the_quarantine_cap_holds_standing_quarantines(tmp_path: Path) -> None:
    floor = "{min_available_pct: 0, min_available: 0, max_quarantined_pct: 25}"
    scan = report(**{f"h{i}": [ecc()] for i in range(8)})
    _, _, runner = run(tmp_path, scan, T0, floor=floor)
    assert runner.calls[0][:2] == ("quarantine", ["h0", "h1"])  # 25% of 8
    again, _lines, runner = run(tmp_path, scan, T0 + 30, floor=floor, runner=runner)
    assert len(runner.calls) == 1  # the two stand quarantined: no third
    assert {d.status for d in again.decisions if d.host not in ("h0", "h1")} == {"floor"}


def test_groups_are_judged_apart(tmp_path: Path) -> None:
    scan = report(a1=[CRASHLOOP], a2=[CRASHLOOP], b1=[CRASHLOOP], b2=[CRASHLOOP])
    groups = {"a1": "az-a", "a2": "az-a", "b1": "az-b", "b2": "az-b"}
    _, _, runner = run(tmp_path, scan, T0, groups=groups)
    assert runner.calls[0][:2] == ("reboot", ["a1", "b1"])


def test_a_floor_above_a_groups_size_names_the_rule(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"rule crashloop: its floor keeps 5 of 3 available .* group az-a"):
        run(tmp_path, report(**{f"h{i}": [CRASHLOOP] for i in range(3)}), T0, floor="{min_available: 5}")


def test_a_non_disruptive_rung_is_never_held(tmp_path: Path) -> None:
    policy = POLICY.replace("{action: reboot, clear_after: 10m}", "{action: fix, clear_after: 10m}")
    runner = Runner()
    inputs = auto.PassInputs(
        policy=parse_policy(policy.format(floor=FLOOR), "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(**{f"h{i}": [CRASHLOOP] for i in range(4)}),
        group_of={f"h{i}": "az-a" for i in range(4)},
        state_dir=tmp_path / "auto",
        apply=True,
    )
    auto.run_pass(inputs, runner, lambda text, style: None, clock=lambda: T0)
    assert runner.calls[0][:2] == ("fix", ["h0", "h1", "h2", "h3"])


POLICY_REPLACE = """
schema: fleetops.policy/v1
budgets:
  stop-start: {window: 1h, max: 100}
  replace: {window: 1h, max: 100}
floor: {min_available: 3}
storm: {fleet_pct: 100, group_pct: 100}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: stop-start, clear_after: 30m}
      - {action: replace, clear_after: 2h}
      - {action: human}
"""


@pytest.mark.parametrize("instance", ["running", "no-finisher"])
def test_a_host_a_dead_pass_only_reserved_costs_its_group_when_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instance: str
) -> None:
    """The simulation's find (--outages, seed 3): a dead pass reserved a stop-start on a0 and never acted
    (the instance runs: its finisher has nothing to finish; or this pass cannot finish it: no EC2 source).
    The next pass counts the rung as tried and climbs to replace; a0 is unavailable on the record only
    ("stop-start in a batch of auto-dead") while the scan has it answering: taking it costs the group.
    Five hosts, a3 and a4 down, the floor keeps 3: replacing a0 would leave 2, so it waits."""

    clock = Clock(T0)
    shared = store.Store(module_utils("store").MemoryStore(clock=clock), clock=clock)
    dead = store.StoredState(shared)
    dead.load()
    dead.mark_seeded("test")
    dead.reserve(
        "auto-dead", "stop-start", [("a0", "az-a", "gpu-fatal", 0, "gpu_health")], "ctl:1", T0,
        {"a0": ("i-a0", "us-east-1")},
    )  # fmt: skip
    finished: list[str] = []

    class Finisher:
        @staticmethod
        def finish_instance(settings: object, record: dict) -> dict:  # type: ignore[type-arg]
            finished.append(record["instance"])
            return {"msg": f"instance {record['instance']} is running: nothing to finish", "changed": False}

    monkeypatch.setattr(auto_finish, "load", lambda relative: Finisher)
    connection = Ec2Connection(endpoint_url="http://127.0.0.1:9", aws_access_key="k", aws_secret_key="s")
    runner, lines = Runner(), []
    clock.now = T0 + 31 * 60  # past the stop-start's clear time: the ladder climbs
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY_REPLACE, "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(a0=[ecc()], a1=[], a2=[], a3="unreachable", a4="unreachable"),
        group_of={f"a{i}": "az-a" for i in range(5)},
        state_dir=tmp_path / "auto",
        apply=True,
        connection=connection if instance == "running" else None,
        store=shared,
        operator="alice@bastion",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)
    assert finished == (["i-a0"] if instance == "running" else [])
    assert len(result.recovered) == 1  # the rung counts as tried: the ladder climbs
    (d,) = [d for d in result.decisions if d.host == "a0"]
    assert d.rung_action == "replace"
    assert runner.calls == [], lines
    assert d.status == "floor", d.reason
    assert (
        "keeps 3 of 5 available (50%, at least 3); 3 unavailable (a0 among them on a record only: stop-start "
        in d.reason
    )
    assert "and may be serving), 0 taken by this pass" in d.reason


def test_a_host_on_a_record_only_is_taken_once_within_the_floor() -> None:
    """hold_for_floors: a host counted unavailable only because a record names it (``maybe_serving``)
    counts against its group for the others, and taking it is judged as taking a host in service,
    never counted twice: five hosts, the floor keeps 3, a0 on a record: a0 and a1 may go, a2 waits."""
    policy = parse_policy(POLICY_REPLACE, "policy.yml")
    decisions = [
        Decision(h, "az-a", "act", "", rule="gpu-fatal", rung=1, rung_action="replace", action="replace")
        for h in ("a0", "a1", "a2")
    ]
    out, (capacity,) = hold_for_floors(
        policy,
        decisions,
        {"az-a": 5},
        {"a0": ("az-a", "stop-start in a batch of auto-dead")},
        {},
        lambda action: True,
        maybe_serving={"a0"},
    )
    assert [d.status for d in out] == ["act", "act", "floor"]
    assert capacity.taken == ("a1",) and list(capacity.unavailable) == ["a0"]
    assert "1 unavailable, 1 taken by this pass" in out[2].reason
