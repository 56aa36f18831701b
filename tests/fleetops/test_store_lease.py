"""The rollout lease in the shared store (the collection's module_utils/lease.py StoreLease, used by the
CLI's Ec2Lease and the ec2_lease module): compare-and-swap over the store's contract in memory, with the
interleavings forced call by call (one taker runs whole between two calls of the other), then against a
real moto_server (DynamoDB for the store, EC2 for the mirror tags; no boto3 mocks; loopback only).

moto_server does not serialise requests, so concurrency is never trusted to find a race: every race
here is a forced interleaving, and the same interleavings with the write condition removed
(MemoryStore(conditional=False)) let two rollouts hold one instance, which is what the condition buys.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.ansible.collection import module_utils
from fleetops.rollout.lease import KEY_PREFIX, Ec2Lease, LeaseApiError, LeaseError
from fleetops_lab.ec2sim import MotoServer, client, launch_many
from tests.fleetops.test_lease import _conn

lp = module_utils("lease")
mu = module_utils("store")
aws = module_utils("aws")
REGION = "us-east-1"
A, B, C = "20260101T000000Z-aaaaaa", "20260101T000001Z-bbbbbb", "20260101T000002Z-cccccc"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class View:
    """One controller's calls on a shared MemoryStore: the same items, with hooks that run another
    controller's whole step just before this one's N-th call (counted over every call)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls = 0
        self.hooks: dict[int, Callable[[], None]] = {}
        self.fail_at: dict[int, Exception] = {}

    @property
    def skew(self) -> float:
        return float(self.store.skew)

    def _before(self) -> None:
        self.calls += 1
        hook = self.hooks.pop(self.calls, None)
        if hook is not None:
            hook()
        if self.calls in self.fail_at:
            raise self.fail_at.pop(self.calls)

    def where(self) -> str:
        return "memory store"

    def ensure(self) -> bool:
        return False

    def get(self, key: str) -> Any:
        self._before()
        return self.store.get(key)

    def put(self, key: str, doc: Any, expect: int | None) -> Any:
        self._before()
        return self.store.put(key, doc, expect)

    def delete(self, key: str, expect: int) -> None:
        self._before()
        self.store.delete(key, expect)

    def transact(self, ops: list[tuple[Any, ...]]) -> list[Any]:
        self._before()
        return list(self.store.transact(ops))

    def items(self, prefix: str) -> list[Any]:
        self._before()
        return list(self.store.items(prefix))


def lease(view: Any, rollout: str, ids: list[str], clock: Clock, ttl: float = 60.0) -> Any:
    targets = {i: f"host-{i}" for i in ids}
    return lp.StoreLease(view, rollout, targets, f"op-{rollout[-1]}@ctl", ttl, clock=clock, controller="test")


def holders(store: Any) -> dict[str, str]:
    """{instance: rollout} as the lease items name them."""
    return {i.key[len(lp.INSTANCE_ITEM) :]: i.doc["rollout"] for i in store.items(lp.INSTANCE_ITEM)}


def live_rollouts(store: Any, now: float) -> set[str]:
    return {
        i.key[len(lp.ROLLOUT_ITEM) :]
        for i in store.items(lp.ROLLOUT_ITEM)
        if lp.rollout_record(i.key[len(lp.ROLLOUT_ITEM) :], i).live(now)
    }


# ------------------------------------------------------------------------------ the protocol, in memory


def test_a_take_refuses_a_second_rollout_which_writes_nothing_and_release_frees_them() -> None:
    store, clock = mu.MemoryStore(), Clock()
    a = lease(View(store), A, ["i-1", "i-2"], clock)
    a.acquire()
    assert holders(store) == {"i-1": A, "i-2": A} and a.expires == T0 + 60
    before = dict(store.data)
    b = lease(View(store), B, ["i-2", "i-3"], clock)
    with pytest.raises(lp.StoreLeaseError, match=r"host-i-2 \(i-2\): rollout .*aaaaaa by op-a@ctl, expires"):
        b.acquire()
    assert store.data == before  # the refused take wrote nothing
    assert sorted(a.release()) == ["i-1", "i-2"]
    assert store.data == {}
    b.acquire()
    assert holders(store) == {"i-2": B, "i-3": B}


def test_a_taker_that_read_before_another_wrote_is_refused_and_keeps_nothing() -> None:
    """Both read the instances free; A takes them whole between B's read and B's first write. B's
    conditional puts are refused, B gives back its rollout item and, reading again, refuses."""
    store, clock = mu.MemoryStore(), Clock()
    a, bv = lease(View(store), A, ["i-1", "i-2"], clock), View(store)
    b = lease(bv, B, ["i-1", "i-2"], clock)
    bv.hooks[3] = a.acquire  # B's calls: 2 scans, then its rollout item's put
    with pytest.raises(lp.StoreLeaseError, match="aaaaaa"):
        b.acquire()
    assert holders(store) == {"i-1": A, "i-2": A}
    assert live_rollouts(store, clock.now) == {A} and store.conflicts >= 1


def test_without_the_write_condition_the_same_interleaving_lets_both_hold_an_instance() -> None:
    """What the condition buys: the interleaving above against a store that ignores it."""
    store, clock = mu.MemoryStore(conditional=False), Clock()
    a, bv = lease(View(store), A, ["i-1", "i-2"], clock), View(store)
    b = lease(bv, B, ["i-1", "i-2"], clock)
    bv.hooks[3] = a.acquire
    b.acquire()  # not refused
    assert a.held and b.held and set(a.held) == set(b.held)  # both believe they hold i-1 and i-2
    assert live_rollouts(store, clock.now) == {A, B}


def _quietly(step: Callable[[], Any]) -> None:
    """Another controller's take, run inside this one's call: its refusal is its own."""
    with contextlib.suppress(lp.StoreLeaseError):
        step()


def _explore(conditional: bool, first: list[str], second: list[str]) -> list[tuple[int, bool, bool]]:
    """Run the first taker whole before each call of the second in turn; after each run, the lease
    items and what each taker believes must agree. ``(point, first held, second held)`` per run."""
    runs = []
    point = 1
    while True:
        store, clock = mu.MemoryStore(conditional=conditional), Clock()
        one, twov = lease(View(store), A, first, clock), View(store)
        two = lease(twov, B, second, clock)
        twov.hooks[point] = lambda one=one: _quietly(one.acquire)
        with contextlib.suppress(lp.StoreLeaseError):
            two.acquire()
        if point > twov.calls:  # the second taker finished before the hook's call: all points seen
            break
        named = holders(store)
        for who in (one, two):
            for instance in who.held:
                assert named.get(instance) == who.rollout, (point, instance, named)
        assert not (set(one.held) & set(two.held)), point
        assert one.held or two.held, point  # sorted order: one of them always wins
        runs.append((point, bool(one.held), bool(two.held)))
        point += 1
    return runs


def test_overlapping_takers_never_share_an_instance_wherever_one_cuts_in() -> None:
    # the second taker's calls: 2 scans, then one transaction (its rollout item, i-2, i-3): all or nothing,
    # so whoever's transaction lands first has every instance it wanted
    runs = _explore(True, ["i-1", "i-2"], ["i-2", "i-3"])
    assert runs == [(1, True, False), (2, True, False), (3, True, False)]
    with pytest.raises(AssertionError):
        _explore(False, ["i-1", "i-2"], ["i-2", "i-3"])  # without the condition the invariant breaks


def test_a_take_larger_than_one_transaction_gives_back_its_first_when_its_second_is_refused() -> None:
    """150 instances take two transactions (at most 100 writes each); another rollout taking i-120 in
    between makes the second one fail: the first is given back, the take read again and refused."""
    many = [f"i-{n:03d}" for n in range(150)]
    runs = _explore(True, ["i-120"], many)
    # the second taker's calls: 2 scans, its first transaction (rollout item + i-000..i-098), its second
    assert runs == [(1, True, False), (2, True, False), (3, True, False), (4, True, False)]
    with pytest.raises(AssertionError):
        _explore(False, ["i-120"], many)


def test_an_expired_lease_is_taken_over_and_its_holder_learns_it_lost_on_renewal() -> None:
    store, clock = mu.MemoryStore(), Clock()
    a = lease(View(store), A, ["i-1", "i-2"], clock)
    a.acquire()
    clock.now += 61  # A's controller hung past its TTL
    b = lease(View(store), B, ["i-2"], clock)
    b.acquire()
    assert b.broken == [f"rollout {A}: its lease had expired"]
    assert holders(store) == {"i-1": A, "i-2": B}
    with pytest.raises(lp.StoreLeaseLost, match="broken or taken over"):
        a.renew()
    assert a.release() == ["i-1"]  # its own leftover; B's instance is left alone
    assert holders(store) == {"i-2": B}


def test_a_live_lease_is_broken_only_when_named() -> None:
    store, clock = mu.MemoryStore(), Clock()
    lease(View(store), A, ["i-1"], clock).acquire()
    with pytest.raises(lp.StoreLeaseError):
        lease(View(store), B, ["i-1"], clock).acquire(break_lock=C)  # names another rollout
    b = lease(View(store), B, ["i-1"], clock)
    b.acquire(break_lock=A)
    assert b.broken == [f"rollout {A}: broken (--break-lock)"] and holders(store) == {"i-1": B}


def test_a_renewal_racing_a_break_one_way_and_the_other() -> None:
    # the break lands between A's decision to renew and its write: A's write is refused, A has lost
    store, clock = mu.MemoryStore(), Clock()
    av = View(store)
    a = lease(av, A, ["i-1"], clock)
    a.acquire()
    c = lease(View(store), C, ["i-1"], clock)
    av.hooks[av.calls + 1] = lambda: c.acquire(break_lock=A)
    with pytest.raises(lp.StoreLeaseLost):
        a.renew()
    assert holders(store) == {"i-1": C}

    # the renewal lands between the breaker's read and its delete: the delete is refused, the breaker
    # reads again and breaks the renewed lease (it was asked to); A's next renewal fails
    store, clock = mu.MemoryStore(), Clock()
    a = lease(View(store), A, ["i-1"], clock)
    a.acquire()
    cv = View(store)
    c = lease(cv, C, ["i-1"], clock)
    cv.hooks[3] = a.renew  # C's calls: 2 scans, then its transaction, which deletes A's item
    c.acquire(break_lock=A)
    assert store.conflicts == 1 and holders(store) == {"i-1": C}
    with pytest.raises(lp.StoreLeaseLost):
        a.renew()


def test_two_takers_of_one_expired_lease_one_wins() -> None:
    store, clock = mu.MemoryStore(), Clock()
    lease(View(store), A, ["i-1", "i-2"], clock).acquire()
    clock.now += 61
    bv = View(store)
    b = lease(bv, B, ["i-1", "i-2"], clock)
    c = lease(View(store), C, ["i-1", "i-2"], clock)
    bv.hooks[3] = c.acquire  # both found A expired; C deletes A's item first
    with pytest.raises(lp.StoreLeaseError, match="cccccc"):
        b.acquire()
    assert holders(store) == {"i-1": C, "i-2": C} and live_rollouts(store, clock.now) == {C}


def test_a_store_failing_midway_gives_back_what_was_taken() -> None:
    store, clock = mu.MemoryStore(), Clock()
    view = View(store)
    a = lease(view, A, [f"i-{n:03d}" for n in range(150)], clock)
    view.fail_at[4] = mu.StoreError("Failed to call dynamodb:TransactWriteItems in us-east-1: Throttling")
    with pytest.raises(mu.StoreError, match="Throttling"):
        a.acquire()  # 2 scans, the first transaction, then the second fails
    assert store.data == {}


def test_unreadable_items_are_kept_and_hold() -> None:
    store, clock = mu.MemoryStore(), Clock()
    store.data["lease#i-1"] = (1, "not json")
    store.data["lease#i-2"] = (1, json.dumps({"rollout": C}))
    store.data["rollout#" + C] = (1, "{truncated")
    with pytest.raises(lp.StoreLeaseError) as refused:
        lease(View(store), A, ["i-1", "i-2"], clock).acquire()
    assert "host-i-1 (i-1): an unreadable lease item" in str(refused.value)
    assert f"rollout {C} (unknown (unreadable lease tag))" in str(refused.value)
    assert store.data["lease#i-1"] == (1, "not json") and store.data["rollout#" + C] == (1, "{truncated")
    taker = lease(View(store), A, ["i-1", "i-2"], clock)
    taker.acquire(break_lock=True)  # a person said: any stale lock
    assert holders(store) == {"i-1": A, "i-2": A} and "rollout#" + C not in store.data


def test_a_signal_during_the_take_gives_back_what_was_taken() -> None:
    """SIGTERM (the CLI raises it in the main thread) between two transactions of the take: nothing stays."""
    store, clock = mu.MemoryStore(), Clock()
    view = View(store)
    a = lease(view, A, [f"i-{n:03d}" for n in range(150)], clock)
    view.fail_at[4] = KeyboardInterrupt()  # after the first transaction
    with pytest.raises(KeyboardInterrupt):
        a.acquire()
    assert store.data == {}


def test_a_controller_whose_clock_is_off_the_store_takes_nothing() -> None:
    store, clock = mu.MemoryStore(), Clock()
    store.skew = 95.0
    with pytest.raises(mu.SkewError, match=r"\+95 s off the store's"):
        lease(View(store), A, ["i-1"], clock).acquire()
    assert store.data == {}


# ------------------------------------------------------------------------------ moto: DynamoDB + EC2 tags


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, list[str]]]:
    server = MotoServer()
    url = server.start()
    try:
        yield url, launch_many(url, REGION, 3)
    finally:
        server.stop()  # SIGINT to its PID


def _cli(
    url: str, ids: list[str], rollout: str, table: str | None, lines: list[str] | None = None
) -> Ec2Lease:
    instances = {f"host-{n}": {"instance": i, "region": REGION} for n, i in enumerate(ids)}
    store = None
    if table is not None:
        store = mu.DynamoStore(_conn(url).settings(), table, REGION)
    say = lines.append if lines is not None else (lambda _line: None)
    return Ec2Lease(_conn(url), instances, rollout, f"op-{rollout[-1]}@ctl", settle=0.2, store=store, say=say)


def _tags(url: str, ids: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {i: set() for i in ids}
    for tag in client(url, REGION).describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])["Tags"]:
        if tag["Key"].startswith(KEY_PREFIX):
            out[tag["ResourceId"]].add(tag["Key"][len(KEY_PREFIX) :])
    return out


def test_the_cli_lease_lives_in_dynamodb_and_the_tags_mirror_it(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    lines: list[str] = []
    a = _cli(url, ids[:2], A, "leases", lines)
    a.acquire()
    table = mu.DynamoStore(_conn(url).settings(), "leases", REGION)
    assert holders(table) == {ids[0]: A, ids[1]: A}
    assert _tags(url, ids[:2]) == {ids[0]: {A}, ids[1]: {A}}  # the mirror, readable by tag-only controllers
    assert any("in the shared store (DynamoDB table leases in us-east-1)" in line for line in lines)
    with pytest.raises(LeaseError, match="aaaaaa"):
        _cli(url, ids[1:], B, "leases").acquire()  # refused by the store
    with pytest.raises(LeaseError, match="aaaaaa"):
        _cli(url, ids[1:], B, None).acquire()  # a controller that uses tags alone sees the mirror
    assert holders(table) == {ids[0]: A, ids[1]: A} and _tags(url, ids) == {
        ids[0]: {A},
        ids[1]: {A},
        ids[2]: set(),
    }
    a.renew()
    assert a.check() is None
    a.release()
    assert holders(table) == {} and _tags(url, ids) == {i: set() for i in ids}


def test_a_broken_holder_s_mirror_tags_go_with_its_items(moto: tuple[str, list[str]]) -> None:
    """--break-lock deletes the holder's rollout item, and its mirror tags with it: the tags a tag-only
    controller (or a person) reads name one holder, the one the store has."""
    url, ids = moto
    a = _cli(url, ids[:2], A, "broken-mirror")
    a.acquire()
    b = _cli(url, ids[1:], B, "broken-mirror")
    try:
        b.acquire(break_lock=A)
        table = mu.DynamoStore(_conn(url).settings(), "broken-mirror", REGION)
        assert holders(table) == {ids[0]: A, ids[1]: B, ids[2]: B}
        assert _tags(url, ids) == {
            ids[0]: {A},
            ids[1]: {B},
            ids[2]: {B},
        }  # A's tag stays only where B took nothing
        a.renew()
        assert a.check() is not None  # fenced: A's item was deleted
    finally:
        b.release()
        a.release()
    assert _tags(url, ids) == {i: set() for i in ids}


def test_a_tag_only_lease_refuses_a_store_take_which_keeps_nothing(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    old = _cli(url, ids[1:], C, None)
    old.acquire()  # a controller not yet upgraded: tags alone
    try:
        with pytest.raises(LeaseError, match="EC2 tags only"):
            _cli(url, ids, A, "leases-2").acquire()
        table = mu.DynamoStore(_conn(url).settings(), "leases-2", REGION)
        assert holders(table) == {} and table.items(lp.ROLLOUT_ITEM) == []
        assert _tags(url, ids) == {ids[0]: set(), ids[1]: {C}, ids[2]: {C}}
    finally:
        old.release()


def test_a_store_that_cannot_be_reached_takes_nothing(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    url, ids = moto
    instances = {"host-0": {"instance": ids[0], "region": REGION}}
    dead = mu.DynamoStore(
        aws.ConnectionSettings(
            endpoint_url="http://127.0.0.1:9", aws_access_key="x", aws_secret_key="y", max_attempts=1
        ),
        "t",
        REGION,
    )
    held = Ec2Lease(_conn(url), instances, A, "op@ctl", store=dead)
    with pytest.raises(LeaseApiError, match="Failed to use the shared store"):
        held.acquire()
    assert _tags(url, ids[:1]) == {ids[0]: set()}


def test_a_live_lease_whose_process_on_this_controller_is_gone_is_taken_over_at_once() -> None:
    """A rollout killed with SIGKILL here holds its lease until its TTL; the next one here need not wait:
    its rollout item names ``host:pid:space`` (fleetops.util.process_id: this machine and PID namespace),
    and that pid is gone. An older fleetops' ``host:pid`` names no namespace: waited out (another container
    with this host name may hold it: tests/fleetops/test_controller_identity.py)."""
    import subprocess

    from fleetops.util import dead_here, process_id

    gone = subprocess.Popen(["true"])
    gone.wait()
    zombie = subprocess.Popen(["true"])  # exited, not yet reaped: dead, though os.kill(pid, 0) succeeds
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    asleep = subprocess.Popen(["sleep", "30"])
    store, clock = mu.MemoryStore(), Clock()
    host, _pid, space = process_id().split(":")
    for controller, taken in (
        (f"{host}:{gone.pid}:{space}", True),
        (f"{host}:{zombie.pid}:{space}", True),
        (f"{host}:{asleep.pid}:{space}", False),
        (process_id(), False),
        (f"elsewhere:{gone.pid}:{space}", False),
        (f"{host}:{gone.pid}", False),  # an older fleetops' holder
        (f"{host}:{gone.pid}:-", False),  # its namespace unknown where it ran
    ):
        store.data.clear()
        a = lp.StoreLease(View(store), A, {"i-1": "h"}, "op@ctl", 600, clock=clock, controller=controller)
        a.acquire()
        b = lp.StoreLease(View(store), B, {"i-1": "h"}, "op@ctl", 600, clock=clock, dead=dead_here)
        if taken:
            b.acquire()
            assert b.broken == [f"rollout {A}: its process on this controller is gone"], controller
            assert holders(store) == {"i-1": B}
        else:  # alive (this process), or on another host: waited out
            with pytest.raises(lp.StoreLeaseError):
                b.acquire()
            assert holders(store) == {"i-1": A}
    asleep.kill()
    asleep.wait()
    zombie.wait()


def test_a_rollout_whose_inventory_names_a_store_holds_its_lease_there_during_every_batch(
    moto: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's lock (fleetops.rollout.locks.locked) reads store_table from the same EC2 source: the
    store's lease items name the rollout while each batch runs, and are gone after it."""
    from fleetops.ansible.runner import PlaybookRun, TaskResult
    from fleetops.rollout.engine import Engine
    from fleetops.rollout.locks import locked
    from fleetops.rollout.state import new_rollout

    url, ids = moto
    table = "rollout-leases"
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inventory = tmp_path / "inv.ec2.yml"
    inventory.write_text(
        f"plugin: fleetops.node.ec2\nendpoint_url: {url}\naws_access_key: testing\n"
        f"aws_secret_key: testing\nregions: [{REGION}]\nstore_table: {table}\n"
    )
    hosts = ["host-0", "host-1"]
    rollout = new_rollout(action="reclaim", apply=True, inventory=[inventory], extravars={},
                          plan={"batches": [hosts[:1], hosts[1:]], "hosts": 2}, max_failures=0,
                          cooldown=0, gate=False, state_path=tmp_path / "state.json")  # fmt: skip
    rollout.lease = {"ttl": 60, "settle": 0.1,
                     "instances": {h: {"instance": ids[i], "region": REGION} for i, h in enumerate(hosts)}}  # fmt: skip
    backend = mu.DynamoStore(_conn(url).settings(), table, REGION)
    seen: list[dict[str, str]] = []

    def runner(batch: Any, extravars: Any, *, check: bool, on_result: Any, cancel: Any) -> Any:
        seen.append(holders(backend))
        run = PlaybookRun(status="successful", rc=0)
        for host in batch:
            run.tasks[host] = [TaskResult(host, "ok", "x", "x", {"changed": True})]
        return run

    lines: list[str] = []
    with locked(rollout, hosts, False, say=lines.append) as held:
        engine = Engine(rollout=rollout, actions=("x",), runner=runner,
                        scanner=lambda hs: {h: {"status": "ok", "findings": []} for h in hs},
                        guard=held.guard, ec2_stop=held.ec2_stop)  # fmt: skip
        engine.run()
    assert seen == [{ids[0]: rollout.id, ids[1]: rollout.id}] * 2
    assert any(f"in the shared store (DynamoDB table {table}" in line for line in lines), lines
    assert holders(backend) == {} and backend.items(lp.ROLLOUT_ITEM) == []


def test_store_status_lists_the_rollouts_leases(moto: tuple[str, list[str]], tmp_path: Path) -> None:
    from fleetops import api

    url, ids = moto
    table = "status-leases"
    inventory = tmp_path / "inv.ec2.yml"
    inventory.write_text(
        f"plugin: fleetops.node.ec2\nendpoint_url: {url}\naws_access_key: testing\n"
        f"aws_secret_key: testing\nregions: [{REGION}]\nstore_table: {table}\n"
    )
    backend = mu.DynamoStore(_conn(url).settings(), table, REGION)
    backend.ensure()
    held = lp.StoreLease(backend, A, {ids[1]: "h1", ids[0]: "h0"}, "alice@bastion", 600)
    held.acquire()
    try:
        result = api.store(api.StoreRequest(inventory=[inventory], verb="status", reason=""))
    finally:
        held.release()
    assert result.exit_code == 0
    line = next(line for line in result.lines if line.startswith("lease: "))
    assert line.startswith(f"lease: rollout {A} by alice@bastion, expires ") and line.endswith(
        f": 2 instance(s) {' '.join(sorted(ids[:2]))}"
    )
    [doc] = result.document["leases"]
    assert doc["rollout"] == A and doc["live"] is True and doc["instances"] == sorted(ids[:2])
    after = api.store(api.StoreRequest(inventory=[inventory], verb="status", reason=""))
    assert after.document["leases"] == [] and not any(line.startswith("lease: ") for line in after.lines)
