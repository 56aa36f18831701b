"""The kill switch (issue 14): stop files on real disk (links planted where an attacker would put
them), and the EC2 stop tag against a real moto_server on 127.0.0.1 (no boto3 mocks)."""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.errors import UsageError
from fleetops.rollout import killswitch
from fleetops.rollout.killswitch import (
    ALL_FILE,
    MALFORMED_FILE,
    MALFORMED_TAG,
    SCHEMA,
    STOP_TAG,
    KillSwitchError,
    StopRequest,
    clear_stop,
    clear_stop_ec2,
    leased_instances,
    parse_stop_tag,
    pending_stop,
    pending_stop_ec2,
    request_stop,
    request_stop_ec2,
    stop_dir,
    stop_tag_value,
)
from fleetops.rollout.lease import KEY_PREFIX
from fleetops.values import CAUSE_MAX
from fleetops_lab.ec2sim import MotoServer, client, launch_many

A, B = "20261201T100000Z-aaaaaa", "20261201T100500Z-bbbbbb"
T0 = 1_795_000_000.0  # a run started here; stops below are requested after it unless said


@pytest.fixture
def stops(tmp_path: Path) -> Path:
    return tmp_path / "state" / "stops"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --------------------------------------------------------------------------------------- local files


def test_request_and_pending_stop_of_one_rollout(stops: Path) -> None:
    path = request_stop(A, "wrong AMI\non the\tgpu fleet", "alice@bastion", directory=stops, now=T0 + 10)
    assert path == stops / f"stop-{A}.json"
    assert _mode(stops) == 0o700 and _mode(path) == 0o600
    record = json.loads(path.read_text())
    assert record == {
        "schema": SCHEMA,
        "rollout": A,
        "operator": "alice@bastion",
        "requested": T0 + 10,
        "requested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + 10)),
        "reason": "wrong AMI on the gpu fleet",
    }
    got = pending_stop(A, T0, directory=stops)
    assert got == StopRequest(A, "alice@bastion", T0 + 10, "wrong AMI on the gpu fleet", str(path))
    assert got.describe() == (
        f"stopped by alice@bastion at {record['requested_at']} (fleetops stop {A}; {path}): wrong AMI on the gpu fleet"
    )
    assert pending_stop(B, T0, directory=stops) is None  # another rollout: not its stop
    assert pending_stop(A, T0 + 11, directory=stops) is None  # a run started after the stop: not stopped
    assert pending_stop(A, T0 + 10, directory=stops) is not None  # requested at the very start: stopped
    assert [p.name for p in stops.iterdir()] == [path.name]  # no temporary file left behind


def test_stop_all_stops_only_the_rollouts_running_then(stops: Path) -> None:
    path = request_stop(None, "", "bob@ctl", directory=stops, now=T0 + 5)
    assert path.name == ALL_FILE
    for rid in (A, B):
        got = pending_stop(rid, T0, directory=stops)
        assert got is not None and got.rollout is None and got.reason == "no reason given"
        assert "(fleetops stop --all;" in got.describe()
    assert pending_stop(A, T0 + 6, directory=stops) is None  # started after: ignores it
    # its own stop comes first
    request_stop(A, "mine", "carol@ctl", directory=stops, now=T0 + 7)
    own = pending_stop(A, T0, directory=stops)
    assert own is not None and own.rollout == A and own.operator == "carol@ctl"


def test_clear_stop_removes_only_its_own(stops: Path) -> None:
    assert clear_stop(A, directory=stops) is False  # no directory yet
    request_stop(A, "x", "op", directory=stops, now=T0 + 1)
    request_stop(B, "x", "op", directory=stops, now=T0 + 1)
    request_stop(None, "x", "op", directory=stops, now=T0 + 1)
    assert clear_stop(A, directory=stops) is True
    assert clear_stop(A, directory=stops) is False
    assert sorted(p.name for p in stops.iterdir()) == sorted([ALL_FILE, f"stop-{B}.json"])
    got = pending_stop(A, T0, directory=stops)
    assert got is not None and got.rollout is None  # --all still stops A's run
    assert clear_stop(None, directory=stops) is True
    assert pending_stop(A, T0, directory=stops) is None
    assert [p.name for p in stops.iterdir()] == [f"stop-{B}.json"]


def test_default_directory_is_in_the_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    assert stop_dir() == tmp_path / "home" / "stops"
    path = request_stop(A, "r", "op")
    assert path == tmp_path / "home" / "stops" / f"stop-{A}.json"
    assert pending_stop(A, 0.0) is not None


@pytest.mark.parametrize("bad", ["../x", "all", "", f"{A}\n", "20261201T100000Z-AAAAAA", "x/../../etc"])
def test_rollout_ids_are_checked(stops: Path, bad: str) -> None:
    for call in (
        lambda: request_stop(bad, "r", "op", directory=stops),
        lambda: pending_stop(bad, T0, directory=stops),
        lambda: clear_stop(bad, directory=stops),
    ):
        with pytest.raises(UsageError, match="not a rollout id"):
            call()
    assert not stops.exists() or list(stops.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff garbage",
        b"[1, 2]",
        b'"stop"',
        b"{}",
        json.dumps(
            {"schema": SCHEMA, "rollout": A, "operator": "x", "requested": "soon", "reason": "r"}
        ).encode(),
        b'{"schema": "fleetops.rollout.stop/v1", "rollout": "' + A.encode() + b'", "operator": "x", '
        b'"requested": NaN, "reason": "r"}',
        json.dumps(
            {"schema": "other/v1", "rollout": A, "operator": "x", "requested": T0 + 1, "reason": "r"}
        ).encode(),
        json.dumps(
            {"schema": SCHEMA, "rollout": B, "operator": "x", "requested": T0 + 1, "reason": "r"}
        ).encode(),
        json.dumps(
            {"schema": SCHEMA, "rollout": A, "operator": 7, "requested": T0 + 1, "reason": "r"}
        ).encode(),
        b"{" * 70_000,
    ],
)
def test_a_malformed_stop_file_still_stops(stops: Path, content: bytes) -> None:
    stops.mkdir(parents=True, mode=0o700)
    path = stops / f"stop-{A}.json"
    path.write_bytes(content)
    os.utime(path, (T0 + 3, T0 + 3))
    got = pending_stop(A, T0, directory=stops)
    assert got is not None
    assert (got.rollout, got.operator, got.requested, got.reason) == (A, "unknown", T0 + 3, MALFORMED_FILE)
    # its time is its mtime: a run started after it is not stopped by it
    assert pending_stop(A, T0 + 4, directory=stops) is None


def test_a_fifo_or_a_link_is_a_stop_and_is_never_followed_or_blocks(stops: Path, tmp_path: Path) -> None:
    stops.mkdir(parents=True, mode=0o700)
    os.mkfifo(stops / f"stop-{A}.json")  # a reader that opened it blocking would hang here
    got = pending_stop(A, 0.0, directory=stops)
    assert got is not None and got.reason == MALFORMED_FILE
    # a link to a well-formed stop request of someone else: not read (operator unknown), still a stop
    elsewhere = request_stop(B, "decoy", "mallory@x", directory=tmp_path / "other", now=T0 + 1)
    (stops / f"stop-{B}.json").symlink_to(elsewhere)
    got = pending_stop(B, 0.0, directory=stops)
    assert got is not None and got.operator == "unknown" and got.reason.startswith(MALFORMED_FILE)
    assert "mallory" not in got.describe() and "decoy" not in got.describe()


def test_a_link_planted_at_the_target_is_replaced_not_followed(stops: Path, tmp_path: Path) -> None:
    stops.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = stops / f"stop-{A}.json"
    target.symlink_to(victim)
    path = request_stop(A, "r", "op", directory=stops, now=T0 + 1)
    assert victim.read_text() == "precious\n"
    assert path == target and stat.S_ISREG(os.lstat(target).st_mode) and _mode(target) == 0o600
    assert json.loads(target.read_text())["reason"] == "r"
    # and clearing removes the stop file itself, never what a link points to
    target.unlink()
    target.symlink_to(victim)
    assert clear_stop(A, directory=stops) is True
    assert victim.read_text() == "precious\n" and not os.path.lexists(target)


def test_a_link_planted_at_the_temporary_name_is_not_followed(stops: Path, tmp_path: Path) -> None:
    stops.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    dangling = tmp_path / "would-be-created"
    # the first temporary names request_stop tries (its own pid), for both files it writes below
    (stops / f".stop-{A}.json.{os.getpid()}.tmp").symlink_to(victim)
    (stops / f".{ALL_FILE}.{os.getpid()}.tmp").symlink_to(dangling)
    request_stop(A, "r", "op", directory=stops, now=T0 + 1)
    request_stop(None, "r", "op", directory=stops, now=T0 + 1)
    assert victim.read_text() == "precious\n"
    assert not os.path.lexists(dangling)
    assert pending_stop(A, T0, directory=stops) == StopRequest(
        A, "op", T0 + 1, "r", str(stops / f"stop-{A}.json")
    )
    names = sorted(p.name for p in stops.iterdir())
    assert names == sorted([ALL_FILE, f"stop-{A}.json", f".stop-{A}.json.{os.getpid()}.tmp",
                            f".{ALL_FILE}.{os.getpid()}.tmp"])  # fmt: skip  # the planted links stay, untouched
    assert os.readlink(stops / f".stop-{A}.json.{os.getpid()}.tmp") == str(victim)


def test_the_stop_directory_must_not_be_a_link(stops: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    stops.parent.mkdir(parents=True)
    stops.symlink_to(real, target_is_directory=True)
    with pytest.raises(KillSwitchError, match="Failed to open the stop directory") as refused:
        request_stop(A, "r", "op", directory=stops)
    assert "\n" not in str(refused.value)
    assert list(real.iterdir()) == []
    got = pending_stop(A, T0, directory=stops)  # a tampered stop directory reads as a stop
    assert got is not None and got.reason.startswith(MALFORMED_FILE) and math.isinf(got.requested)


def test_a_loose_stop_directory_is_tightened(stops: Path) -> None:
    stops.mkdir(parents=True, mode=0o755)
    os.chmod(stops, 0o777)
    request_stop(A, "r", "op", directory=stops)
    assert _mode(stops) == 0o700


def test_reason_and_operator_are_one_bounded_line(stops: Path) -> None:
    request_stop(A, "x\x1b[31m" + "y" * 2000, "op\nerator", directory=stops, now=T0 + 1)
    got = pending_stop(A, T0, directory=stops)
    assert got is not None and got.operator == "op erator"
    # the library's own bound for a caller that did not check (the CLI refuses such a reason: test_cli_reason)
    assert got.reason.startswith("x [31my") and len(got.reason) == CAUSE_MAX and got.reason.endswith("…")
    assert "\n" not in got.describe() and "\x1b" not in got.describe()


# --------------------------------------------------------------------------------------- EC2 tags

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, list[str]]]:
    server = MotoServer()
    url = server.start()
    try:
        yield url, launch_many(url, REGION, 4)
    finally:
        server.stop()  # SIGINT to its PID


@pytest.fixture
def ec2(moto: tuple[str, list[str]]) -> Iterator[tuple[Any, list[str]]]:
    url, ids = moto
    ec2 = client(url, REGION)
    yield ec2, ids
    for tag in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])["Tags"]:
        ec2.delete_tags(Resources=[tag["ResourceId"]], Tags=[{"Key": tag["Key"]}])


def _stop_tags(ec2: Any, ids: list[str]) -> dict[str, str]:
    answer = ec2.describe_tags(
        Filters=[{"Name": "resource-id", "Values": ids}, {"Name": "key", "Values": [STOP_TAG]}]
    )
    return {t["ResourceId"]: t["Value"] for t in answer["Tags"]}


def _lease(ec2: Any, ids: list[str], rollout: str) -> None:
    value = '{"operator":"x@y","since":"2026-12-01T10:00:00Z","expires":"2026-12-01T10:15:00Z"}'
    ec2.create_tags(Resources=ids, Tags=[{"Key": KEY_PREFIX + rollout, "Value": value}])


def test_ec2_stop_reaches_the_instances_of_the_rollout(ec2: tuple[Any, list[str]]) -> None:
    client_, ids = ec2
    _lease(client_, ids[:2], A)
    _lease(client_, ids[2:3], B)
    assert leased_instances(client_, A) == sorted(ids[:2])
    assert leased_instances(client_, None) == sorted(ids[:3])
    calls: list[str] = []

    def call(operation: str, func: Any) -> Any:
        calls.append(operation)
        return func()

    wrote = request_stop_ec2(client_, A, "bad kernel", "alice@laptop", now=T0 + 60, call=call)
    assert wrote.instances == tuple(sorted(ids[:2]))
    assert calls == ["DescribeTags", "CreateTags"]
    tags = _stop_tags(client_, ids)
    assert set(tags) == set(ids[:2]) and tags[ids[0]] == wrote.value
    assert json.loads(wrote.value) == {
        "rollout": A,
        "operator": "alice@laptop",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + 60)),
        "reason": "bad kernel",
    }
    # another controller, running A since T0, reads it before its next batch
    got = pending_stop_ec2(client_, ids[:2], A, T0)
    assert got is not None and (got.rollout, got.operator, got.reason) == (A, "alice@laptop", "bad kernel")
    assert (
        got.requested == T0 + 60
        and got.raw == wrote.value
        and got.source.startswith(f"EC2 tag {STOP_TAG} on i-")
    )
    assert pending_stop_ec2(client_, ids[2:3], B, T0) is None  # B's instance: untouched
    assert pending_stop_ec2(client_, ids[:2], B, T0) is None  # names A: not B's stop
    # a run of A that started long after (beyond the clock skew allowance) is not stopped by it
    assert pending_stop_ec2(client_, ids[:2], A, T0 + 60 + 301) is None
    assert pending_stop_ec2(client_, ids[:2], A, T0 + 60 + 299) is not None
    # honoured: removed where it still has this value
    clear_stop_ec2(client_, ids[:2], got)
    assert _stop_tags(client_, ids) == {}


def test_ec2_stop_all_and_a_newer_stop_survives_clearing_an_older(ec2: tuple[Any, list[str]]) -> None:
    client_, ids = ec2
    _lease(client_, ids[:2], A)
    _lease(client_, ids[2:], B)
    wrote = request_stop_ec2(client_, None, "freeze", "ops@awx", now=T0 + 10)
    assert wrote.instances == tuple(sorted(ids))
    for rid, mine in ((A, ids[:2]), (B, ids[2:])):
        got = pending_stop_ec2(client_, mine, rid, T0)
        assert got is not None and got.rollout is None and got.reason == "freeze"
    old = pending_stop_ec2(client_, ids[:2], A, T0)
    assert old is not None
    request_stop_ec2(client_, A, "newer", "bob@x", ids[:1], now=T0 + 20)
    clear_stop_ec2(client_, ids, old)  # removes the --all tag only where it is still that value
    tags = _stop_tags(client_, ids)
    assert set(tags) == {ids[0]} and json.loads(tags[ids[0]])["reason"] == "newer"
    none = request_stop_ec2(client_, "20261201T000000Z-cccccc", "r", "op")
    assert none.instances == ()  # no instance holds that rollout's lease: nothing written


def test_ec2_a_malformed_stop_tag_stops_every_rollout_there(ec2: tuple[Any, list[str]]) -> None:
    client_, ids = ec2
    client_.create_tags(Resources=ids[:1], Tags=[{"Key": STOP_TAG, "Value": "please stop"}])
    got = pending_stop_ec2(client_, ids, A, T0 + 10**6)
    assert got is not None and got.reason == MALFORMED_TAG and got.raw == "please stop"
    assert "an unknown time" in got.describe()
    clear_stop_ec2(client_, ids, got)
    assert pending_stop_ec2(client_, ids, A, 0.0) is None


def test_ec2_tag_value_fits_256_characters_as_json(ec2: tuple[Any, list[str]]) -> None:
    client_, ids = ec2
    who = "o" * 300 + "@" + "h" * 300
    for reason in ("r" * 1000, '"\\' * 300, "ü" * 400, "line\nbreak\x00" * 50, ""):
        value = stop_tag_value(A, reason, who, T0)
        assert len(value) <= 256
        record = json.loads(value)
        assert (
            record["rollout"] == A and record["operator"].startswith("ooo") and len(record["operator"]) <= 64
        )
        assert "\n" not in record["reason"] and "\x00" not in record["reason"]
        if reason:
            assert record["reason"][0] == reason[0] and record["reason"].endswith("…")
        wrote = request_stop_ec2(client_, A, reason, who, ids[:1], now=T0)  # EC2 accepts it
        got = pending_stop_ec2(client_, ids[:1], A, T0)
        assert got is not None and got.raw == wrote.value and got.reason == (record["reason"])
    assert parse_stop_tag(stop_tag_value(None, "x", "op", T0), "s").rollout is None


@pytest.mark.parametrize(
    "value",
    [
        "",
        "{}",
        '{"rollout":"*","operator":"x","at":"yesterday","reason":"r"}',
        '{"rollout":"../x","operator":"x","at":"2026-12-01T00:00:00Z","reason":"r"}',
        '{"rollout":"*","operator":["x"],"at":"2026-12-01T00:00:00Z","reason":"r"}',
        "[1]",
    ],
)
def test_parse_stop_tag_malformed(value: str) -> None:
    got = parse_stop_tag(value, "src")
    assert (got.rollout, got.reason, got.raw) == (None, MALFORMED_TAG, value)
    assert got.applies_to(A, T0 + 10**9)


# ---- the wiring: `fleetops stop` (a real subprocess) and the engine's EC2 channel against moto_server


def test_fleetops_stop_cli_writes_the_request_a_running_rollout_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import fleetops

    home = tmp_path / "home"
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(home))
    rid = "20261201T120000Z-abcdef"
    since = time.time() - 1
    result = fleetops("stop", rid, "--reason", "wrong AMI", env={"FLEETOPS_STATE_DIR": str(home)})
    assert result.rc == 0, result.stderr
    assert f"stop requested for {rid} by " in result.stderr
    request = killswitch.pending_stop(rid, since)
    assert request is not None and request.reason == "wrong AMI"
    assert killswitch.pending_stop("20261201T120000Z-000000", since) is None  # another rollout: not this one
    for bad, why in (
        ([], "needs a ROLLOUT id or --all"),
        ([rid, "--all"], "not both"),
        (["nope"], "not a rollout id"),
    ):
        res = fleetops("stop", *bad, env={"FLEETOPS_STATE_DIR": str(home)})
        assert res.rc == 2 and why in res.stderr, res.stderr
    res = fleetops("stop", "--all", "--reason", "freeze", env={"FLEETOPS_STATE_DIR": str(home)})
    assert res.rc == 0 and killswitch.pending_stop("20261201T120000Z-000000", since) is not None
    res = fleetops("stop", "--all", "--clear", env={"FLEETOPS_STATE_DIR": str(home)})
    assert res.rc == 0 and "removed" in res.stderr
    assert killswitch.pending_stop("20261201T120000Z-000000", since) is None


def test_the_engine_reads_the_ec2_stop_tag_of_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout holding an EC2 lease (moto_server) is stopped by a fleetops:stop tag another
    controller wrote on its instances, after its current batch; its own tag is then removed."""
    from fleetops.rollout.engine import Engine
    from fleetops.rollout.lease import Ec2Connection, Ec2Lease
    from fleetops.rollout.locks import _ec2_stop
    from tests.fleetops.test_rollout import ScriptedRunner, _rollout, fake_scanner

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    server = MotoServer()
    url = server.start()
    try:
        ids = launch_many(url, "us-east-1", 3)
        conn = Ec2Connection(
            endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", regions=("us-east-1",)
        )
        rollout = _rollout(tmp_path, [["h0"], ["h1"], ["h2"]])
        instances = {f"h{i}": {"instance": iid, "region": "us-east-1"} for i, iid in enumerate(ids)}
        lease = Ec2Lease(conn, instances, rollout.id, "op@ctl", settle=0.2)
        lease.acquire()
        ec2 = client(url, "us-east-1")
        runner = ScriptedRunner()
        runner.rollout = rollout

        def other_controller(n: int) -> None:
            if n == 2:  # a stop for this rollout, from elsewhere: only the EC2 tag
                killswitch.request_stop_ec2(ec2, rollout.id, "bad kernel", "dave@other-ctl", ids[:1])

        runner.on_batch = other_controller
        engine = Engine(rollout=rollout, actions=("x",), runner=runner, scanner=fake_scanner,
                        ec2_stop=_ec2_stop(lease, rollout.id))  # fmt: skip
        result = engine.run()
        assert runner.batches == [["h0"], ["h1"]] and result.hosts["h2"] == "pending"
        assert result.stopped is not None
        assert (
            "stopped by dave@other-ctl" in result.stopped["reason"]
            and "bad kernel" in result.stopped["reason"]
        )
        assert f"EC2 tag fleetops:stop on {ids[0]}" in result.stopped["reason"]
        tags = ec2.describe_tags(Filters=[{"Name": "key", "Values": [killswitch.STOP_TAG]}])["Tags"]
        assert tags == []  # honoured: our own stop tag removed
        lease.release()
    finally:
        server.stop()
