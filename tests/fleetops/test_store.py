"""The shared store (fleetops.store, the collection's module_utils/store.py): compare-and-swap against a
real moto_server DynamoDB on 127.0.0.1 (no boto3 mocks), the pause through the real CLI, and the auto
pass's reservations, lease and journal over the same contract in memory (MemoryStore; the actions'
rollouts are the recorded stand-in of test_auto.py, as the engine is proven by the lab tests).

moto_server does not serialise requests, so the races here are forced, call by call: both sides
read, one writes, the other's write must be refused."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto, store
from fleetops.ansible.collection import module_utils
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from fleetops_lab.ec2sim import MotoServer
from tests.fleetops.test_auto import CRASHLOOP, REBOOT_POLICY, T0, Batches, Clock, H, Runner, ecc, report

mu = module_utils("store")
aws = module_utils("aws")
REGION = "us-east-1"


# ------------------------------------------------------------------------------ DynamoDB (moto_server)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()  # SIGINT to its PID


def settings(url: str, attempts: int = 2) -> Any:
    return aws.ConnectionSettings(
        endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", max_attempts=attempts
    )


def dynamo(url: str, table: str, clock: Any = None) -> Any:
    kwargs = {"clock": clock} if clock is not None else {}
    return mu.DynamoStore(settings(url), table, REGION, **kwargs)


def test_conditional_writes_refuse_a_stale_version(moto_url: str) -> None:
    a, b = dynamo(moto_url, "cas"), dynamo(moto_url, "cas")
    assert a.ensure() is True and b.ensure() is False  # created once, found by the other
    first = a.put("ledger#reboot", {"entries": []}, None)
    assert first.version == 1
    with pytest.raises(mu.Conflict):
        b.put("ledger#reboot", {"entries": ["b"]}, None)  # "must not exist" after a's create
    read_a, read_b = a.get("ledger#reboot"), b.get("ledger#reboot")  # both read version 1
    assert read_a.version == read_b.version == 1
    a.put("ledger#reboot", {"entries": ["a"]}, read_a.version)
    with pytest.raises(mu.Conflict):  # b's write names the version it read: refused, not lost
        b.put("ledger#reboot", {"entries": ["b"]}, read_b.version)
    with pytest.raises(mu.Conflict):
        b.delete("ledger#reboot", read_b.version)
    assert b.get("ledger#reboot").doc == {"entries": ["a"]}
    assert [i.key for i in a.items("ledger#")] == ["ledger#reboot"] and a.items("pause") == []
    assert a.skew is not None and abs(a.skew) < 5  # the store's Date against this clock


def test_a_transaction_is_all_or_nothing_and_a_refused_condition_is_a_conflict(moto_url: str) -> None:
    """TransactWriteItems on moto_server: one failed condition cancels every write of the transaction
    (TransactionCanceledException, a Conflict); conditional deletes and puts mix; over 100 is refused."""
    a = dynamo(moto_url, "tx")
    a.ensure()
    assert [i.version for i in a.transact([("put", "a", {"n": 1}, None), ("put", "b", {"n": 1}, None)])] == [
        1,
        1,
    ]
    with pytest.raises(mu.Conflict, match="an item of the transaction changed"):
        a.transact([("put", "c", {"n": 1}, None), ("put", "a", {"n": 2}, None)])  # a exists: nothing written
    assert [i.key for i in a.items("")] == ["a", "b"] and a.get("a").doc == {"n": 1}
    deleted, put = a.transact([("delete", "a", 1), ("put", "b", {"n": 2}, 1)])
    assert deleted is None and (put.key, put.version, put.doc) == ("b", 2, a.get("b").doc) == (
        "b",
        2,
        {"n": 2},
    )
    with pytest.raises(mu.Conflict):
        a.transact([("delete", "b", 1)])  # b is at version 2
    assert [(i.key, i.version) for i in a.items("")] == [("b", 2)]
    with pytest.raises(mu.StoreError, match="over DynamoDB's 100"):
        a.transact([("put", f"k{n}", {}, None) for n in range(101)])


def test_a_controller_whose_clock_is_off_the_store_refuses(moto_url: str) -> None:
    import time

    late = store.Store(
        dynamo(moto_url, "skew", clock=lambda: time.time() + 600), clock=lambda: time.time() + 600
    )
    with pytest.raises(store.StoreFailure, match=r"\+60[01] s off the store's"):
        late.ready()


def test_an_unreachable_store_is_one_line_and_no_pass(tmp_path: Path) -> None:
    dead = store.Store(mu.DynamoStore(settings("http://127.0.0.1:9", attempts=1), "t", REGION))
    with pytest.raises(store.StoreFailure, match="Failed to use the shared store: Failed to call dynamodb"):
        dead.ready()
    runner = Runner()
    with pytest.raises(store.StoreFailure):
        run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, dead, T0)
    assert runner.calls == []  # never an action without the store


def _inventory(tmp_path: Path, url: str, table: str) -> Path:
    inv = tmp_path / f"{table}.fleet_ec2.yml"
    inv.write_text(
        "plugin: fleetops.node.ec2\n"
        f"regions: [{REGION}]\nendpoint_url: {url}\naws_access_key: testing\naws_secret_key: testing\n"
        f"store_table: {table}\n"
    )
    return inv


def _fleetops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "fleetops"), *args],  # the installed console script
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "USER": "alice"},
    )


def test_pause_and_unpause_through_the_cli_are_held_and_audited(tmp_path: Path, moto_url: str) -> None:
    inv = _inventory(tmp_path, moto_url, "pausecli")
    status = _fleetops("store", "status", "-i", str(inv))
    assert status.returncode == 0, status.stderr
    assert "not paused" in status.stderr
    # a reason of two lines (it would be two lines of an audit trail) is refused before the store is touched
    refused = _fleetops("pause", "-i", str(inv), "--reason", "bad AMI\nrolled out")
    assert refused.returncode == 2 and "--reason: must be one line of printable characters" in refused.stderr
    assert "not paused" in _fleetops("store", "status", "-i", str(inv)).stderr
    paused = _fleetops("pause", "-i", str(inv), "--reason", "  bad AMI rolled out ")
    assert paused.returncode == 0, paused.stderr
    assert "automation paused by alice@" in paused.stderr and "bad AMI rolled out" in paused.stderr
    again = _fleetops("pause", "-i", str(inv), "--reason", "second")
    assert again.returncode == 0 and "(already)" in again.stderr and "bad AMI" in again.stderr
    status = _fleetops("store", "status", "-i", str(inv))
    assert status.returncode == int(ExitCode.PAUSED) and "bad AMI rolled out" in status.stderr
    # another controller (a Store of its own over the same table) sees it
    other = store.open_store([inv])
    assert other is not None and (p := other.paused()) is not None and p.reason == "bad AMI rolled out"
    lifted = _fleetops("unpause", "-i", str(inv), "--reason", "fixed")
    assert lifted.returncode == 0 and "pause lifted by alice@" in lifted.stderr
    assert other.paused() is None
    assert _fleetops("unpause", "-i", str(inv)).stderr.strip() == "automation was not paused"
    trail = other.audit_trail()
    assert [(e["event"], e["reason"]) for e in trail] == [
        ("pause", "bad AMI rolled out"),
        ("unpause", "fixed"),
    ]
    assert all(e["operator"].startswith("alice@") for e in trail)


def test_pause_without_a_store_pauses_this_controller_alone_audited(tmp_path: Path) -> None:
    """No store_table: the pause lives in this controller's state directory (0600), says that it holds
    this controller alone, is audited, and `store status` exits 5 while it holds; `store init` still
    needs a store."""
    inv = tmp_path / "plain.fleet_ec2.yml"
    inv.write_text(f"plugin: fleetops.node.ec2\nregions: [{REGION}]\n")
    state = tmp_path / "state"
    env = {"FLEETOPS_STATE_DIR": str(state), "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "fleetops"), *args, "-i", str(inv)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "USER": "alice", **env},
        )  # fmt: skip

    assert cli("store", "status").returncode == 0
    done = cli("pause", "--reason", "bad AMI")
    assert done.returncode == 0, done.stderr
    assert "automation paused by alice@" in done.stderr and "on this controller only" in done.stderr
    assert stat.S_IMODE((state / "pause.json").stat().st_mode) == 0o600
    again = cli("pause", "--reason", "second")
    assert again.returncode == 0 and "(already)" in again.stderr and "bad AMI" in again.stderr
    status = cli("store", "status")
    assert status.returncode == int(ExitCode.PAUSED) and "bad AMI" in status.stderr
    lifted = cli("unpause", "--reason", "fixed")
    assert lifted.returncode == 0 and "pause on this controller lifted by alice@" in lifted.stderr
    assert not (state / "pause.json").exists() and cli("store", "status").returncode == 0
    trail = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["event"], e["reason"]) for e in trail] == [("pause", "bad AMI"), ("unpause", "fixed")]
    init = cli("store", "init")
    assert init.returncode == 2 and "no shared store" in init.stderr


# ------------------------------------------------------------------------------ the auto pass


POLICY = """
schema: fleetops.policy/v1
budgets:
  quarantine: {window: 1h, max: 1}
  stop-start: {window: 1h, max: 5}
  fix: {unlimited: true}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 10m}
      - {action: stop-start, clear_after: 30m}
      - {action: human}
  - name: crashloop
    match: [{check: crashloop_unit}]
    ladder:
      - {action: fix, clear_after: 10m}
      - {action: human}
"""


def memory(clock: Clock, conditional: bool = True) -> store.Store:
    return store.Store(mu.MemoryStore(conditional=conditional, clock=clock), clock=clock)


def left_by_a_dead_pass(shared: store.Store, at: float, instance: str = "i-0000000000000dead") -> str:
    """A stop-start a dead pass reserved on lab-01's instance at ``at`` and never settled; its entry id."""
    dead = store.StoredState(shared)
    dead.load()
    dead.mark_seeded("test")
    ids = dead.reserve(
        "auto-dead",
        "stop-start",
        [("lab-01", "az-a", "gpu-fatal", 0, "gpu_health")],
        "ctl:1",
        at,
        {"lab-01": (instance, REGION)},
    )
    return ids["lab-01"]


def run_store(
    tmp_path: Path,
    scan: dict[str, Any],
    runner: Any,
    shared: store.Store,
    now: float,
    *,
    apply: bool = True,
    state: str = "auto",
    tags: dict[str, auto.TagTarget] | None = None,
) -> tuple[auto.PassResult, list[str]]:
    lines: list[str] = []
    if isinstance(shared.clock, Clock):
        shared.clock.now = now  # the store's clock (its lease) is the pass's
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / state,
        apply=apply,
        tags=tags or {},
        store=shared,
        operator="alice@bastion",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: now)
    return result, lines


def test_two_controllers_with_fresh_state_directories_spend_one_budget(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    a, b = Runner(), Runner()
    first, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), a, shared, T0, state="a")
    assert a.calls == [("quarantine", ["lab-01"], a.calls[0][2])] and first.exit_code == ExitCode.OK
    # controller B: its own empty state directory, no tags; the store has A's quarantine
    second, lines = run_store(tmp_path, report(**{"lab-02": [ecc()]}), b, shared, T0 + 60, state="b")
    assert b.calls == []
    assert second.decisions[0].status == "budget", lines
    ledger = shared.backend.get("ledger#quarantine").doc
    assert [(e["host"], e["state"]) for e in ledger["entries"]] == [("lab-01", "done")]
    ladder = shared.backend.get("ladder#lab-01").doc
    assert ladder["rules"]["gpu-fatal"]["action"] == "quarantine"


def test_the_budget_is_reserved_before_the_batch_starts(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    seen: list[Any] = []

    def runner(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        seen.append(copy.deepcopy(shared.backend.get(f"ledger#{action}").doc))  # what the store holds now
        return Runner()(action, hosts, params)

    run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    assert [(e["host"], e["state"], e["rule"], e["rung"]) for e in seen[0]["entries"]] == [
        ("lab-01", "reserved", "gpu-fatal", 0)
    ]


def test_a_reservation_lost_to_another_writer_starts_nothing(tmp_path: Path) -> None:
    """Forced interleaving: the pass reads the ledger, another writer changes it (a pass that took over
    the lease after ours expired), then ours tries to reserve: refused, no batch, exit 3."""
    clock = Clock(T0)
    shared = memory(clock)
    runner = Runner()
    real_reserve = store.StoredState.reserve

    def interloper(self: store.StoredState, *args: Any, **kwargs: Any) -> Any:
        other = store.StoredState(shared)
        other.load()
        other.ledger.record("quarantine", "lab-09", "az-a", T0, "other")
        other.flush()  # the other writer's CAS lands first
        return real_reserve(self, *args, **kwargs)

    store.StoredState.reserve = interloper  # type: ignore[method-assign]
    try:
        result, lines = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    finally:
        store.StoredState.reserve = real_reserve  # type: ignore[method-assign]
    assert runner.calls == []
    assert result.exit_code == ExitCode.FAILED and "changed under this pass" in (result.store_failure or "")
    assert any("not started" in line for line in lines)


def test_without_the_write_condition_the_same_race_spends_the_budget_twice(tmp_path: Path) -> None:
    """The same interleaving over a store that ignores the condition: both writes land, and the fleet's
    budget of one quarantine an hour is spent twice — what the compare-and-swap is for."""
    clock = Clock(T0)
    shared = memory(clock, conditional=False)
    runner = Runner()
    real_reserve = store.StoredState.reserve

    def interloper(self: store.StoredState, *args: Any, **kwargs: Any) -> Any:
        other = store.StoredState(shared)
        other.load()
        other.ledger.record("quarantine", "lab-09", "az-a", T0, "other")
        other.flush()
        return real_reserve(self, *args, **kwargs)

    store.StoredState.reserve = interloper  # type: ignore[method-assign]
    try:
        run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    finally:
        store.StoredState.reserve = real_reserve  # type: ignore[method-assign]
    assert runner.calls and runner.calls[0][0] == "quarantine"  # acted on a stale read


def test_a_second_pass_is_refused_while_the_lease_is_live_and_takes_over_after(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    held = store.PassLease(shared, "auto-other", "bob@laptop")
    held.take()
    held._stop.set()  # its renewing thread stops: as if the process died
    runner = Runner()
    with pytest.raises(store.StoreLockedError, match="pass auto-other by bob@laptop"):
        run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    assert runner.calls == []
    clock.now = T0 + store.PASS_LEASE_TTL_S + 1
    result, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, clock.now)
    assert runner.calls and result.exit_code == ExitCode.OK
    assert shared.backend.get(store.LEASE_KEY) is None  # released at the end


class Killed(BaseException):
    """SIGKILL stand-in: raised from inside a batch; the store is then rolled back to what it held at
    that instant, so nothing the dying pass would have done after it (its finally blocks) counts."""


def test_a_pass_killed_mid_batch_is_finished_by_the_next(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    snapshot: dict[str, Any] = {}

    def dies(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        snapshot.update(copy.deepcopy(shared.backend.data))
        raise Killed

    with pytest.raises(Killed):
        run_store(tmp_path, report(**{"lab-01": [ecc()]}), dies, shared, T0, state="a")
    shared.backend.data = snapshot  # what the store held when the process died
    assert store.LEASE_KEY in snapshot  # its lease is still there, live for its TTL
    runner = Runner()
    later = T0 + store.PASS_LEASE_TTL_S + 5
    result, lines = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, later, state="b")
    # the dead pass's quarantine counts as attempted: the ladder holds it, the budget (1/h) is spent,
    # and the rung's clear time runs from when it was reserved: nothing runs again now
    assert runner.calls == []
    assert result.recovered and "counted as attempted" in result.recovered[0]
    assert result.decisions[0].status == "wait", lines
    entries = shared.backend.get("ledger#quarantine").doc["entries"]
    assert [(e["host"], e["state"]) for e in entries] == [("lab-01", "in_doubt")]
    # once the clear time has passed, the ladder climbs to the next rung
    climb, _ = run_store(
        tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0 + 11 * 60 + 200, state="b"
    )
    assert [c[0] for c in runner.calls] == ["stop-start"] and climb.exit_code == ExitCode.OK


def test_a_pause_holds_every_pass_and_lifts(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    shared.pause("carol@ops", "driver rollout")
    runner = Runner()
    held, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    assert runner.calls == [] and held.exit_code == ExitCode.PAUSED
    assert "paused by carol@ops" in (held.paused or "") and held.decisions[0].status == "act"
    assert shared.backend.get("ledger#quarantine") is None  # nothing reserved, nothing recorded
    shared.unpause("carol@ops", "done")
    acted, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0 + 60)
    assert [c[0] for c in runner.calls] == ["quarantine"] and acted.exit_code == ExitCode.OK


def test_a_pause_during_a_pass_stops_it_before_its_next_batch(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    calls: list[str] = []

    def pauses(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        calls.append(action)
        shared.pause("dave@ops", "stop everything")  # another controller, while this batch runs
        return Runner()(action, hosts, params)

    result, lines = run_store(
        tmp_path, report(**{"lab-01": [ecc()], "lab-02": [CRASHLOOP]}), pauses, shared, T0
    )
    assert calls == ["fix"]  # quarantine (after fix in the ladder order) never started
    assert result.exit_code == ExitCode.PAUSED and any("not started" in line for line in lines)
    # what did run is recorded; what did not is not
    assert [e["host"] for e in shared.backend.get("ledger#fix").doc["entries"]] == ["lab-02"]
    assert shared.backend.get("ledger#quarantine") is None


def test_a_pause_on_this_controller_holds_a_pass_without_a_store_and_one_with_and_lifts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetops pause` with no store writes this controller's pause: a state-directory pass acts on
    nothing (exit 5), one that is paused mid-pass starts no further action, a store pass on the same
    controller is held too; unpause lifts it."""
    from fleetops.rollout.pause import pause_here, unpause_here
    from tests.fleetops.test_auto import run as run_here

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    pause_here("carol@ops", "driver rollout")
    runner = Runner()
    held, _ = run_here(tmp_path, report(**{"lab-01": [ecc()]}), runner, T0)
    assert runner.calls == [] and held.exit_code == ExitCode.PAUSED and "carol@ops" in (held.paused or "")
    shared = memory(Clock(T0))
    held, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0)
    assert runner.calls == [] and held.exit_code == ExitCode.PAUSED
    assert shared.backend.get("ledger#quarantine") is None  # nothing reserved, nothing recorded
    unpause_here()

    def pauses(action: str, hosts: Sequence[str], params: Any) -> auto.ActionRun:
        pause_here("dave@ops", "stop everything")  # a person, while this batch runs
        return runner(action, hosts, params)

    result, lines = run_here(tmp_path, report(**{"lab-01": [ecc()], "lab-02": [CRASHLOOP]}), pauses, T0 + 60)
    assert [c[0] for c in runner.calls] == ["fix"]  # quarantine never started
    assert result.exit_code == ExitCode.PAUSED and any("not started" in line for line in lines)
    unpause_here()
    acted, _ = run_here(tmp_path, report(**{"lab-01": [ecc()]}), runner, T0 + 120)
    assert [c[0] for c in runner.calls] == ["fix", "quarantine"] and acted.exit_code == ExitCode.OK


def test_entries_and_items_that_do_not_parse_are_kept_and_fail_the_pass(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    foreign = {"id": "x1", "host": "lab-07", "group": "az-b", "at": "yesterday", "controller": "v9"}
    shared.backend.put("ledger#quarantine", {"schema": store.LEDGER_SCHEMA, "entries": [foreign]}, None)
    shared.backend.put("ladder#lab-05", {"rules": "garbage"}, None)
    runner = Runner()
    result, _ = run_store(tmp_path, report(**{"lab-01": [ecc()], "lab-05": [ecc()]}), runner, shared, T0)
    entries = shared.backend.get("ledger#quarantine").doc["entries"]
    assert foreign in entries  # kept as it was, beside this pass's own
    assert shared.backend.get("ladder#lab-05").doc == {"rules": "garbage"}  # never overwritten
    assert result.exit_code == ExitCode.FAILED and result.malformed_store == [
        f"ladder#lab-05: not a {store.LADDER_SCHEMA} document (kept, never written)"
    ]


def test_the_first_pass_seeds_the_store_from_the_tags_once(tmp_path: Path) -> None:
    """The upgrade path: a controller that used tags before has its record carried into the store."""
    clock = Clock(T0)
    shared = memory(clock)
    spent = f"quarantine:{int(T0 - 600)}"
    tags = {"lab-02": auto.TagTarget("i-2", REGION, None, spent)}
    runner = Runner()
    result, lines = run_store(
        tmp_path, report(**{"lab-01": [ecc()], "lab-02": []}), runner, shared, T0, tags=tags
    )
    assert runner.calls == []  # lab-02's quarantine 10 minutes ago spent the 1/h budget
    assert result.decisions[0].status == "budget" and any("seeded" in line for line in lines)
    assert shared.backend.get(store.SEEDED_KEY) is not None
    # once seeded, the tags are only a mirror: a tag edited by hand no longer counts
    tags = {
        "lab-02": auto.TagTarget("i-2", REGION, None, f"quarantine:{int(T0 - 60)};quarantine:{int(T0 - 30)}")
    }
    run_store(tmp_path, report(**{"lab-01": [ecc()], "lab-02": []}), runner, shared, T0 + 2 * H, tags=tags)
    assert [c[0] for c in runner.calls] == ["quarantine"]


def test_a_dry_run_reads_the_store_and_writes_nothing(tmp_path: Path) -> None:
    clock = Clock(T0)
    shared = memory(clock)
    runner = Runner()
    result, _ = run_store(tmp_path, report(**{"lab-01": [ecc()]}), runner, shared, T0, apply=False)
    assert result.decisions[0].status == "act" and shared.backend.data == {}
    assert json.loads(json.dumps(result.document()))["store"]["where"] == "memory store"


# ------------------------------------------------------------------------------ declared once


def test_the_inventory_plugin_documents_exactly_the_store_options() -> None:
    """module_utils/store.py's OPTIONS are the one declaration; the plugin's DOCUMENTATION (a literal Ansible
    reads, and what refuses unknown options) states them as they are."""
    import yaml

    plugin = (Path(mu.__file__).parents[1] / "inventory" / "ec2.py").read_text()
    documented = yaml.safe_load(plugin.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]
    for name, option in mu.OPTIONS.items():
        doc = documented[name]
        assert doc["type"] == option["type"], name
        assert [e["name"] for e in doc.get("env", [])] == option["env"], name
    assert {n for n in documented if n.startswith("store_")} == set(mu.OPTIONS)


def test_a_paused_store_stops_a_running_rollout_before_its_next_batch() -> None:
    """The engine's before-batch check (``launch.with_pause``): the pause first, whenever the rollout
    started; a store that cannot be read stops it too; otherwise the kill switch's EC2 channel answers."""
    from fleetops.api.launch import with_pause

    clock = Clock(T0)
    shared = memory(clock)
    asked: list[float] = []

    def ec2_stop(since: float) -> None:
        asked.append(since)

    check = with_pause(ec2_stop, shared)
    assert check is not None and check(T0 - 5) is None and asked == [T0 - 5]
    shared.pause("erin@ops", "hold")
    request = check(T0 + 3600)  # a rollout started after the pause is held as well
    assert request is not None and request.describe().startswith("stopped by erin@ops at ")
    assert "(fleetops pause; memory store): hold" in request.describe()

    def outage(operation: str) -> None:
        raise mu.StoreError("Failed to call dynamodb:GetItem in us-east-1: Throttling")

    shared.backend.fail = outage
    request = check(T0)
    assert request is not None and "Throttling" in request.describe()
    shared.backend.fail = None
    shared.unpause("erin@ops", "over")
    alone = with_pause(ec2_stop, None)  # no store: this controller's pause, then the kill switch
    assert alone(T0) is None and asked[-1] == T0


# ------------------------------------------------------------------------------ in-flight actions


POLICY_STOP_START = """
schema: fleetops.policy/v1
budgets:
  stop-start: {window: 1h, max: 5}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: stop-start, clear_after: 30m}
      - {action: human}
"""


def _moto_ec2(moto_url: str) -> Any:
    """An ``Ec2Connection`` to moto_server's EC2 in REGION, one attempt a call."""
    from fleetops.rollout.lease import Ec2Connection

    return Ec2Connection(
        endpoint_url=moto_url, aws_access_key="testing", aws_secret_key="testing", max_attempts=1, regions=(REGION,)
    )  # fmt: skip


def _next_pass(tmp_path: Path, connection: Any, shared: store.Store, serving: str) -> auto.PassInputs:
    """The pass after a dead one: a fresh state directory, the store, EC2 through ``connection``, the stop-start
    policy, and a scan of ``serving`` alone (lab-01, stopped, is not in the inventory at all: it lists running
    instances)."""
    return auto.PassInputs(
        policy=parse_policy(POLICY_STOP_START, "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(**{serving: []}),
        group_of={serving: "az-a"},
        state_dir=tmp_path / "fresh",
        apply=True,
        connection=connection,
        store=shared,
        operator="alice@bastion",
    )


def test_a_stop_start_a_dead_pass_left_stopped_is_started_by_the_next(tmp_path: Path, moto_url: str) -> None:
    """The instance (a real moto_server EC2 instance) was stopped by a pass that died before its start:
    the next pass — a fresh state directory, the host gone from the inventory (it lists running
    instances) — finds the reservation in the store, starts the instance, and counts the rung as tried.
    An instance it cannot finish fails the pass and is tried again by the next."""
    from fleetops_lab.ec2sim import client, launch_many

    ec2 = client(moto_url, REGION)
    stopped, other = launch_many(moto_url, REGION, 2, zones=("a",))
    ec2.stop_instances(InstanceIds=[stopped])
    clock = Clock(T0)
    shared = memory(clock)
    dead = store.StoredState(shared)
    dead.load()
    dead.mark_seeded("test")
    picks = [
        ("lab-01", "az-a", "gpu-fatal", 0, "gpu_health"),
        ("lab-09", "az-a", "gpu-fatal", 0, "gpu_health"),
    ]
    dead.reserve(
        "auto-dead",
        "stop-start",
        picks,
        "ctl:1",
        T0,
        {"lab-01": (stopped, REGION), "lab-09": ("i-0000000000000dead", REGION)},
    )
    runner = Runner()
    lines: list[str] = []
    inputs = _next_pass(tmp_path, _moto_ec2(moto_url), shared, "lab-02")
    clock.now = T0 + 600
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)
    state = ec2.describe_instances(InstanceIds=[stopped])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "running", lines
    assert runner.calls == []  # nothing else is touched
    assert len(result.finished) == 1 and result.finished[0].startswith(
        f"lab-01 ({stopped}): finished the stop-start"
    )
    assert result.unfinished == ["lab-09 (i-0000000000000dead)"] and result.exit_code == ExitCode.FAILED
    journal = {e["host"]: e for e in shared.backend.get("ledger#stop-start").doc["entries"]}
    assert journal["lab-01"]["state"] == "in_doubt" and journal["lab-01"]["finished"] is True
    assert not journal["lab-09"].get("finished")
    assert shared.backend.get("ladder#lab-01").doc["rules"]["gpu-fatal"]["action"] == "stop-start"
    # the next pass tries the one it could not finish again, and only that one
    again = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)
    assert again.finished == [] and again.unfinished == ["lab-09 (i-0000000000000dead)"]
    assert (
        ec2.describe_instances(InstanceIds=[other])["Reservations"][0]["Instances"][0]["State"]["Name"]
        == "running"
    )


ROLLOUT, OTHER = "20270115T080000Z-dead00", "20270115T081000Z-other0"


@pytest.mark.parametrize("holder", ["dead-here", "expired", "live-elsewhere"])
def test_the_finisher_releases_a_dead_rollouts_lease_on_the_instance_it_finished(
    tmp_path: Path, moto_url: str, holder: str
) -> None:
    """A pass killed mid stop-start leaves its rollout's lease: the store's items and their mirror tag
    ``fleetops:lease:<rollout>`` on lab-01's (stopped) and lab-02's instances. The next pass starts lab-01
    and releases that lease on lab-01 alone, when the store's own rules say the rollout is dead (its
    process on this controller is gone, or its lease expired): a controller that reads the tags alone then
    takes lab-01 at once instead of being refused until the lease expires. A live rollout's lease (another
    controller's, not expired) is left as it is."""
    from fleetops.rollout.lease import Ec2Lease, LeaseError
    from fleetops.util import process_id
    from fleetops_lab.ec2sim import client, register_ami

    lp = module_utils("lease")
    ec2 = client(moto_url, REGION)
    image = register_ami(moto_url, REGION, name=f"finisher-{holder}")
    stopped, other = (
        i["InstanceId"] for i in ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2)["Instances"]
    )
    ec2.stop_instances(InstanceIds=[stopped])
    connection = _moto_ec2(moto_url)
    clock = Clock(T0)
    shared = memory(clock)
    left_by_a_dead_pass(shared, T0, stopped)
    gone = subprocess.Popen(["true"])
    gone.wait()
    host, _pid, space = process_id().split(":")
    controller = f"{host if holder == 'dead-here' else 'elsewhere'}:{gone.pid}:{space}"
    tags = lp.Ec2Tags(connection.settings(), {stopped: REGION, other: REGION})
    targets = {stopped: "lab-01", other: "lab-02"}
    lp.StoreLease(
        shared.backend, ROLLOUT, targets, "op@ctl", 900, tags=tags, clock=clock, controller=controller
    ).acquire()

    def mirror() -> dict[str, set[str]]:
        return {i: set(leases) for i, leases in tags.read().items()}

    assert mirror() == {stopped: {ROLLOUT}, other: {ROLLOUT}}
    lines: list[str] = []
    inputs = _next_pass(tmp_path, connection, shared, "lab-03")
    clock.now = T0 + (1000 if holder == "expired" else 600)  # the lease was taken for 900 s
    result = auto.run_pass(inputs, Runner(), lambda text, style: lines.append(text), clock=clock)
    assert (
        ec2.describe_instances(InstanceIds=[stopped])["Reservations"][0]["Instances"][0]["State"]["Name"]
        == "running"
    )
    assert len(result.finished) == 1 and not any("could not release" in w for w in result.warnings), lines
    held = {i.key: i.doc for i in shared.backend.items(lp.INSTANCE_ITEM)}
    lab01 = {"lab-01": {"instance": stopped, "region": REGION}}
    tag_only = Ec2Lease(
        connection, lab01, OTHER, "bob@awx", settle=0, clock=clock
    )  # no store: the tags alone
    if holder == "live-elsewhere":
        assert mirror() == {stopped: {ROLLOUT}, other: {ROLLOUT}}
        assert held == {f"lease#{stopped}": {"rollout": ROLLOUT}, f"lease#{other}": {"rollout": ROLLOUT}}
        assert not any("released the lease" in line for line in lines), lines
        with pytest.raises(
            LeaseError, match=f"held by another rollout: lab-01 \\({stopped}\\): rollout {ROLLOUT}"
        ):
            tag_only.acquire()
        return
    why = "its process on this controller is gone" if holder == "dead-here" else "its lease had expired"
    assert (
        f"lab-01 ({stopped}): released the lease of rollout {ROLLOUT} (op@ctl) on {stopped}: {why}" in lines
    )
    assert mirror() == {other: {ROLLOUT}}  # lab-02 was not finished: its lease is left for the store's rules
    assert held == {f"lease#{other}": {"rollout": ROLLOUT}}
    assert shared.backend.get(lp.ROLLOUT_ITEM + ROLLOUT) is not None  # it still holds lab-02
    tag_only.acquire()  # at once: the dead rollout's tag is gone
    tag_only.release()


def test_releasing_a_dead_rollouts_last_instance_removes_its_item_and_spares_the_live() -> None:
    """journal.release_dead over the store alone (no mirror): the dead rollout's lease item on the
    instance goes, and its rollout item with it once it holds nothing else; a live rollout holding
    another instance, and a stale lease item of a rollout the store no longer has, are not its to judge."""
    from fleetops import journal

    lp = module_utils("lease")
    clock = Clock(T0)
    shared = memory(clock)
    lp.StoreLease(shared.backend, ROLLOUT, {"i-1": "h1"}, "op@ctl", 60, clock=clock, controller="x").acquire()
    lp.StoreLease(shared.backend, OTHER, {"i-2": "h2"}, "op@ctl", 900, clock=clock, controller="x").acquire()
    shared.backend.put("lease#i-4", {"rollout": "20270115T070000Z-gone00"}, None)  # its rollout released
    clock.now = T0 + 120  # the first expired, the second is live
    assert journal.release_dead(shared, None, "i-2", clock.now) == []
    assert journal.release_dead(shared, None, "i-3", clock.now) == []  # nobody holds it
    assert journal.release_dead(shared, None, "i-4", clock.now) == []  # free to any taker already
    assert journal.release_dead(shared, None, "i-1", clock.now) == [
        f"released the lease of rollout {ROLLOUT} (op@ctl) on i-1: its lease had expired"
    ]
    assert [i.key for i in shared.backend.items("lease#")] == ["lease#i-2", "lease#i-4"]
    assert [i.key for i in shared.backend.items("rollout#")] == [f"rollout#{OTHER}"]


# ------------------------------------------------------------------------------ budgets count from the act


def reboot_pass(tmp_path: Path, scan: dict[str, Any], runner: Any, shared: store.Store, clock: Clock) -> Any:
    """A pass over ``shared`` on ``clock`` (a rollout's batches move it) with a reboot budget of 2/h."""
    inputs = auto.PassInputs(
        policy=parse_policy(REBOOT_POLICY, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / "auto",
        apply=True,
        store=shared,
        operator="alice@bastion",
    )
    return auto.run_pass(inputs, runner, lambda text, style: None, clock=clock)


@pytest.mark.parametrize("tell", [True, False])
def test_a_rollout_whose_batches_run_an_hour_apart_spends_each_budget_from_its_act(
    tmp_path: Path, tell: bool
) -> None:
    """The reproduction: a reboot budget of 2/h, a pass whose rollout reboots its canary at T0 and its
    second batch 65 minutes later, a second pass a minute after. Before, both entries were stamped at the
    reservation (T0) and the second pass rebooted two more: three reboots in one hour. Now each counts
    from its batch's start (``tell``), or from when the run returned where the run does not say."""
    clock = Clock(T0)
    shared = memory(clock)
    runner = Batches(clock, gap=65 * 60, tell=tell)
    first = reboot_pass(tmp_path, report(a=[ecc()], b=[ecc()]), runner, shared, clock)
    assert first.exit_code == ExitCode.OK and runner.calls[0][1] == ["a", "b"]
    entries = shared.backend.get("ledger#reboot").doc["entries"]
    assert {e["host"]: (e["at"], e["state"]) for e in entries} == {
        "a": (T0 if tell else T0 + 65 * 60, "done"),
        "b": (T0 + 65 * 60, "done"),
    }
    clock.now += 60
    second = reboot_pass(tmp_path, report(a=[], b=[], c=[ecc()], d=[ecc()], e=[ecc()]), runner, shared, clock)
    assert [c[1] for c in runner.calls[1:]] == ([["c"]] if tell else [])
    assert sum(d.status == "budget" for d in second.decisions) == (2 if tell else 3)
    assert runner.most_in_a_window("reboot", H) <= 2, runner.acts


def test_a_reservation_a_dead_pass_left_counts_from_when_it_is_found(tmp_path: Path) -> None:
    """A pass reserved two reboots at T0 and died mid-rollout (its second batch may have run at any time
    until then). The next pass, 70 minutes later, counts both as spent from now, not from T0, and reboots
    nobody; before, they had left the window and it rebooted two more."""
    clock = Clock(T0)
    shared = memory(clock)
    dead = store.StoredState(shared)
    dead.load()
    dead.mark_seeded("test")
    dead.reserve(
        "auto-dead", "reboot", [(h, "az-a", "gpu-fatal", 0, "gpu_health") for h in "ab"], "ctl:1", T0
    )
    # a dry run first (no lease, no recovery): the reservations count whatever their time
    clock.now = T0 + 70 * 60
    dry = auto.run_pass(
        auto.PassInputs(
            policy=parse_policy(REBOOT_POLICY, "policy.yml"),
            policy_source="policy.yml",
            scan_report=report(c=[ecc()]),
            group_of={"c": "az-a"},
            state_dir=tmp_path / "dry",
            apply=False,
            store=shared,
        ),
        Runner(),
        lambda text, style: None,
        clock=clock,
    )
    assert [d.status for d in dry.decisions] == ["budget"]
    runner = Runner()
    result = reboot_pass(tmp_path, report(a=[], b=[], c=[ecc()], d=[ecc()]), runner, shared, clock)
    assert runner.calls == [] and len(result.recovered) == 2
    entries = shared.backend.get("ledger#reboot").doc["entries"]
    assert {(e["host"], e["at"], e["state"]) for e in entries} == {
        ("a", T0 + 70 * 60, "in_doubt"),
        ("b", T0 + 70 * 60, "in_doubt"),
    }


def test_a_reservation_a_pass_without_the_store_left_is_seeded_as_spent_from_when_it_is_found(
    tmp_path: Path,
) -> None:
    """The upgrade path: the state directory holds two reboots a pass without the store reserved at T0 and
    never settled (SIGKILLed mid-rollout); the first pass with the store, 70 minutes later, seeds them as
    spent from then and reboots nobody."""
    from fleetops.policy import BudgetLedger

    ledger = BudgetLedger()
    for host in "ab":
        ledger.reserve("reboot", host, "az-a", T0, "ctl:1")
    ledger.save(tmp_path / "auto" / auto.LEDGER_FILE)
    clock = Clock(T0 + 70 * 60)
    shared = memory(clock)
    runner = Runner()
    result = reboot_pass(tmp_path, report(c=[ecc()]), runner, shared, clock)
    assert runner.calls == [] and [d.status for d in result.decisions] == ["budget"]
    assert sum("ended before settling it" in w for w in result.warnings) == 2
    entries = shared.backend.get("ledger#reboot").doc["entries"]
    assert sorted((e["host"], e["at"]) for e in entries) == [("a", T0 + 70 * 60), ("b", T0 + 70 * 60)]
