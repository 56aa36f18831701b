"""Every door is the main door: a pass limited to a few hosts (``-l``, an alert's pass) decides with the
whole fleet's state, as the latest passes recorded it (fleetops.auto.seen): the storm brake counts the
hosts outside the pass that matched its rules recently, the floors count the hosts outside it that were
not scanned, and a host nobody recorded recently is capacity unknown. With the state directory and with
the shared store (MemoryStore, the same contract as DynamoDB)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto, store
from fleetops.ansible.collection import module_utils
from fleetops.auto.seen import SEEN_FILE, SEEN_FRESH_S, SEEN_PREFIX
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, ecc, report

mu = module_utils("store")

POLICY = """
schema: fleetops.policy/v1
budgets:
  reboot: {window: 1h, max: 100}
floor: {min_available_pct: 50, min_available: 1}
storm: {fleet_pct: 1, group_pct: 1, min_hosts: 2}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
  - name: crashloop
    match: [{check: crashloop_unit}]
    ladder:
      - {action: reboot, clear_after: 10m}
      - {action: human}
"""


def _store() -> store.Store:
    clock = [T0]
    return store.Store(mu.MemoryStore(clock=lambda: clock[0]), clock=lambda: clock[0])


def _pass(
    state_dir: Path,
    scan: dict[str, Any],
    fleet: dict[str, str],
    now: float,
    *,
    apply: bool = True,
    shared: store.Store | None = None,
) -> tuple[auto.PassResult, list[str], Runner]:
    runner, lines = Runner(), []
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: fleet[h] for h in scan["hosts"]},
        fleet=fleet,
        state_dir=state_dir,
        apply=apply,
        store=shared,
        operator="test",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines, runner


def _said(reason: str) -> str:
    """A decision's reason without the list of the hosts the fleet record counted for it."""
    return re.sub(r" \(\d+ of them outside this pass, [^)]*\)", "", reason)


def _only(scan: dict[str, Any], host: str) -> dict[str, Any]:
    return {"hosts": {host: scan["hosts"][host]}}


# five ECC hosts among twenty, one group: the storm limit is 2 (min_hosts), the floor keeps 10
FLEET = {f"h{i:02d}": "az-a" for i in range(20)}
STORM = report(**{h: ([ecc()] if i < 5 else []) for i, h in enumerate(FLEET)})


@pytest.mark.parametrize("with_store", [False, True], ids=["state-dir", "store"])
def test_single_host_passes_one_after_another_trip_the_storm_brake(tmp_path: Path, with_store: bool) -> None:
    """The alert path: one pass per alerting host. Each counts the hosts the ones before it saw (the
    fleet record), so the third trips the brake: two reboots, not five."""
    shared = _store() if with_store else None
    _pass(tmp_path, report(**{key: [] for key in FLEET}), FLEET, T0, shared=shared)  # the schedule's pass
    rebooted, held = [], []
    for i, host in enumerate(sorted(FLEET)[:5]):
        result, lines, runner = _pass(tmp_path, _only(STORM, host), FLEET, T0 + 60 * (i + 1), shared=shared)
        rebooted += [h for _a, hs, _p in runner.calls for h in hs]
        held += [d.host for d in result.decisions if d.status == "brake"]
    assert rebooted == ["h00", "h01"]
    assert held == ["h02", "h03", "h04"]
    assert any("storm brake" in line for line in lines), lines


def test_a_host_outside_the_pass_seen_unreachable_counts_against_its_floor(tmp_path: Path) -> None:
    """A group of 4 with 2 hosts unreachable in the latest full pass: a pass limited to a faulty host of
    it does not reboot it (the floor keeps 2), and says which hosts are out and why."""
    fleet = {f"a{i}": "az-a" for i in range(4)}
    full = report(a0="unreachable", a1="unreachable", a2=[], a3=[])
    _pass(tmp_path, full, fleet, T0)
    result, lines, runner = _pass(tmp_path, report(a2=[CRASHLOOP]), fleet, T0 + 300)
    assert runner.calls == []
    (d,) = result.decisions
    assert d.status == "floor" and "2 unavailable" in d.reason, d.reason
    assert any(
        line.startswith("group az-a: 4 hosts, 2 unavailable (a0 unreachable in the fleet record of 5 min ago")
        for line in lines
    ), lines


def test_a_full_and_a_limited_pass_make_the_same_brake_and_floor_decisions(tmp_path: Path) -> None:
    """Over the same fleet state and record, each faulty host gets the same decision (act, brake, floor)
    from a pass limited to it as from the full pass."""
    fleet = {
        **{f"a{i}": "az-a" for i in range(4)},
        **{f"b{i}": "az-b" for i in range(10)},
        **{f"c{i}": "az-c" for i in range(4)},
    }
    state: dict[str, Any] = {h: [] for h in fleet}
    state.update(a0="unreachable", a1="unreachable", a2=[CRASHLOOP], b0=[ecc()], b1=[ecc()], b2=[ecc()])
    state.update(c0=[CRASHLOOP])
    scan = report(**state)
    _pass(tmp_path / "recorder", scan, fleet, T0)  # a full pass records what it saw
    for name in ("full", "limited"):
        (tmp_path / name).mkdir()
        shutil.copy(tmp_path / "recorder" / SEEN_FILE, tmp_path / name / SEEN_FILE)
    now = T0 + 120
    full, _, _ = _pass(tmp_path / "full", scan, fleet, now, apply=False)
    by_full = {d.host: (d.status, _said(d.reason)) for d in full.decisions}
    assert {h: s for h, (s, _r) in by_full.items() if s != "clean"} == {
        "a0": "not_scanned",
        "a1": "not_scanned",
        "a2": "floor",
        "b0": "brake",
        "b1": "brake",
        "b2": "brake",
        "c0": "act",
    }
    for host in ("a2", "b0", "b1", "b2", "c0"):
        limited, _, _ = _pass(tmp_path / "limited", _only(scan, host), fleet, now, apply=False)
        (d,) = limited.decisions
        assert (d.status, _said(d.reason)) == by_full[host], host


def test_hosts_nobody_recorded_recently_are_capacity_unknown(tmp_path: Path) -> None:
    """No record (or one older than the freshness window): a disruptive rung under a floor waits, and the
    pass says which hosts it knows nothing of."""
    fleet = {f"a{i}": "az-a" for i in range(4)}
    result, lines, runner = _pass(tmp_path, report(a0=[CRASHLOOP]), fleet, T0)
    assert runner.calls == []
    (d,) = result.decisions
    assert d.status == "floor" and "capacity of group az-a is unknown" in d.reason, d.reason
    assert any("3 host(s) outside this pass seen by no pass within 30 min" in line for line in lines), lines
    assert result.document()["fleet_record"]["unrecorded"] == {"az-a": ["a1", "a2", "a3"]}
    assert result.exit_code == ExitCode.OK
    # a full pass records them; within the window the limited pass acts, past it it waits again
    _pass(tmp_path, report(**{key: [] for key in fleet}), fleet, T0 + 1)
    _r, _l, runner = _pass(tmp_path, report(a0=[CRASHLOOP]), fleet, T0 + SEEN_FRESH_S)
    assert [c[1] for c in runner.calls] == [["a0"]]
    late, _l, runner = _pass(tmp_path, report(a1=[CRASHLOOP]), fleet, T0 + SEEN_FRESH_S + 2)
    assert runner.calls == [] and late.decisions[0].status == "floor"


def test_a_record_that_does_not_parse_is_kept_and_fails_the_pass(tmp_path: Path) -> None:
    fleet = {f"a{i}": "az-a" for i in range(4)}
    tmp_path.mkdir(exist_ok=True)
    bad = tmp_path / SEEN_FILE
    bad.write_text('{"schema": "fleetops.auto.seen/v1", "hosts": {"a1": {"at": "soon"}}}')
    before = bad.read_bytes()
    result, _lines, runner = _pass(tmp_path, report(a0=[CRASHLOOP]), fleet, T0)
    assert runner.calls == [] and result.decisions[0].status == "floor"
    assert result.exit_code == ExitCode.FAILED
    assert any(
        "seen.json: not a fleetops.auto.seen/v1 document (kept, never written)" in w for w in result.warnings
    )
    assert bad.read_bytes() == before  # never overwritten


def test_the_store_holds_one_record_per_group_and_keeps_one_that_does_not_parse(tmp_path: Path) -> None:
    shared = _store()
    fleet = {**{f"a{i}": "az-a" for i in range(4)}, **{f"b{i}": "az-b" for i in range(4)}}
    _pass(tmp_path, report(**{key: [] for key in fleet}), fleet, T0, shared=shared)
    items = shared.call(shared.backend.items, SEEN_PREFIX)
    assert [i.key for i in items] == ["seen#az-a", "seen#az-b"]  # one write per group
    # another controller (its own state directory) acts on a limited pass with what the store recorded
    _r, _l, runner = _pass(tmp_path / "other", report(a0=[CRASHLOOP]), fleet, T0 + 60, shared=shared)
    assert [c[1] for c in runner.calls] == [["a0"]]
    shared.call(
        shared.backend.put, "seen#az-b", {"schema": "fleetops.auto.seen/v1", "hosts": 7}, items[1].version
    )
    kept = json.dumps(shared.call(shared.backend.get, "seen#az-b").doc)
    result, _l, runner = _pass(tmp_path, report(b0=[CRASHLOOP]), fleet, T0 + 120, shared=shared)
    assert runner.calls == [] and result.decisions[0].status == "floor"
    assert result.exit_code == ExitCode.FAILED
    assert json.dumps(shared.call(shared.backend.get, "seen#az-b").doc) == kept


def test_an_instance_the_inventory_lists_stopped_counts_against_its_floor(tmp_path: Path) -> None:
    fleet = {f"a{i}": "az-a" for i in range(4)}
    _pass(tmp_path, report(**{key: [] for key in fleet}), fleet, T0)
    runner, lines = Runner(), []
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(a2=[CRASHLOOP]),
        group_of={"a2": "az-a"},
        fleet=fleet,
        state_dir=tmp_path,
        apply=True,
        stopped={"a0": "EC2 instance stopped", "a1": "EC2 instance stopping"},
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: T0 + 60)
    assert runner.calls == [] and result.decisions[0].status == "floor"
    assert any("a0 EC2 instance stopped, a1 EC2 instance stopping" in line for line in lines), lines


def test_an_entry_stamped_by_a_controller_whose_clock_runs_ahead_counts(tmp_path: Path) -> None:
    """Two alert passes seconds apart from controllers whose clocks disagree (within the store's bound):
    the second one's clock is behind the first's entry, which still spends the budget (the simulation's
    alert bursts found it: two reboots in one group with a budget of one)."""
    policy = parse_policy(
        POLICY.replace("reboot: {window: 1h, max: 100}", "reboot: {window: 1h, max: 1}"), "p"
    )
    shared = _store()
    fleet = {f"a{i}": "az-a" for i in range(8)}
    _pass(tmp_path, report(**{h: [] for h in fleet}), fleet, T0, shared=shared)  # the schedule's pass
    rebooted = []
    for host, now in (("a0", T0 + 20), ("a1", T0 + 10)):  # the second controller's clock is 10 s behind
        runner = Runner()
        inputs = auto.PassInputs(
            policy=policy,
            policy_source="p",
            scan_report=report(**{host: [CRASHLOOP]}),
            group_of={host: "az-a"},
            fleet=fleet,
            state_dir=tmp_path / host,
            apply=True,
            store=shared,
            operator="test",
        )
        auto.run_pass(inputs, runner, lambda text, style: None, clock=lambda now=now: now)
        rebooted += [h for _a, hs, _p in runner.calls for h in hs]
    assert rebooted == ["a0"]


def test_a_dry_run_reads_the_record_and_writes_none(tmp_path: Path) -> None:
    fleet = {f"a{i}": "az-a" for i in range(4)}
    _pass(tmp_path, report(**{h: [] for h in fleet}), fleet, T0, apply=False)
    assert not (tmp_path / SEEN_FILE).exists()
    _pass(tmp_path, report(**{h: [] for h in fleet}), fleet, T0)
    before = (tmp_path / SEEN_FILE).read_bytes()
    result, _l, _r = _pass(tmp_path, report(a0=[CRASHLOOP]), fleet, T0 + 60, apply=False)
    assert result.decisions[0].status == "act"  # it read the record: the group's capacity is known
    assert (tmp_path / SEEN_FILE).read_bytes() == before
