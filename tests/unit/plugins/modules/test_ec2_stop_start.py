"""fleetops.node.ec2_stop_start against a real moto_server on 127.0.0.1, behind the lab's Ec2Proxy
(throttling, the instance-store root moto cannot model, the power hook the lab ties its hosts to).

One moto server and one proxy for the whole module (each test uses instances of its own). The module
runs as Ansible runs it (``ansible localhost -m``, tests.helpers.run_module) for a stop-start, a
check-mode run and a refusal; elsewhere its main() runs in this process (tests.helpers.call_module: the
same module code, arguments and result, without 1.3 CPU-seconds of controller and module start).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.modules import ec2_stop_start

from fleetops_lab.ec2sim import (
    EVENT_TAG,
    ROOT_DEVICE_TAG,
    STOP_SECONDS_TAG,
    Ec2Proxy,
    MotoServer,
    client,
    register_ami,
)
from tests.helpers import ansible_doc, call_module, run_module

REGION = "us-east-1"
MODULE = "fleetops.node.ec2_stop_start"


@dataclass
class Endpoint:
    moto_url: str
    proxy: Ec2Proxy
    image: str
    hooked: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def launch(self, **tags: str) -> str:
        answer = client(self.moto_url, REGION).run_instances(
            ImageId=self.image,
            MinCount=1,
            MaxCount=1,
            InstanceType="p5e.48xlarge",
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ]
            if tags
            else [],
        )
        iid: str = answer["Instances"][0]["InstanceId"]
        return iid

    def state(self, iid: str) -> str:
        answer = client(self.moto_url, REGION).describe_instances(InstanceIds=[iid])
        state: str = answer["Reservations"][0]["Instances"][0]["State"]["Name"]
        return state

    def run(
        self, tmp_path: Path, iid: str, *extra: str, via_ansible: bool = False, **options: Any
    ) -> tuple[int, dict[str, Any]]:
        """The module on ``iid``: its main() in this process (tests.helpers.call_module), or with
        via_ansible as Ansible runs it (``ansible localhost -m``)."""
        args = {
            "instance_id": iid,
            "region": REGION,
            "endpoint_url": self.proxy.url,
            "aws_access_key": "testing",
            "aws_secret_key": "testing",
            "poll_interval": 0.1,
            "initial_backoff": 0.01,
            "max_backoff": 0.05,
            **options,
        }
        self.proxy.reset_counters()
        self.hooked.clear()
        if via_ansible:
            return run_module(tmp_path, MODULE, json.dumps(args), *extra)
        assert set(extra) <= {"--check"}, extra
        return call_module(tmp_path, ec2_stop_start.main, args, check="--check" in extra)


@pytest.fixture(scope="module")
def ec2() -> Iterator[Endpoint]:
    moto = MotoServer()
    url = moto.start()
    endpoint = Endpoint(url, Ec2Proxy(url), register_ami(url, REGION))
    endpoint.proxy.power_hook = lambda phase, iid, tags: endpoint.hooked.append((phase, iid, tags))
    endpoint.proxy.start()
    try:
        yield endpoint
    finally:
        endpoint.proxy.stop()
        moto.stop()


def test_stop_start_a_running_instance(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch(Name="gpu-1")
    rc, result = ec2.run(tmp_path, iid, via_ansible=True)
    assert rc == 0, result
    assert result["changed"] is True
    assert result["actions"] == ["stop", "wait stopped", "start", "wait running"]
    assert result["before"]["state"] == "running" and result["before"]["root_device_type"] == "ebs"
    assert result["after"]["state"] == "running"
    assert result["stop_seconds"] >= 0 and result["start_seconds"] >= 0
    assert ec2.proxy.calls["StopInstances"] == 1 and ec2.proxy.calls["StartInstances"] == 1
    assert ec2.state(iid) == "running"
    # the power hook heard the stop before the start, with the instance's tags
    assert [(phase, i, tags.get("Name")) for phase, i, tags in ec2.hooked] == [
        ("stop", iid, "gpu-1"),
        ("start", iid, "gpu-1"),
    ]


def test_check_mode_only_describes(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch()
    rc, result = ec2.run(tmp_path, iid, "--check", via_ansible=True)
    assert rc == 0, result
    assert result["changed"] is True
    assert result["actions"] == ["stop", "wait stopped", "start", "wait running"]
    assert result["msg"].startswith(f"would stop, wait stopped, start, wait running instance {iid}")
    assert "after" not in result
    assert ec2.proxy.calls["StopInstances"] == 0 and ec2.proxy.calls["StartInstances"] == 0
    assert ec2.hooked == []
    assert ec2.state(iid) == "running"


def test_a_stopped_instance_is_only_started(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch()
    client(ec2.moto_url, REGION).stop_instances(InstanceIds=[iid])
    rc, result = ec2.run(tmp_path, iid)
    assert rc == 0, result
    assert result["before"]["state"] == "stopped"
    assert result["actions"] == ["wait stopped", "start", "wait running"]
    assert ec2.proxy.calls["StopInstances"] == 0 and ec2.proxy.calls["StartInstances"] == 1
    assert ec2.state(iid) == "running"


def test_finish_starts_an_instance_a_killed_run_left_stopped(ec2: Endpoint, tmp_path: Path) -> None:
    """finish=true (a resume's probe): a stopped instance is started, never stopped again."""
    iid = ec2.launch()
    client(ec2.moto_url, REGION).stop_instances(InstanceIds=[iid])
    rc, result = ec2.run(tmp_path, iid, finish=True)
    assert rc == 0, result
    assert result["changed"] is True and result["before"]["state"] == "stopped"
    assert result["actions"] == ["wait stopped", "start", "wait running"]
    assert ec2.proxy.calls["StopInstances"] == 0 and ec2.proxy.calls["StartInstances"] == 1
    assert ec2.state(iid) == "running"


@pytest.mark.parametrize("check", [False, True])
def test_finish_leaves_a_running_instance_alone(ec2: Endpoint, tmp_path: Path, check: bool) -> None:
    iid = ec2.launch()
    rc, result = ec2.run(tmp_path, iid, *(["--check"] if check else []), finish=True)
    assert rc == 0, result
    assert result["changed"] is False and result["actions"] == [], result
    assert result["msg"] == f"instance {iid} is running: no stop-start to finish"
    assert ec2.proxy.calls["StopInstances"] == 0 and ec2.proxy.calls["StartInstances"] == 0
    assert ec2.hooked == [] and ec2.state(iid) == "running"


def test_finish_waits_out_a_slow_stop_then_starts(ec2: Endpoint, tmp_path: Path) -> None:
    """The proxy reports an instance tagged fleetops:stop-seconds=N "stopping" for N s after its stop
    (EC2 is slow, moto is not): finish waits until it is stopped, then starts it."""
    iid = ec2.launch(**{STOP_SECONDS_TAG: "12"})  # past the module's start-up, on a loaded machine too
    proxied = client(ec2.proxy.url, REGION)
    proxied.stop_instances(InstanceIds=[iid])
    seen = proxied.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]
    assert seen == {"Code": 64, "Name": "stopping"} and ec2.state(iid) == "stopped"  # moto: at once
    rc, result = ec2.run(tmp_path, iid, finish=True)
    assert rc == 0, result
    assert result["before"]["state"] == "stopping"
    assert result["actions"] == ["wait stopped", "start", "wait running"]
    assert ec2.proxy.calls["DescribeInstances"] >= 4  # polled while it was stopping, then once running
    assert ec2.proxy.calls["StopInstances"] == 0 and ec2.proxy.calls["StartInstances"] == 1
    assert ec2.state(iid) == "running"


def test_an_instance_store_root_is_refused_before_any_stop(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch(**{ROOT_DEVICE_TAG: "instance-store"})
    rc, result = ec2.run(tmp_path, iid, via_ansible=True)
    assert rc != 0
    assert result["msg"] == (
        f"Failed to stop-start instance {iid}: its root device is instance-store, not EBS: such an instance "
        "cannot be stopped, only terminated (replace it instead)"
    )
    assert result["before"]["root_device_type"] == "instance-store"
    assert ec2.proxy.calls["StopInstances"] == 0
    assert ec2.state(iid) == "running"


def test_a_terminated_instance_is_refused(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch()
    client(ec2.moto_url, REGION).terminate_instances(InstanceIds=[iid])
    rc, result = ec2.run(tmp_path, iid)
    assert rc != 0
    assert result["msg"] == (
        f"Failed to stop-start instance {iid}: it is terminated, not running, stopping or stopped"
    )
    assert ec2.proxy.calls["StartInstances"] == 0


def test_throttling_is_retried(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch()
    ec2.proxy.reset_counters()
    ec2.proxy.throttle(4, {"StopInstances", "StartInstances", "DescribeInstances"})
    args = {
        "instance_id": iid, "region": REGION, "endpoint_url": ec2.proxy.url, "aws_access_key": "testing",
        "aws_secret_key": "testing", "poll_interval": 0.1, "initial_backoff": 0.01, "max_backoff": 0.05,
    }  # fmt: skip
    rc, result = call_module(tmp_path, ec2_stop_start.main, args)
    assert rc == 0, result
    assert sum(ec2.proxy.throttled.values()) == 4
    assert ec2.proxy.calls["StopInstances"] >= 1 and ec2.proxy.calls["StartInstances"] >= 1
    assert result["after"]["state"] == "running"


def test_throttling_past_the_budget_fails_naming_the_call(ec2: Endpoint, tmp_path: Path) -> None:
    iid = ec2.launch()
    ec2.proxy.reset_counters()
    ec2.proxy.throttle(3, {"StopInstances"})
    args = {
        "instance_id": iid, "region": REGION, "endpoint_url": ec2.proxy.url, "aws_access_key": "testing",
        "aws_secret_key": "testing", "poll_interval": 0.1, "initial_backoff": 0.01, "max_backoff": 0.05,
        "max_attempts": 2,
    }  # fmt: skip
    rc, result = call_module(tmp_path, ec2_stop_start.main, args)
    ec2.proxy.throttle(0)
    assert rc != 0
    assert result["msg"] == (
        f"Failed to stop-start instance {iid}: Failed to call ec2:StopInstances in {REGION} after 2 attempts: "
        "RequestLimitExceeded: Request limit exceeded."
    )
    assert result["before"]["state"] == "running" and result["actions"] == []
    assert ec2.state(iid) == "running"


def test_an_unknown_instance_fails_with_the_api_error(ec2: Endpoint, tmp_path: Path) -> None:
    rc, result = ec2.run(tmp_path, "i-00000000000000000")
    assert rc != 0
    assert result["msg"].startswith(
        "Failed to stop-start instance i-00000000000000000: Failed to call ec2:DescribeInstances in us-east-1: "
        "InvalidInstanceID.NotFound"
    ), result["msg"]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"instance_id": "web-1"}, "instance_id 'web-1' is not an EC2 instance id"),
        ({"stop_timeout": 0}, "stop_timeout must be 1 .. 86400 seconds, got 0"),
        ({"start_timeout": 90000}, "start_timeout must be 1 .. 86400 seconds, got 90000"),
        ({"poll_interval": 0.0}, "poll_interval must be above 0 and at most 60 seconds, got 0.0"),
    ],
)
def test_options_are_checked(options: dict[str, Any], problem: str) -> None:
    params = {
        "instance_id": "i-0123456789abcdef0",
        "stop_timeout": 600,
        "start_timeout": 600,
        "poll_interval": 5.0,
    }
    with pytest.raises(ValueError, match="^" + problem.replace(".", r"\.") + "$"):
        ec2_stop_start.check_options({**params, **options})


def test_a_stop_completes_the_scheduled_event(ec2: Endpoint, tmp_path: Path) -> None:
    """What the lab relies on: after a stop-start, the proxy serves no event for the instance (EC2
    completes an instance-retirement event when the instance leaves its hardware)."""
    iid = ec2.launch(**{EVENT_TAG: "instance-retirement"})
    proxied = client(ec2.proxy.url, REGION)

    def events() -> list[str]:
        statuses = proxied.describe_instance_status(InstanceIds=[iid])["InstanceStatuses"]
        return [e["Code"] for s in statuses for e in s.get("Events", [])]

    assert events() == ["instance-retirement"]
    rc, result = ec2.run(tmp_path, iid)
    assert rc == 0, result
    assert events() == []


def test_the_docs_state_the_argument_spec() -> None:
    doc = yaml.safe_load(ec2_stop_start.DOCUMENTATION)
    assert doc["attributes"]["check_mode"]["support"] == "full"
    rendered = ansible_doc(MODULE)
    assert set(rendered["options"]) == set(ec2_stop_start.ARGUMENT_SPEC)
    for name, spec in ec2_stop_start.ARGUMENT_SPEC.items():
        option = rendered["options"][name]
        assert option["type"] == spec["type"], name
        assert option.get("default") == spec.get("default"), name
        assert sorted(option.get("aliases") or []) == sorted(spec.get("aliases") or []), name
    yaml.safe_load(ec2_stop_start.EXAMPLES)
    yaml.safe_load(ec2_stop_start.RETURN)
