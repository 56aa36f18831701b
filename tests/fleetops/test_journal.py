"""The journal never forgets an unfinished disruptive step (issue 38, item 2): a record whose instance is
not finished is never pruned by age; left unfinished past ``journal.STRANDED_AFTER_S`` it is reported as
needing a person (``store.stranded``, the ``fleetops_auto_stranded`` gauge, alert FleetopsAutoStranded)
and still counts against its group's floor; ``fleetops store forget ENTRY --reason TEXT`` closes it
(audited); and the rollouts' stale ``rollout#``/``lease#`` items are swept. The pass and the store's
contract (MemoryStore, and a real moto_server DynamoDB through the CLI) are real; the actions' rollouts
are test_auto.py's recorded stand-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto, journal, store
from fleetops.exitcodes import ExitCode
from fleetops.metrics import build_auto_registry
from fleetops.policy import MAX_WINDOW_S, parse_policy
from fleetops_lab.ec2sim import MotoServer
from tests.fleetops.test_auto import T0, Clock, Runner, ecc, report
from tests.fleetops.test_store import _fleetops, _inventory, left_by_a_dead_pass, memory

DAY = 86400.0

POLICY = """
schema: fleetops.policy/v1
budgets:
  stop-start: {window: 1h, max: 5}
floor: {min_available_pct: 50}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: stop-start, clear_after: 30m}
      - {action: human}
"""


def a_pass(
    tmp_path: Path, shared: store.Store, now: float, scan: dict[str, Any]
) -> tuple[auto.PassResult, list[str]]:
    """An applying pass with no EC2 source (nothing can finish lab-01's instance); lab-01 is in the
    inventory (the fleet) but not in this pass's selection."""
    assert isinstance(shared.clock, Clock)
    shared.clock.now = now
    lines: list[str] = []
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        fleet={"lab-01": "az-a", **{h: "az-a" for h in scan["hosts"]}},
        state_dir=tmp_path / "auto",
        apply=True,
        store=shared,
        operator="alice@bastion",
    )
    result = auto.run_pass(inputs, Runner(), lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines


def entries(shared: store.Store) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in shared.backend.get("ledger#stop-start").doc["entries"]}


def test_a_record_whose_instance_is_not_finished_is_never_pruned_by_age() -> None:
    clock = Clock(T0)
    shared = memory(clock)
    stranded = left_by_a_dead_pass(shared, T0)
    state = store.StoredState(shared)
    state.load()
    state.recover("auto-next")  # in doubt now: a later pass must finish it
    done = state.reserve("auto-next", "stop-start", [("lab-02", "az-a", "gpu-fatal", 0, "gpu_health")],
                         "ctl:2", T0, {"lab-02": ("i-0000000000000002", "us-east-1")})["lab-02"]  # fmt: skip
    state.settle({"lab-02": done}, ["lab-02"], "stop-start", T0)
    state.flush(T0 + MAX_WINDOW_S + DAY)  # long past every budget's window
    kept = entries(shared)
    assert stranded in kept and kept[stranded]["state"] == "in_doubt" and not kept[stranded].get("finished")
    assert done not in kept  # a settled entry is pruned by age as before


def test_a_step_left_unfinished_too_long_needs_a_person_and_still_counts_against_the_floor(
    tmp_path: Path,
) -> None:
    shared = memory(Clock(T0))
    entry = left_by_a_dead_pass(shared, T0)
    scan = report(**{"lab-02": [ecc()]})
    # soon after: unfinished (the pass fails), not yet a person's
    early, lines = a_pass(tmp_path, shared, T0 + 600, scan)
    assert early.unfinished and early.stranded == [] and early.exit_code == ExitCode.FAILED, lines
    # past STRANDED_AFTER_S: reported as needing a person, with the cause and the entry to forget
    late, lines = a_pass(tmp_path, shared, T0 + journal.STRANDED_AFTER_S + 600, scan)
    [s] = late.stranded
    assert s["host"] == "lab-01" and s["entry"] == entry and s["action"] == "stop-start"
    assert s["instance"] == "i-0000000000000dead" and "no EC2 source" in s["cause"] and s["attempts"] == 2
    assert any("needs a person" in line and f"fleetops store forget {entry}" in line for line in lines), lines
    assert late.document()["store"]["stranded"] == [s]
    # the alert's gauge
    samples = [
        (m.name, sample.labels, sample.value)
        for m in build_auto_registry(late.document(), T0).collect()
        for sample in m.samples
        if m.name == "fleetops_auto_stranded"
    ]
    assert samples == [
        (
            "fleetops_auto_stranded",
            {"host": "lab-01", "action": "stop-start", "entry": entry, "cause": s["cause"]},
            1.0,
        )
    ]
    # still out of service: lab-02's stop-start would leave az-a (lab-01, lab-02) below its floor of 50%
    [d] = [d for d in late.decisions if d.host == "lab-02"]
    assert d.status == "floor", d.reason
    # a month on, the record is still there
    much_later, _ = a_pass(tmp_path, shared, T0 + MAX_WINDOW_S + 30 * DAY, scan)
    assert entry in entries(shared) and [x["entry"] for x in much_later.stranded] == [entry]


def test_a_forgotten_record_is_closed_audited_and_no_longer_held_against_the_floor(tmp_path: Path) -> None:
    shared = memory(Clock(T0))
    entry = left_by_a_dead_pass(shared, T0)
    scan = report(**{"lab-02": [ecc()]})
    a_pass(tmp_path, shared, T0 + 600, scan)
    line = journal.forget(shared, entry, "bob@bastion", "started i-0000000000000dead by hand")
    assert entry in line and "lab-01" in line
    closed = entries(shared)[entry]
    assert (
        closed["finished"] is True and closed["forgotten"]["reason"] == "started i-0000000000000dead by hand"
    )
    assert [(e["event"], e["entry"], e["reason"]) for e in shared.audit_trail()] == [
        ("forget", entry, "started i-0000000000000dead by hand")
    ]
    # a full pass (lab-01 running again, scanned clean): a pass limited to lab-02 would also wait for a
    # record of lab-01 (fleetops.auto.seen: capacity unknown)
    after, lines = a_pass(tmp_path, shared, T0 + 1200, report(**{"lab-01": [], "lab-02": [ecc()]}))
    assert after.unfinished == [] and after.stranded == [], lines
    [d] = [d for d in after.decisions if d.host == "lab-02"]
    assert d.status == "act"
    with pytest.raises(journal.UnknownEntry):
        journal.forget(shared, "no-such-entry", "bob@bastion", "typo")


# ------------------------------------------------------------------------------ the sweep


def _leases(shared: store.Store, now: float) -> None:
    """Four rollouts' items: expired two days ago (swept with its lease items), expired an hour ago and
    live (kept), and one that does not parse (kept: a person breaks it)."""
    data = shared.backend.data
    for rid, expires in (("old", now - 2 * DAY), ("recent", now - 3600), ("live", now + 600)):
        data[f"rollout#{rid}"] = (3, json.dumps({"operator": "a", "since": expires - 900, "expires": expires,
                                                 "controller": "c", "instances": [f"i-{rid}"]}))  # fmt: skip
        data[f"lease#i-{rid}"] = (1, json.dumps({"rollout": rid}))
    data["rollout#bad"] = (1, "{truncated")
    data["lease#i-bad"] = (1, json.dumps({"rollout": "bad"}))
    data["lease#i-orphan"] = (1, json.dumps({"rollout": "gone-long-ago"}))


SWEPT = {"rollout#old", "lease#i-old", "lease#i-orphan"}


def test_a_pass_sweeps_rollout_and_lease_items_expired_for_over_a_day(tmp_path: Path) -> None:
    shared = memory(Clock(T0))
    now = T0 + 600
    _leases(shared, now)
    before = set(shared.backend.data)
    _result, lines = a_pass(tmp_path, shared, now, report(**{"lab-02": []}))
    assert before - set(shared.backend.data) == SWEPT, lines
    assert any("swept" in line and "rollout old" in line for line in lines), lines


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def test_store_forget_and_the_sweep_through_the_cli(tmp_path: Path, moto_url: str) -> None:
    inv = _inventory(tmp_path, moto_url, "forgetcli")
    shared = store.open_store([inv])
    assert shared is not None
    shared.ready()
    entry = left_by_a_dead_pass(shared, shared.clock())
    unknown = _fleetops("store", "forget", "nope", "--reason", "typo", "-i", str(inv))
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "nope" in unknown.stderr and entry not in unknown.stderr
    no_reason = _fleetops("store", "forget", entry, "-i", str(inv))
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    assert not entries(shared)[entry].get("finished")  # nothing was done
    done = _fleetops("store", "forget", entry, "--reason", "started it by hand", "-i", str(inv))
    assert done.returncode == 0 and entry in done.stderr, done.stderr
    assert entries(shared)[entry]["finished"] is True
    trail = shared.audit_trail()
    assert [(e["event"], e["entry"], e["operator"].split("@")[0]) for e in trail] == [
        ("forget", entry, "alice")
    ]
    # store status sweeps what expired over a day ago
    now = shared.clock()
    for key, doc in (
        ("rollout#old", {"operator": "a", "since": now - 2 * DAY, "expires": now - 2 * DAY + 900,
                         "controller": "c", "instances": ["i-old"]}),
        ("lease#i-old", {"rollout": "old"}),
    ):  # fmt: skip
        shared.backend.put(key, doc, None)
    status = _fleetops("store", "status", "-i", str(inv))
    assert status.returncode == 0 and "swept" in status.stderr, status.stderr
    assert shared.backend.get("rollout#old") is None and shared.backend.get("lease#i-old") is None
