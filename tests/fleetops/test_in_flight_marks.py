"""Without a shared store, nothing the next pass must finish lives only in the state directory (issue 38,
item 11; design §5): a disruptive EC2 step in flight is marked on its instance (``fleetops.auto.marks``)
and every pass finds the marks with one filtered DescribeInstances call, whatever its inventory's filters.
Against a real moto_server (no boto3 mocks); the dead pass is a real pass whose rollout stops the
instance as the module does, then dies."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto
from fleetops.auto.marks import IN_FLIGHT_TAG, TAG_VALUE_MAX, decode, encode
from fleetops.exitcodes import ExitCode
from fleetops.policy import LadderState, parse_policy
from fleetops.rollout.lease import Ec2Connection
from fleetops_lab.ec2sim import MotoServer, client, free_port, launch_many
from tests.fleetops.test_auto import T0, Runner, ecc, report, without_floor

REGION = "us-east-1"
POLICY = """
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


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


SIZES = iter(("g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.12xlarge"))


def _launch(url: str, count: int) -> list[str]:
    """``count`` running instances (a launch template of its own each call: the names are unique)."""
    return launch_many(url, REGION, count, instance_type=next(SIZES), zones=("a",))


class Killed(BaseException):
    """The pass is killed mid-batch (nothing of it runs after)."""


def _connection(url: str) -> Ec2Connection:
    return Ec2Connection(
        endpoint_url=url,
        aws_access_key="testing",
        aws_secret_key="testing",
        max_attempts=1,
        regions=(REGION,),
    )


def _inputs(tmp_path: Path, url: str, scan: dict[str, Any], instances: Mapping[str, str], state: str) -> Any:
    return auto.PassInputs(
        policy=without_floor(parse_policy(POLICY, "policy.yml")),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / state,
        apply=True,
        tags={h: auto.TagTarget(iid, REGION, None, None) for h, iid in instances.items()},
        connection=_connection(url),
        operator="alice@bastion",
    )


def _instance(url: str, iid: str) -> dict[str, Any]:
    found: dict[str, Any] = client(url, REGION).describe_instances(InstanceIds=[iid])["Reservations"][0][
        "Instances"
    ][0]
    return found


def _tags(url: str, iid: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in _instance(url, iid).get("Tags") or []}


def _dead_pass(tmp_path: Path, url: str, sick: str, well: str) -> dict[str, str]:
    """A pass without a store that stop-starts lab-01 (``sick``): its rollout stops the instance, then the
    pass is killed; the instance's tags as the rollout found them."""
    seen: dict[str, str] = {}

    def dying(action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
        assert (action, list(hosts)) == ("stop-start", ["lab-01"])
        seen.update(_tags(url, sick))
        client(url, REGION).stop_instances(InstanceIds=[sick])  # the module's stop; its start never comes
        raise Killed

    inputs = _inputs(
        tmp_path, url, report(**{"lab-01": [ecc()], "lab-02": []}), {"lab-01": sick, "lab-02": well}, "dead"
    )
    with pytest.raises(Killed):
        auto.run_pass(inputs, dying, lambda text, style: None, clock=lambda: T0)
    return seen


def test_a_stop_start_a_dead_pass_left_stopped_is_finished_by_a_pass_with_no_state_and_no_store(
    tmp_path: Path, moto_url: str
) -> None:
    """The mark is written before the rollout's first call; the next pass (an empty state directory, an
    inventory of running instances that no longer lists lab-01) finds it, starts the instance, removes
    the mark, and counts the rung as tried and its budget as spent."""
    sick, well = _launch(moto_url, 2)
    seen = _dead_pass(tmp_path, moto_url, sick, well)
    mark = decode(seen)
    assert (mark["host"], mark["action"], mark["rule"], mark["rung"]) == (
        "lab-01",
        "stop-start",
        "gpu-fatal",
        0,
    )
    assert mark["pass"].startswith("auto-") and mark["at"] == T0
    assert _instance(moto_url, sick)["State"]["Name"] == "stopped"

    runner = Runner()
    lines: list[str] = []
    inputs = _inputs(tmp_path, moto_url, report(**{"lab-02": []}), {"lab-02": well}, "fresh")
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=lambda: T0 + 600)
    assert _instance(moto_url, sick)["State"]["Name"] == "running", lines
    assert result.finished and result.finished[0].startswith(f"lab-01 ({sick}): finished the stop-start")
    assert result.unfinished == [] and result.exit_code == ExitCode.OK, lines
    assert runner.calls == []
    assert IN_FLIGHT_TAG not in _tags(moto_url, sick)
    assert result.document()["in_flight"]["finished"] == result.finished
    ladder = LadderState.load(tmp_path / "fresh" / auto.LADDER_FILE)
    rec = ladder.get("lab-01", "gpu-fatal")
    assert rec is not None and rec.action == "stop-start" and rec.last_tried == T0
    spent = json.loads((tmp_path / "fresh" / auto.LEDGER_FILE).read_text())
    assert "lab-01" in json.dumps(spent)
    # said once: where this pass's records live without a store
    notes = [line for line in lines if line.startswith("no shared store: ")]
    assert len(notes) == 1 and "live in one state directory and on the instances" in notes[0], lines
    # and the pass after finds nothing more to finish
    again = auto.run_pass(inputs, runner, lambda text, style: None, clock=lambda: T0 + 900)
    assert again.finished == [] and again.unfinished == []


def test_a_pass_that_settles_its_batch_leaves_no_mark(tmp_path: Path, moto_url: str) -> None:
    """The mark is on the instance while its action runs, and removed when the batch settles."""
    sick, well = _launch(moto_url, 2)
    during: dict[str, str] = {}
    runner = Runner()

    def acting(action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
        during.update(_tags(moto_url, sick))
        return runner(action, hosts, params)

    inputs = _inputs(
        tmp_path, moto_url, report(**{"lab-01": [ecc()], "lab-02": []}), {"lab-01": sick, "lab-02": well}, "s"
    )
    result = auto.run_pass(inputs, acting, lambda text, style: None, clock=lambda: T0)
    assert result.exit_code == ExitCode.OK and runner.calls[0][:2] == ("stop-start", ["lab-01"])
    assert decode(during)["host"] == "lab-01"
    assert IN_FLIGHT_TAG not in _tags(moto_url, sick) and IN_FLIGHT_TAG not in _tags(moto_url, well)


def test_a_mark_its_pass_cannot_finish_is_kept_with_its_cause_and_fails_the_pass(
    tmp_path: Path, moto_url: str
) -> None:
    """A terminated instance cannot be started: the pass fails (exit 3), the mark stays with the attempt
    and its cause, and the next pass tries again."""
    (gone,) = _launch(moto_url, 1)
    record = {"host": "lab-07", "action": "stop-start", "pass": "auto-dead", "at": T0, "rule": "gpu-fatal"}
    client(moto_url, REGION).create_tags(
        Resources=[gone], Tags=[{"Key": k, "Value": v} for k, v in encode(record).items()]
    )
    client(moto_url, REGION).terminate_instances(InstanceIds=[gone])
    inputs = _inputs(tmp_path, moto_url, report(**{"lab-02": []}), {}, "t")
    result = auto.run_pass(inputs, Runner(), lambda text, style: None, clock=lambda: T0 + 600)
    assert result.unfinished == [f"lab-07 ({gone})"] and result.exit_code == ExitCode.FAILED
    kept = decode(_tags(moto_url, gone))
    assert kept["attempts"] == 1 and "failed to finish the stop-start" in kept["cause"]
    again = auto.run_pass(inputs, Runner(), lambda text, style: None, clock=lambda: T0 + 900)
    assert again.unfinished == [f"lab-07 ({gone})"] and decode(_tags(moto_url, gone))["attempts"] == 2
    client(moto_url, REGION).delete_tags(Resources=[gone], Tags=[{"Key": IN_FLIGHT_TAG}])


def test_no_mark_no_stop_start(tmp_path: Path) -> None:
    """EC2 cannot be marked (nothing listens): a later pass could not find the step, so it does not start
    and the pass fails (exit 3)."""
    runner = Runner()
    inputs = _inputs(
        tmp_path,
        f"http://127.0.0.1:{free_port()}",
        report(**{"lab-01": [ecc()], "lab-02": []}),
        {"lab-01": "i-0123456789abcdef0", "lab-02": "i-0fedcba9876543210"},
        "x",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: None, clock=lambda: T0)
    assert runner.calls == [] and result.exit_code == ExitCode.FAILED
    assert any(f"lab-01: Failed to write its tag {IN_FLIGHT_TAG}" in f for f in result.tag_failures), result


def test_a_long_mark_is_split_within_the_tag_limit_and_read_back() -> None:
    """A replace's mark names its group's instances: past 256 characters it goes on in numbered tags."""
    record = {
        "host": "gpu-1",
        "action": "replace",
        "pass": "auto-20270115T080000Z-abcdef",
        "at": T0,
        "asg": "g",
        "members": [f"i-{n:017x}" for n in range(30)],
    }
    tags = encode(record)
    assert len(tags) > 1 and all(len(v) <= TAG_VALUE_MAX for v in tags.values())
    assert list(tags)[:2] == [IN_FLIGHT_TAG, IN_FLIGHT_TAG + ":2"]
    assert decode(tags) == record


def test_the_shipped_awx_configuration_names_a_store_and_creates_its_table() -> None:
    """Every AWX job starts with an empty state directory: the inventory config its passes read names a
    store, and awx/configure.yml creates that table from the same config."""
    import yaml

    from fleetops.store import config_for
    from tests.helpers import REPO

    settings = yaml.safe_load((REPO / "awx" / "settings.yml").read_text())
    inventory = REPO / settings["fleetops_awx_inventory_config"]
    config = config_for([inventory])
    assert config is not None and config.table == "fleetops" and config.region == "us-east-1"
    (play,) = yaml.safe_load((REPO / "awx" / "configure.yml").read_text())
    (task,) = [t for t in play["tasks"] if "store" in t["name"] and "ansible.builtin.command" in t]
    argv = task["ansible.builtin.command"]["argv"]
    assert argv[:4] == ["fleetops", "store", "init", "-i"]
    assert (
        argv[4].endswith("/{{ fleetops_awx_inventory_config }}")
        and settings["fleetops_awx_store_init"] is True
    )
