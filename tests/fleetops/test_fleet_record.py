"""The fleet record's other writers and readers (fleetops.auto.seen): ``fleetops scan`` records what it
saw as a pass does (and, limited to some checks, only what it looked at), the policy's floors say what a
host nobody recorded counts as (``unrecorded``), and a pass's floors count the batches the shared store
has in flight."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import fleetops.api.scanning as api_mod
from fleetops import auto, store
from fleetops.auto.seen import SEEN_FILE, SEEN_PREFIX, combine, rule_checks, sightings
from fleetops.policy import parse_policy
from fleetops.scan import report_document
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, _static_inventory, ecc, report
from tests.fleetops.test_limited_pass import FLEET, POLICY, _only, _pass, _store


def _scan(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hosts: dict[str, Any],
    *,
    checks: list[str] | None = None,
    shared: store.Store | None = None,
    now: float = T0,
    **more: Any,
) -> api_mod.ScanResult:
    """``fleetops scan -i INV`` of FLEET (its hosts answer ``hosts``' report), through api.scan: the
    inventory is listed and the record written as a real scan does; only the hosts are not contacted."""
    inv = _static_inventory(tmp_path, FLEET)
    policy = tmp_path / "policy.yml"
    policy.write_text(POLICY)
    document = report_document(report(**hosts)["hosts"], started=T0, finished=T0 + 1)
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: document)
    monkeypatch.setattr(api_mod, "open_store", lambda inventories: shared)
    monkeypatch.setattr(time, "time", lambda: now)
    return api_mod.scan(
        api_mod.ScanRequest(
            inventory=[inv], checks=checks, policy=policy, state_dir=tmp_path / "state", **more
        )
    )


STORM_SCAN = {h: ([ecc()] if i < 5 else []) for i, h in enumerate(sorted(FLEET))}


@pytest.mark.parametrize("with_store", [False, True], ids=["state-dir", "store"])
def test_a_scan_is_recorded_and_the_next_limited_pass_brakes_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_store: bool
) -> None:
    """A scheduled `fleetops scan` of the fleet (no pass) saw five hosts with the same ECC fault: the
    alert's pass limited to one of them counts the four others and trips the storm brake (limit 2)."""
    shared = _store() if with_store else None
    result = _scan(tmp_path, monkeypatch, STORM_SCAN, shared=shared)
    assert result.record_warnings == ()
    if shared is None:
        assert result.recorded == str(tmp_path / "state" / SEEN_FILE)
    else:
        assert [i.key for i in shared.call(shared.backend.items, SEEN_PREFIX)] == ["seen#az-a"]
    passed, lines, runner = _pass(
        tmp_path / "state", _only(report(**STORM_SCAN), "h00"), FLEET, T0 + 60, shared=shared
    )
    assert runner.calls == []
    (d,) = passed.decisions
    assert d.status == "brake", d.reason
    assert any("storm brake tripped on rule gpu-fatal" in line for line in lines), lines


def test_a_scan_of_some_checks_keeps_what_it_did_not_look_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later scan with --checks crashloop_unit (all clean) did not look at the GPUs: the record keeps the
    ECC matches of the full scan, with that scan's time, and the limited pass (a dry run) still brakes."""
    _scan(tmp_path, monkeypatch, STORM_SCAN)
    _scan(tmp_path, monkeypatch, {h: [] for h in FLEET}, checks=["crashloop_unit"], now=T0 + 10)
    doc = json.loads((tmp_path / "state" / SEEN_FILE).read_text())
    assert doc["hosts"]["h01"]["rules"] == [] and doc["hosts"]["h01"]["checks"] == ["crashloop_unit"]
    assert doc["hosts"]["h01"]["earlier"] == {"gpu-fatal": T0}
    limited = _only(report(**STORM_SCAN), "h00")
    passed, _lines, _runner = _pass(tmp_path / "state", limited, FLEET, T0 + 60, apply=False)
    assert passed.decisions[0].status == "brake", passed.decisions[0].reason
    # a scan that looked at the GPUs and found them clean clears it
    _scan(tmp_path, monkeypatch, {h: [] for h in FLEET}, checks=["gpu_health"], now=T0 + 20)
    doc = json.loads((tmp_path / "state" / SEEN_FILE).read_text())
    assert "earlier" not in doc["hosts"]["h01"]
    passed, _lines, _runner = _pass(tmp_path / "state", limited, FLEET, T0 + 60, apply=False)
    assert passed.decisions[0].status == "act", passed.decisions[0].reason


def test_no_record_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = _store()
    result = _scan(tmp_path, monkeypatch, STORM_SCAN, shared=shared, fleet_record=False)
    assert result.recorded == "" and not (tmp_path / "state").exists()
    assert shared.call(shared.backend.items, SEEN_PREFIX) == []


def test_a_bad_policy_is_refused_before_any_host_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetops.documents import DocumentError

    inv = _static_inventory(tmp_path, FLEET)
    bad = tmp_path / "bad.yml"
    bad.write_text("schema: fleetops.policy/v1\nrules: []\n")
    scanned: list[Any] = []
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: scanned.append(opts))
    with pytest.raises(DocumentError):
        api_mod.scan(api_mod.ScanRequest(inventory=[inv], policy=bad, state_dir=tmp_path / "state"))
    assert scanned == [] and not (tmp_path / "state").exists()


def test_the_policy_fleetops_ships_is_read_once_the_hosts_are_being_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --policy, the shipped policy is read after the scan has started (pydantic and the policy were
    about 0.15 s of the start before the first ssh), once, for both the next steps and the record."""
    import fleetops.policy as policy_mod

    events: list[str] = []
    real_load = policy_mod.load_policy
    monkeypatch.setattr(policy_mod, "load_policy", lambda path: events.append("policy") or real_load(path))
    document = report_document(report(**STORM_SCAN)["hosts"], started=T0, finished=T0 + 1)

    def run_scan(opts: Any, **k: Any) -> dict[str, Any]:
        events.append("scan")
        return document

    monkeypatch.setattr(api_mod, "run_scan", run_scan)
    monkeypatch.setattr(api_mod, "open_store", lambda inventories: None)
    inv = _static_inventory(tmp_path, FLEET)
    result = api_mod.scan(api_mod.ScanRequest(inventory=[inv], state_dir=tmp_path / "state"))
    assert events == ["scan", "policy"]
    assert result.recorded == str(tmp_path / "state" / SEEN_FILE) and result.record_warnings == ()
    assert result.report["next_steps"]["policy"] == "default"
    stepped = [e for e in result.report["hosts"].values() if e.get("findings")]
    assert stepped and all("next" in f for e in stepped for f in e["findings"]), stepped[:1]


def test_a_detector_that_failed_did_not_look() -> None:
    """A pass's (or a scan's) sighting of a host whose gpu_health detector failed keeps the GPU rule an
    earlier sighting matched; an unreachable host looked at nothing."""
    policy = parse_policy(POLICY, "p")
    checks_of = rule_checks(policy)
    before = sightings(report(a=[ecc()], b=[ecc()])["hosts"], policy, T0)
    failed = {"status": "ok", "findings": [CRASHLOOP], "errors": [{"check": "gpu_health", "msg": "nvml"}]}
    after = sightings({"a": failed, "b": {"status": "unreachable"}}, policy, T0 + 60)
    a = combine(before["a"], after["a"], checks_of)
    b = combine(before["b"], after["b"], checks_of)
    assert a is not None and b is not None
    assert a.matched() == {"crashloop": T0 + 60, "gpu-fatal": T0}
    assert b.status == "unreachable" and b.matched() == {"gpu-fatal": T0}
    # past the freshness window the earlier match no longer counts
    assert a.matching(T0 + 1) == {"crashloop"}


UNRECORDED = POLICY.replace(
    "floor: {min_available_pct: 50, min_available: 1}",
    "floor: {min_available_pct: 50, min_available: 1, unrecorded: available}",
)


@pytest.mark.parametrize("setting", ["unknown", "available"])
def test_the_floor_says_what_an_unrecorded_host_counts_as(tmp_path: Path, setting: str) -> None:
    """No pass or scan recorded the other hosts of the group: by default their capacity is unknown and the
    reboot waits; with ``unrecorded: available`` they count as in service and it goes ahead."""
    fleet = {f"a{i}": "az-a" for i in range(4)}
    runner, lines = Runner(), []
    inputs = auto.PassInputs(
        policy=parse_policy(UNRECORDED if setting == "available" else POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(a0=[CRASHLOOP]),
        group_of={"a0": "az-a"},
        fleet=fleet,
        state_dir=tmp_path,
        apply=True,
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: T0)
    (d,) = result.decisions
    assert result.document()["fleet_record"]["unrecorded"] == {"az-a": ["a1", "a2", "a3"]}  # said either way
    if setting == "unknown":
        assert runner.calls == [] and d.status == "floor", d.reason
        assert any("capacity of group(s) az-a is unknown" in line for line in lines), lines
    else:
        assert [c[1] for c in runner.calls] == [["a0"]], d.reason
        assert any("counted in service (the policy's floors say unrecorded: available)" in ln for ln in lines)


@pytest.mark.parametrize("apply", [False, True], ids=["dry-run", "apply"])
def test_a_batch_another_pass_reserved_in_the_store_counts_against_the_floor(
    tmp_path: Path, apply: bool
) -> None:
    """A group of four, a0 unreachable in the fleet record, a1 in a reboot batch another pass reserved in
    the store and has not settled (alive: a dry run sees it; or dead: the applying pass recovers it, and
    its host may be down now): a pass limited to a2 keeps the floor (2 of 4) and does not reboot it."""
    shared = _store()
    fleet = {f"a{i}": "az-a" for i in range(4)}
    _pass(tmp_path, report(a0="unreachable", a1=[], a2=[], a3=[]), fleet, T0, shared=shared)
    other = store.StoredState(shared)
    other.load()
    other.reserve(
        "auto-other", "reboot", [("a1", "az-a", "crashloop", 0, "crashloop_unit")], "elsewhere", T0 + 30
    )
    result, lines, runner = _pass(
        tmp_path, report(a2=[CRASHLOOP]), fleet, T0 + 60, apply=apply, shared=shared
    )
    assert runner.calls == []
    (d,) = result.decisions
    assert d.status == "floor" and "2 unavailable" in d.reason, d.reason
    assert any("a1 reboot in a batch of auto-other" in line for line in lines), lines
