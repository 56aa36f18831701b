"""A replace a killed auto pass left half done, finished by the next pass (issue 25): against a real
moto_server (EC2 and Auto Scaling on 127.0.0.1, no boto3 mocks) and the auto pass's store in memory, as
test_store.py's stop-start. The dead pass is a real pass whose rollout is killed mid-batch (the stand-in
runner terminates the instance in its group as the module does, then dies): what it reserved is what
auto.py wrote. The next pass runs from a fresh state directory and sees the old host no more."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetops import auto, store
from fleetops.ansible.collection import load, module_utils
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from fleetops.rollout.lease import Ec2Connection
from fleetops_lab import asg as lab_asg
from fleetops_lab.ec2sim import MotoServer, client, register_ami
from tests.fleetops.test_auto import CRASHLOOP, T0, Runner, ecc, report

mu = module_utils("store")
aws = module_utils("aws")
REGION = "us-east-1"

POLICY_REPLACE = """
schema: fleetops.policy/v1
budgets:
  replace: {window: 1h, max: 5}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: replace, clear_after: 2h}
      - {action: human}
"""


@pytest.fixture(scope="module")
def moto() -> Iterator[dict[str, str]]:
    server = MotoServer()
    url = server.start()
    try:
        ec2 = client(url, REGION)
        image = register_ami(url, REGION)
        vpc = ec2.create_vpc(CidrBlock="10.98.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.98.1.0/24", AvailabilityZone=REGION + "a")[
            "Subnet"
        ]["SubnetId"]
        yield {"url": url, "image": image, "subnet": subnet}
    finally:
        server.stop()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Killed(BaseException):
    """The pass is killed mid-batch (nothing of it runs after)."""


def _group(moto: Mapping[str, str], name: str, size: int = 2) -> list[str]:
    ec2 = client(moto["url"], REGION)
    ids = [
        i["InstanceId"]
        for i in ec2.run_instances(
            ImageId=moto["image"],
            MinCount=size,
            MaxCount=size,
            InstanceType="g5.xlarge",
            SubnetId=moto["subnet"],
        )["Instances"]
    ]
    lab_asg.create_group(moto["url"], ids, max_size=size + 2, name=name, template=f"tpl-{name}")
    return ids


def _members(url: str, name: str) -> list[str]:
    group = client(url, REGION, "autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return sorted(i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"])


def _state(url: str, iid: str) -> str:
    answer = client(url, REGION).describe_instances(InstanceIds=[iid])
    state: str = answer["Reservations"][0]["Instances"][0]["State"]["Name"]
    return state


def _connection(url: str) -> Ec2Connection:
    return Ec2Connection(
        endpoint_url=url,
        aws_access_key="testing",
        aws_secret_key="testing",
        max_attempts=1,
        regions=(REGION,),
    )


def _inputs(
    tmp_path: Path,
    url: str,
    shared: store.Store,
    scan: dict[str, Any],
    instances: Mapping[str, str],
    state: str,
) -> auto.PassInputs:
    return auto.PassInputs(
        policy=parse_policy(POLICY_REPLACE, "policy.yml"),
        policy_source="policy.yml",
        scan_report=scan,
        group_of={h: "az-a" for h in scan["hosts"]},
        state_dir=tmp_path / state,
        apply=True,
        tags={h: auto.TagTarget(iid, REGION, None, None) for h, iid in instances.items()},
        connection=_connection(url),
        store=shared,
        operator="alice@bastion",
    )


def _dead_pass(
    tmp_path: Path, url: str, shared: store.Store, old: str, other: str, terminate: bool
) -> list[dict[str, Any]]:
    """A pass that reserves a replace of gpu-1 (``old``) and is killed in its rollout, after the group was
    told to replace it (``terminate``) or before; the journal as its rollout found it."""
    seen: list[dict[str, Any]] = []

    def dying(action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> auto.ActionRun:
        assert (action, list(hosts)) == ("replace", ["gpu-1"])
        seen.extend(shared.backend.get("ledger#replace").doc["entries"])
        if terminate:  # the module's call: the group launches the replacement at once (moto)
            client(url, REGION, "autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=old, ShouldDecrementDesiredCapacity=False
            )
        raise Killed

    inputs = _inputs(
        tmp_path,
        url,
        shared,
        report(**{"gpu-1": [ecc()], "gpu-2": []}),
        {"gpu-1": old, "gpu-2": other},
        "dead",
    )
    with pytest.raises(Killed):
        auto.run_pass(inputs, dying, lambda text, style: None, clock=shared.clock)
    return seen


def _journal(shared: store.Store) -> dict[str, Any]:
    (entry,) = shared.backend.get("ledger#replace").doc["entries"]
    return dict(entry)


def test_a_replace_a_dead_pass_left_is_finished_once_the_next_pass_scans_its_new_instance_clean(
    tmp_path: Path, moto: dict[str, str]
) -> None:
    url = moto["url"]
    old, other = _group(moto, "g-dead")
    clock = Clock(T0)
    shared = store.Store(mu.MemoryStore(clock=clock), clock=clock)
    seen = _dead_pass(tmp_path, url, shared, old, other, terminate=True)
    # the in-flight record was written before the rollout's first call: the instance, its group and members
    (reserved,) = seen
    assert reserved["state"] == "reserved" and reserved["instance"] == old
    assert reserved["asg"] == "g-dead" and reserved["members"] == sorted([old, other])
    assert _state(url, old) == "terminated"
    (new,) = set(_members(url, "g-dead")) - {other}

    runner = Runner()
    lines: list[str] = []

    def next_pass(scan: dict[str, Any], instances: Mapping[str, str]) -> auto.PassResult:
        clock.now += 600
        lines.clear()
        inputs = _inputs(tmp_path, url, shared, scan, instances, "fresh")
        return auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)

    # the inventory does not list the new instance yet: the group's new instance is found, not yet scanned
    result = next_pass(report(**{"gpu-2": []}), {"gpu-2": other})
    assert result.unfinished == [f"gpu-1 ({old})"] and result.finished == [], lines
    assert result.exit_code == ExitCode.FAILED
    assert any(f"its new instance {new} is not in this pass's scan" in line for line in lines), lines
    journal = _journal(shared)
    assert (
        journal["state"] == "in_doubt" and journal["new_instances"] == [new] and not journal.get("finished")
    )

    # it is listed, but unreachable, then scanned with a warning: still not finished
    result = next_pass(report(**{"gpu-2": [], "gpu-3": "unreachable"}), {"gpu-2": other, "gpu-3": new})
    assert result.unfinished == [f"gpu-1 ({old})"] and result.exit_code == ExitCode.FAILED
    assert any(f"its new instance {new} (gpu-3) is unreachable in this pass's scan" in line for line in lines)
    result = next_pass(report(**{"gpu-2": [], "gpu-3": [CRASHLOOP]}), {"gpu-2": other, "gpu-3": new})
    assert result.unfinished == [f"gpu-1 ({old})"] and result.exit_code == ExitCode.FAILED
    assert any(
        f"scan of its new instance {new} (gpu-3) finds: ecs.service restarts" in line for line in lines
    )
    assert not _journal(shared).get("finished")

    # scanned clean: the rung is done
    result = next_pass(report(**{"gpu-2": [], "gpu-3": []}), {"gpu-2": other, "gpu-3": new})
    assert result.unfinished == [] and result.exit_code == ExitCode.OK, lines
    (line,) = result.finished
    assert line.startswith(f"gpu-1 ({old}): finished the replace a dead pass left half done: ")
    assert f"{new} scanned clean" in line
    journal = _journal(shared)
    assert journal["state"] == "in_doubt" and journal["finished"] is True
    assert shared.backend.get("ladder#gpu-1").doc["rules"]["gpu-fatal"]["action"] == "replace"
    assert runner.calls == []  # nothing else was acted on
    assert _members(url, "g-dead") == sorted([other, new])  # and nothing replaced twice


def test_a_replace_a_dead_pass_never_started_is_finished_at_once(
    tmp_path: Path, moto: dict[str, str]
) -> None:
    """Killed before its first call: the instance is InService and Healthy; the rung counts as tried
    (in_doubt), nothing is waited for or scanned."""
    url = moto["url"]
    old, other = _group(moto, "g-never")
    clock = Clock(T0)
    shared = store.Store(mu.MemoryStore(clock=clock), clock=clock)
    _dead_pass(tmp_path, url, shared, old, other, terminate=False)
    clock.now += 600
    lines: list[str] = []
    inputs = _inputs(tmp_path, url, shared, report(**{"gpu-2": []}), {"gpu-2": other}, "fresh")
    result = auto.run_pass(inputs, Runner(), lambda text, style: lines.append(text), clock=clock)
    assert result.unfinished == [] and result.exit_code == ExitCode.OK, lines
    assert result.finished == [
        f"gpu-1 ({old}): finished the replace a dead pass left half done: the replace never started: "
        f"{old} is InService and Healthy in group g-never"
    ]
    journal = _journal(shared)
    assert journal["state"] == "in_doubt" and journal["finished"] is True and "new_instances" not in journal
    assert _members(url, "g-never") == sorted([old, other]) and _state(url, old) == "running"


def test_finish_instance_times_out_in_one_line_on_a_group_that_does_not_settle(moto: dict[str, str]) -> None:
    """Marked Unhealthy (moto only records it: nothing replaces it): the wait ends at its timeout."""
    url = moto["url"]
    old, other = _group(moto, "g-stuck")
    module = load("plugins.modules.ec2_asg_replace")
    settings = aws.ConnectionSettings(
        endpoint_url=url, aws_access_key="testing", aws_secret_key="testing", max_attempts=1
    )
    record = {"instance": old, "region": REGION, **module.in_flight_record(settings, REGION, old)}
    assert record["asg"] == "g-stuck" and record["members"] == sorted([old, other])
    client(url, REGION, "autoscaling").set_instance_health(InstanceId=old, HealthStatus="Unhealthy")
    with pytest.raises(module.ReplaceError) as caught:
        module.finish_instance(settings, record, timeout=1, poll_interval=0.2)
    assert str(caught.value) == (
        f"group g-stuck is not back at its desired capacity within 1 s: {old} still in the group "
        "(InService, Unhealthy)"
    )


def test_no_in_flight_record_no_replace(tmp_path: Path) -> None:
    """EC2 cannot be read before the batch (nothing listens): a later pass could not finish the replace,
    so it does not start, nothing is reserved, and the pass fails (exit 3)."""
    from fleetops_lab.ec2sim import free_port

    clock = Clock(T0)
    shared = store.Store(mu.MemoryStore(clock=clock), clock=clock)
    runner = Runner()
    inputs = _inputs(
        tmp_path,
        f"http://127.0.0.1:{free_port()}",
        shared,
        report(**{"gpu-1": [ecc()], "gpu-2": []}),
        {"gpu-1": "i-0123456789abcdef0", "gpu-2": "i-0fedcba9876543210"},
        "auto",
    )
    result = auto.run_pass(inputs, runner, lambda text, style: None, clock=clock)
    assert runner.calls == [] and result.exit_code == ExitCode.FAILED
    assert (result.store_failure or "").startswith(
        "replace: could not read what a later pass would need to finish it: "
    ), result.store_failure
    assert "\n" not in (result.store_failure or "")
    assert shared.backend.get("ledger#replace") is None  # nothing reserved, no budget spent
