"""A quarantine with evict that a dead auto pass cut off mid-batch (the node cordoned, its work maybe still
running) is run again by the next pass (``Remediation.rerun_in_doubt``), with the parameters it was
reserved with, through the pass's own ``run_action``: the same attempt, its budget not spent again.

The pass, its policy and the shared store's contract (MemoryStore) are real; the actions' rollouts are the
recorded stand-in of test_auto.py (the quarantine playbook's drain is proven by test_quarantine.py against
the kubectl stand-in, and by the Slurm lab), and a dead pass is test_store.py's: killed inside its batch,
the store rolled back to what it held at that instant."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto, store
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from tests.fleetops.test_auto import T0, Runner, ecc, report
from tests.fleetops.test_store import Clock, Killed, memory

POLICY = """
schema: fleetops.policy/v1
budgets:
  quarantine: {window: 1h, max: 2}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 10m, params: {evict: true, drain_timeout: 120}}
      - {action: human}
  - name: nic
    match: [{check: ena_resets}]
    ladder:
      - {action: quarantine, clear_after: 10m}
      - {action: human}
"""
ENA = {"check": "ena_resets", "severity": "warning", "summary": "ENA resets", "data": {}}
LATER = T0 + store.PASS_LEASE_TTL_S + 5  # the dead pass's lease has expired


def run(
    tmp_path: Path,
    scan: dict[str, Any],
    runner: Any,
    shared: store.Store,
    now: float,
    *,
    apply: bool = True,
    state: str = "auto",
    fleet: Sequence[str] = (),
) -> tuple[auto.PassResult, list[str]]:
    """One pass over ``scan``'s hosts; ``fleet``: the inventory's other hosts (outside -l, or --exclude)."""
    lines: list[str] = []
    assert isinstance(shared.clock, Clock)
    shared.clock.now = now
    group_of = {h: "az-a" for h in scan["hosts"]}
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of=group_of,
        fleet={**group_of, **{h: "az-a" for h in fleet}},
        state_dir=tmp_path / state,
        apply=apply,
        store=shared,
        operator="alice@bastion",
        extra_params={"quarantine": {"kubectl": "/opt/kube/kubectl"}},
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines


def dies_in_its_batch(tmp_path: Path, shared: store.Store, scan: dict[str, Any], now: float) -> None:
    """A pass killed inside its first batch: the store holds what it held then."""
    snapshot: dict[str, Any] = {}

    def dies(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        snapshot.update(copy.deepcopy(shared.backend.data))
        raise Killed

    with pytest.raises(Killed):
        run(tmp_path, scan, dies, shared, now, state="dead")
    shared.backend.data = snapshot


def entries(shared: store.Store) -> list[dict[str, Any]]:
    return list(shared.backend.get("ledger#quarantine").doc["entries"])


def evicting(params: Mapping[str, Any]) -> bool:
    return params.get("evict") is True and params.get("finding") == "gpu_health"


@pytest.mark.parametrize("outside", [False, True], ids=["selected", "outside-the-selection"])
def test_a_drain_a_dead_pass_cut_off_is_run_again_once_without_spending_its_budget_again(
    tmp_path: Path, outside: bool
) -> None:
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), T0)
    [left] = entries(shared)
    assert left["state"] == "reserved" and left["rerun"]["evict"] is True  # recorded before the batch
    assert "kubectl" not in left["rerun"]  # the operator's own: the next pass's
    # the next pass: a fresh state directory; lab-01 in its scan, or left out (-l / --exclude); lab-02 has a
    # fault of its own: the hour's budget of 2 has room for it only if the re-run spends nothing
    scan = report(**{"lab-02": [ecc()]}) if outside else report(**{"lab-01": [ecc()], "lab-02": [ecc()]})
    runner = Runner()
    result, lines = run(tmp_path, scan, runner, shared, LATER, state="fresh", fleet=["lab-01"])
    assert [(action, hosts) for action, hosts, _p in runner.calls] == [
        ("quarantine", ["lab-01"]),  # run again, before anything is decided
        ("quarantine", ["lab-02"]),
    ], lines
    params = runner.calls[0][2]
    assert evicting(params) and params["drain_timeout"] == 120 and params["kubectl"] == "/opt/kube/kubectl"
    assert params["reason"] == left["rerun"]["reason"]
    assert result.exit_code == ExitCode.OK, lines
    assert result.finished == ["lab-01: ran the quarantine (evict) a dead pass cut off again: done"]
    # sorted: the in-doubt entry now counts from when this pass found it, the time lab-02's was settled
    assert sorted((e["host"], e["state"], e.get("finished")) for e in entries(shared)) == [
        ("lab-01", "in_doubt", True),
        ("lab-02", "done", None),
    ]
    if not outside:  # its ladder holds the dead pass's rung: it waits out its clear time, not acted on twice
        assert {d.host: d.status for d in result.decisions}["lab-01"] == "wait"
    # finished: the pass after runs it no more
    again = Runner()
    later, _ = run(tmp_path, scan, again, shared, LATER + 60, state="fresh", fleet=["lab-01"])
    assert again.calls == [] and later.finished == [] and later.exit_code == ExitCode.OK


def test_a_rerun_that_fails_fails_the_pass_and_the_next_pass_runs_it_again(tmp_path: Path) -> None:
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), T0)
    failing = Runner(fail=["lab-01"])  # the drain did not finish (a PodDisruptionBudget, a requeue refused)
    result, lines = run(tmp_path, report(**{"lab-01": [ecc()]}), failing, shared, LATER)
    assert [(a, h) for a, h, _p in failing.calls] == [("quarantine", ["lab-01"])]
    assert result.exit_code == ExitCode.FAILED and result.unfinished == ["lab-01"]
    assert any("run again, did not finish; the next pass tries again" in line for line in lines)
    [entry] = entries(shared)
    assert entry["state"] == "in_doubt" and not entry.get("finished")
    runner = Runner()
    retried, _ = run(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, LATER + 60)
    assert [(a, h) for a, h, _p in runner.calls] == [("quarantine", ["lab-01"])]
    assert evicting(runner.calls[0][2])
    assert retried.exit_code == ExitCode.OK and retried.unfinished == []
    assert [(e["state"], e.get("finished")) for e in entries(shared)] == [("in_doubt", True)]


def test_only_a_quarantine_with_evict_is_run_again(tmp_path: Path) -> None:
    """A cordon is done at once: a quarantine without evict a dead pass cut off is counted as attempted,
    and nothing more (two dead passes: lab-02's quarantine without evict, then lab-01's with it)."""
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-02": [ENA]}), T0)
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), LATER)
    runner = Runner()
    scan = report(**{"lab-01": [ecc()], "lab-02": [ENA]})
    result, lines = run(tmp_path, scan, runner, shared, LATER + store.PASS_LEASE_TTL_S + 5)
    assert [(a, h) for a, h, _p in runner.calls] == [("quarantine", ["lab-01"])], lines
    assert evicting(runner.calls[0][2]) and result.exit_code == ExitCode.OK
    got = {e["host"]: (e["state"], e.get("finished"), "rerun" in e) for e in entries(shared)}
    assert got == {"lab-02": ("in_doubt", None, False), "lab-01": ("in_doubt", True, True)}


def test_a_dry_run_says_what_it_would_run_again_and_runs_nothing(tmp_path: Path) -> None:
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), T0)
    runner = Runner()
    scan = report(**{"lab-02": []})  # lab-01 outside the selection: the dry run decides nothing for it
    _, lines = run(tmp_path, scan, runner, shared, LATER, apply=False, fleet=["lab-01"])
    assert runner.calls == []
    assert any(
        line.startswith("lab-01: the quarantine (evict) pass auto-") and "would be run again" in line
        for line in lines
    ), lines
    assert [e["state"] for e in entries(shared)] == ["reserved"]  # a dry run recovers nothing
    applied = Runner()
    run(tmp_path, scan, applied, shared, LATER + 60, fleet=["lab-01"])
    assert [(a, h) for a, h, _p in applied.calls] == [("quarantine", ["lab-01"])]


def test_a_host_no_longer_in_the_inventory_is_reported_unfinished(tmp_path: Path) -> None:
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), T0)
    runner = Runner()
    result, lines = run(tmp_path, report(**{"lab-02": []}), runner, shared, LATER)
    assert runner.calls == []
    assert result.unfinished == ["lab-01"] and result.exit_code == ExitCode.FAILED
    assert any("cannot be run again: the host is not in the inventory" in line for line in lines)
    assert not entries(shared)[0].get("finished")


def test_api_auto_runs_it_again_on_a_host_outside_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api.auto's run_action names a host outside -l in the whole inventory (a limit would refuse it), with
    the operator's kubectl (ansible and the lab are proven by tests/integration)."""
    import fleetops.api.verbs as api_mod
    from fleetops.rollout.state import HOST_DONE, new_rollout
    from tests.fleetops.test_auto import _static_inventory

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    clock = Clock(time.time() - store.PASS_LEASE_TTL_S - 60)
    shared = memory(clock)
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), clock.now)
    clock.now = time.time()
    inv = _static_inventory(tmp_path, {"lab-01": "a", "lab-02": "a"})
    monkeypatch.setattr(api_mod, "run_scan", lambda opts, **k: report(**{"lab-02": []}))
    monkeypatch.setattr(api_mod, "open_store", lambda inventories: shared)
    seen: list[api_mod.RemediationRequest] = []

    def remediate(request: api_mod.RemediationRequest, observer: Any = None, **k: Any) -> Any:
        seen.append(request)
        rollout = new_rollout(action=request.action, apply=True, inventory=[inv], extravars={},
                              plan={"batches": [list(request.hosts or [])]}, max_failures=0, cooldown=0.0,
                              gate=True, state_path=tmp_path / f"{request.action}.json")  # fmt: skip
        rollout.hosts = {h: HOST_DONE for h in request.hosts or []}
        return api_mod.RolloutResult(rollout, {"recorded": True}, ExitCode.OK)

    monkeypatch.setattr(api_mod, "remediate", remediate)
    policy = tmp_path / "policy.yml"
    policy.write_text(POLICY)
    result = api_mod.auto(
        api_mod.AutoRequest(
            policy=policy,
            inventory=[inv],
            limit="lab-02",
            apply=True,
            action_params={"quarantine": {"kubectl": "/opt/kube/kubectl"}},
        )
    )
    assert [(r.action, list(r.hosts or []), r.limit) for r in seen] == [("quarantine", ["lab-01"], None)]
    assert seen[0].params["evict"] is True and seen[0].params["kubectl"] == "/opt/kube/kubectl"
    # (the pass itself exits 3 here: no kubectl to read the Kubernetes nodes with, on this machine)
    assert result.result.finished and result.result.unfinished == [], result.document
    assert [(e["state"], e.get("finished")) for e in entries(shared)] == [("in_doubt", True)]


def test_a_paused_pass_runs_no_drain_again_and_says_what_it_would_finish(tmp_path: Path) -> None:
    """A pause holds the re-runs in doubt too: nothing runs, and the pass lists what it would run again
    (the pass document's ``store.would_finish``); unpaused, the next pass runs it."""
    shared = memory(Clock(T0))
    dies_in_its_batch(tmp_path, shared, report(**{"lab-01": [ecc()]}), T0)
    shared.pause("bob@bastion", "incident 42")
    runner = Runner()
    result, lines = run(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, LATER, state="fresh")
    assert runner.calls == [] and result.exit_code == ExitCode.PAUSED, lines
    [would] = result.would_finish
    assert would.startswith("lab-01: the quarantine (evict) pass ") and would.endswith(
        "would be run again once automation is unpaused"
    )
    assert result.document()["store"]["would_finish"] == [would]
    shared.unpause("bob@bastion", "over")
    again, lines = run(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, LATER + 60, state="fresh")
    assert [(a, h) for a, h, _p in runner.calls] == [("quarantine", ["lab-01"])], lines
    assert again.would_finish == []
