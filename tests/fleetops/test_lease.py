"""The EC2 tag lease against a real moto_server on 127.0.0.1 (no boto3 mocks; loopback only).

moto_server is a real HTTP EC2 endpoint: CreateTags, DescribeTags and the conditional DeleteTags
(a key given with a value is deleted only while it has that value) behave as on AWS. The lab's
Ec2Proxy sits in front of it to throttle (503 RequestLimitExceeded) for the retry test.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.cli.args import lease_settle, lease_ttl
from fleetops.errors import UsageError
from fleetops.rollout.lease import (
    KEY_PREFIX,
    MAX_TTL_S,
    TAG_VALUE_MAX,
    Ec2Connection,
    Ec2Lease,
    LeaseError,
    connection_for,
    lease_targets,
    validate_ttl,
)
from fleetops_lab.ec2sim import Ec2Proxy, MotoServer, client, launch_many

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, list[str]]]:
    server = MotoServer()
    url = server.start()
    try:
        yield url, launch_many(url, REGION, 3)
    finally:
        server.stop()  # SIGINT to its PID


def _conn(url: str) -> Ec2Connection:
    return Ec2Connection(
        endpoint_url=url,
        aws_access_key="testing",
        aws_secret_key="testing",
        regions=(REGION,),
        max_attempts=5,
        initial_backoff=0.01,
        max_backoff=0.05,
    )


def _lease(url: str, ids: list[str], rollout: str, lines: list[str] | None = None, **kw: Any) -> Ec2Lease:
    instances = {f"host-{i}": {"instance": iid, "region": REGION} for i, iid in enumerate(ids)}
    say = lines.append if lines is not None else (lambda _line: None)
    kw.setdefault("settle", 0.2)
    return Ec2Lease(_conn(url), instances, rollout, f"op-{rollout[-1]}@ctl", say=say, **kw)


def _tags(url: str, ids: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {i: {} for i in ids}
    answer = client(url, REGION).describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])
    for tag in answer["Tags"]:
        if tag["Key"].startswith(KEY_PREFIX):
            out[tag["ResourceId"]][tag["Key"]] = tag["Value"]
    return out


A, B, C = "20260101T000000Z-aaaaaa", "20260101T000001Z-bbbbbb", "20260101T000002Z-cccccc"


def test_lease_is_taken_refuses_a_second_rollout_and_is_removed(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    first = _lease(url, ids, A)
    first.acquire()
    try:
        tags = _tags(url, ids)
        for iid in ids:
            value = json.loads(tags[iid][KEY_PREFIX + A])
            assert value["operator"] == "op-a@ctl" and value["expires"] > value["since"]
        second = _lease(url, ids[1:], B)
        with pytest.raises(LeaseError) as refused:
            second.acquire()
        text = str(refused.value)
        assert "held by another rollout" in text
        assert f"host-0 ({ids[1]}): rollout {A} by op-a@ctl, expires 20" in text  # names holder + expiry
        assert all(KEY_PREFIX + B not in t for t in _tags(url, ids).values())  # refused: wrote nothing
        assert first.check() is None
    finally:
        first.release()
    assert _tags(url, ids) == {i: {} for i in ids}  # cleanup


def test_an_expired_lease_is_taken_over_and_its_holder_knows_it_lost(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    stale = _lease(url, ids, A, ttl=1)
    stale.acquire()
    time.sleep(1.3)
    lines: list[str] = []
    fresh = _lease(url, ids, B, lines)
    fresh.acquire()
    try:
        assert any("taking over the expired lease of rollout " + A in line for line in lines), lines
        assert set(_tags(url, ids)[ids[0]]) == {KEY_PREFIX + B}
        assert stale.check() is not None and "expired" in str(stale.check())
        stale.release()  # removes nothing of B's
        assert set(_tags(url, ids)[ids[0]]) == {KEY_PREFIX + B}
    finally:
        fresh.release()


def test_break_lock_breaks_a_live_lease_only_when_asked_and_only_the_named_one(
    moto: tuple[str, list[str]],
) -> None:
    url, ids = moto
    holder = _lease(url, ids, A)
    holder.acquire()
    try:
        with pytest.raises(LeaseError):
            _lease(url, ids, B).acquire(break_lock=C)  # names another rollout: A's lease stays
        breaker = _lease(url, ids, B)
        breaker.acquire(break_lock=A)
        assert all(set(t) == {KEY_PREFIX + B} for t in _tags(url, ids).values())
        holder.renew()  # the broken holder finds out at its next renewal and stops renewing
        assert holder.check() is not None and "our lease tag is gone" in str(holder.check())
        breaker.release()
        assert _tags(url, ids) == {i: {} for i in ids}
    finally:
        holder.release()


def test_renewal_extends_the_lease_and_release_is_conditional(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    lease = _lease(url, ids[:1], A, ttl=0.9)
    lease.acquire()
    first_expiry = lease.expires
    lease.start()  # renews every 0.3 s
    time.sleep(1.5)  # past the first expiry
    assert lease.check() is None and lease.expires > first_expiry
    # someone rewrote our key meanwhile (e.g. a resumed copy of this rollout): release leaves it.
    # Stop our renewals first, or one landing after that write would overwrite it with our value.
    lease._stop.set()
    assert lease._thread is not None
    lease._thread.join()
    client(url, REGION).create_tags(Resources=ids[:1], Tags=[{"Key": KEY_PREFIX + A, "Value": "theirs"}])
    lease.release()
    assert _tags(url, ids[:1])[ids[0]] == {KEY_PREFIX + A: "theirs"}
    client(url, REGION).delete_tags(Resources=ids[:1], Tags=[{"Key": KEY_PREFIX + A}])


def test_two_rollouts_racing_agree_on_one_winner(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    leases = [_lease(url, ids, A, settle=1.0), _lease(url, ids, B, settle=1.0)]
    errors: dict[str, Exception] = {}

    def take(lease: Ec2Lease) -> None:
        try:
            lease.acquire()
        except LeaseError as exc:
            errors[lease.rollout] = exc

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        # Both read "free", both wrote; after the settle each saw both: exactly one went on.
        assert len(errors) == 1, errors
        (loser,) = errors
        winner = A if loser == B else B
        assert "took it at the same time" in str(errors[loser]) or "held by another rollout" in str(
            errors[loser]
        )
        assert all(set(t) == {KEY_PREFIX + winner} for t in _tags(url, ids).values())
    finally:
        for lease in leases:
            lease.release()


def test_throttled_calls_are_retried(moto: tuple[str, list[str]]) -> None:
    url, ids = moto
    with Ec2Proxy(url, inject_events=False) as proxy:
        proxy.throttle(3, {"DescribeTags", "CreateTags"})
        lease = _lease(proxy.url, ids, A)
        lease.acquire()
        lease.release()
        assert sum(proxy.throttled.values()) == 3
        assert proxy.calls["DeleteTags"] >= 1
    assert _tags(url, ids) == {i: {} for i in ids}


def test_connection_is_resolved_as_the_inventory_plugin_resolves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "prod.fleet_ec2.yml"
    source.write_text(
        "plugin: fleetops.node.ec2\nregions: [eu-west-1]\nec2_url: http://127.0.0.1:1\n"
        "access_key: AK\nsecret_key: SK\nmax_attempts: 3\n"
    )
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    a: {}\n")
    conn = connection_for([tmp_path])  # a folder: its EC2 source is found among the files
    assert conn is not None
    assert (conn.endpoint_url, conn.aws_access_key, conn.aws_secret_key) == ("http://127.0.0.1:1", "AK", "SK")
    assert (conn.max_attempts, conn.initial_backoff, conn.regions) == (3, 0.5, ("eu-west-1",))
    source.write_text("plugin: fleetops.node.ec2\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    conn = connection_for([source])
    assert conn is not None and conn.endpoint_url == "http://127.0.0.1:2"
    assert connection_for([tmp_path / "hosts.yml"]) is None


def test_lease_targets_come_from_ec2_hostvars() -> None:
    from fleetops.ansible.inventory import InventoryHost

    hosts = [
        InventoryHost("a", "us-east-1a", "ec2_az", {"ec2_instance_id": "i-1", "ec2_region": "us-east-1"}),
        InventoryHost("b", None, None, {}),
    ]
    assert lease_targets(hosts) == {"a": {"instance": "i-1", "region": "us-east-1"}}


# operator names: non-ASCII (2-byte, 3-byte, 4-byte UTF-8), and too long for the tag in any script
OPERATORS = {
    "latin": "\u00e9" * 40 + "@bastion",
    "cjk": "\u904b\u7528\u62c5\u5f53\u8005" * 12 + "@\u30b3\u30f3\u30c8\u30ed\u30fc\u30e9\u30fc-01",
    "emoji": "\U0001f600" * 80,
    "long-host": "alice@" + "gpu-bastion-" * 40,
    "long-both": "b" * 300 + "@" + "h" * 300,
    "controls": 'quote"back\\slash\nnew\udcffline@ctl',
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_a_non_ascii_or_long_operator_keeps_the_tag_readable(moto: tuple[str, list[str]], name: str) -> None:
    """The tag stays JSON of at most 256 bytes (so 256 characters however EC2 counts); a second rollout reads it."""
    url, ids = moto
    operator = OPERATORS[name]
    holder = Ec2Lease(_conn(url), {"host-0": {"instance": ids[0], "region": REGION}}, A, operator, settle=0.1)
    holder.acquire()
    try:
        stored = _tags(url, ids[:1])[ids[0]][KEY_PREFIX + A]  # as moto_server keeps it, over real HTTP
        assert stored == holder.value
        assert len(stored.encode("utf-8")) <= TAG_VALUE_MAX
        data = json.loads(stored)
        assert set(data) == {"operator", "since", "expires"}
        shown = data["operator"]
        clean = operator.encode("utf-8", "replace").decode("utf-8")
        if len(json.dumps({"operator": clean}, ensure_ascii=False).encode()) + 50 <= TAG_VALUE_MAX:
            assert shown == clean  # it fits: kept whole
        else:
            assert shown != clean and "\u2026" in shown and len(shown) >= 40  # shortened, still telling
            user, _, host = clean.rpartition("@")
            if "@" in clean:
                assert "@" in shown
                kept_user, _, kept_host = shown.rpartition("@")
                assert user.startswith(kept_user.rstrip("\u2026")) and host.startswith(
                    kept_host.rstrip("\u2026")
                )
        second = Ec2Lease(
            _conn(url), {"host-0": {"instance": ids[0], "region": REGION}}, B, "op-b@ctl", settle=0.1
        )
        with pytest.raises(LeaseError) as refused:
            second.acquire()
        text = str(refused.value)
        assert f"rollout {A} by {shown}, expires 20" in text  # readable: holder and expiry, not "unreadable"
        assert "unreadable" not in text
    finally:
        holder.release()
    assert _tags(url, ids[:1]) == {ids[0]: {}}


def test_lease_ttl_and_settle_are_range_checked_before_anything_is_taken(moto: tuple[str, list[str]]) -> None:
    for bad in (math.nan, math.inf, -math.inf, 0.0, -5.0, 2.0, 1.5, MAX_TTL_S + 1):
        with pytest.raises(UsageError, match="lease TTL must be"):
            validate_ttl(bad, settle=2.0)
    assert (
        validate_ttl(2.5, settle=2.0) == 2.5
        and validate_ttl(900) == 900.0
        and validate_ttl(MAX_TTL_S) == MAX_TTL_S
    )
    for bad_settle in (math.nan, -0.1, math.inf):
        with pytest.raises(UsageError, match="settle time must be"):
            validate_ttl(900, settle=bad_settle)

    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--lease-ttl", type=lease_ttl, default=900.0)
    parser.add_argument("--lease-settle", type=lease_settle, default=2.0)
    assert parser.parse_args(["--lease-ttl", "60", "--lease-settle", "0"]) == argparse.Namespace(
        lease_ttl=60.0, lease_settle=0.0
    )
    for argv in (["--lease-ttl", "nan"], ["--lease-ttl", "inf"], ["--lease-ttl", "-1"], ["--lease-ttl", "x"],
                 ["--lease-settle", "nan"], ["--lease-ttl", "1e9"]):  # fmt: skip
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args(argv)

    url, ids = moto
    with pytest.raises(UsageError):  # refused when made, before any tag is written
        _lease(url, ids, A, ttl=math.nan)
    assert _tags(url, ids) == {i: {} for i in ids}


def test_a_connection_option_that_cannot_work_is_refused_naming_the_source(tmp_path: Path) -> None:
    source = tmp_path / "prod.fleet_ec2.yml"
    source.write_text("plugin: fleetops.node.ec2\nmax_attempts: 0\n")
    with pytest.raises(UsageError) as refused:
        connection_for([source])
    assert (
        str(refused.value)
        == f"Failed to read the EC2 connection of {source}: max_attempts must be at least 1, got 0"
    )
    with pytest.raises(UsageError, match="initial_backoff must not be negative, got nan"):
        Ec2Connection(initial_backoff=math.nan)


# ---- what each batch tells the playbook's lease tasks -----------------------------------------------


class _VarsRunner:
    """A batch runner that records each batch's extra vars and the lease tags on the instances then."""

    def __init__(self, url: str, ids: list[str]) -> None:
        self.url, self.ids = url, ids
        self.seen: list[tuple[dict[str, Any], dict[str, dict[str, str]]]] = []

    def __call__(
        self, hosts: Any, extravars: dict[str, Any], *, check: bool, on_result: Any, cancel: Any
    ) -> Any:
        from fleetops.ansible.runner import PlaybookRun, TaskResult

        self.seen.append((dict(extravars), _tags(self.url, self.ids)))
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            run.tasks[host] = [TaskResult(host, "ok", "x", "x", {"changed": True})]
        return run


@pytest.mark.parametrize("apply", [True, False])
def test_each_batch_tells_the_playbook_to_leave_the_lease_to_the_cli(
    moto: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apply: bool
) -> None:
    """With the lease held (apply, EC2 hosts: the CLI's tag is on the instances while each batch runs) and
    without (a dry run), every batch passes fleetops_lease false, so the playbook never takes a lease of
    its own (which the CLI's would refuse) nor releases one: the CLI's guard checks its lease."""
    from fleetops.rollout.engine import LEASE_VAR, Engine
    from fleetops.rollout.locks import locked
    from fleetops.rollout.state import new_rollout

    url, ids = moto
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "state"))
    inventory = tmp_path / "inv.ec2.yml"
    inventory.write_text(
        f"plugin: fleetops.node.ec2\nendpoint_url: {url}\naws_access_key: testing\n"
        f"aws_secret_key: testing\nregions: [{REGION}]\n"
    )
    hosts = [f"host-{i}" for i in range(2)]
    rollout = new_rollout(action="reclaim", apply=apply, inventory=[inventory], extravars={},
                          plan={"batches": [hosts[:1], hosts[1:]], "hosts": 2}, max_failures=0,
                          cooldown=0, gate=False, state_path=tmp_path / "state.json")  # fmt: skip
    rollout.lease = {"ttl": 60, "settle": 0.1,
                     "instances": {h: {"instance": ids[i], "region": REGION} for i, h in enumerate(hosts)}}  # fmt: skip
    runner = _VarsRunner(url, ids[:2])
    with locked(rollout, hosts, False) as held:
        engine = Engine(rollout=rollout, actions=("x",), runner=runner,
                        scanner=lambda hs: {h: {"status": "ok", "findings": []} for h in hs},
                        guard=held.guard, ec2_stop=held.ec2_stop)  # fmt: skip
        engine.run()
    assert len(runner.seen) == 2
    for extravars, tags in runner.seen:
        assert extravars[LEASE_VAR] is False and "fleetops_lease_rollout" not in extravars
        want = {KEY_PREFIX + rollout.id} if apply else set()
        assert all(set(t) == want for t in tags.values()), tags
    assert all(t == {} for t in _tags(url, ids[:2]).values())  # released after the rollout
