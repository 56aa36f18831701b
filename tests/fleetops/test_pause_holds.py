"""A pause holds everything (issue 38, item 3): while the shared store is paused, a pass finishes nothing a
dead pass left in flight (a stop-start's stopped instance stays stopped, the finisher is not called) and
says what it would finish; the host still counts against its group's floor. Against a real moto_server
EC2 (no boto3 mocks) and the pass's store in memory, as test_store.py's stop-start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops import auto
from fleetops.exitcodes import ExitCode
from fleetops.policy import parse_policy
from fleetops.rollout.lease import Ec2Connection
from fleetops_lab.ec2sim import MotoServer, client, launch_many
from tests.fleetops.test_auto import T0, Clock, Runner, report
from tests.fleetops.test_store import left_by_a_dead_pass, memory

REGION = "us-east-1"

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


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def _instance_state(url: str, iid: str) -> str:
    answer = client(url, REGION).describe_instances(InstanceIds=[iid])
    state: str = answer["Reservations"][0]["Instances"][0]["State"]["Name"]
    return state


def test_a_paused_pass_does_not_start_a_dead_passs_stopped_instance_and_says_what_it_would_finish(
    tmp_path: Path, moto_url: str
) -> None:
    """A dead pass stopped lab-01's instance and never started it; automation is paused. The next pass
    (apply) starts nothing — the instance stays stopped, no action runs — says what it would finish,
    exits 5 (paused), and the journal still holds the entry, unfinished. Once unpaused, a pass finishes it."""
    stopped, _other = launch_many(moto_url, REGION, 2, zones=("a",))
    client(moto_url, REGION).stop_instances(InstanceIds=[stopped])
    clock = Clock(T0)
    shared = memory(clock)
    left_by_a_dead_pass(shared, T0, stopped)
    shared.pause("bob@bastion", "incident 42: keep the fleet as it is")
    inputs = auto.PassInputs(
        policy=parse_policy(POLICY_STOP_START, "policy.yml"),
        policy_source="policy.yml",
        scan_report=report(**{"lab-02": []}),
        group_of={"lab-02": "az-a"},
        state_dir=tmp_path / "fresh",
        apply=True,
        connection=Ec2Connection(
            endpoint_url=moto_url,
            aws_access_key="testing",
            aws_secret_key="testing",
            max_attempts=1,
            regions=(REGION,),
        ),
        store=shared,
        operator="alice@bastion",
    )
    runner = Runner()
    lines: list[str] = []
    clock.now = T0 + 600
    result = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)
    assert _instance_state(moto_url, stopped) == "stopped", lines
    assert runner.calls == [] and result.finished == [] and result.unfinished == []
    would = f"lab-01 ({stopped}): the stop-start a dead pass left half done would be finished once automation is unpaused"
    assert would in lines and result.would_finish == [would]
    assert result.exit_code == ExitCode.PAUSED
    assert result.document()["store"]["would_finish"] == [would]
    journal = shared.backend.get("ledger#stop-start").doc["entries"][0]
    assert journal["state"] == "in_doubt" and not journal.get("finished")
    # unpaused, the next pass finishes it
    shared.unpause("bob@bastion", "incident over")
    after = auto.run_pass(inputs, runner, lambda text, style: lines.append(text), clock=clock)
    assert _instance_state(moto_url, stopped) == "running", lines
    assert len(after.finished) == 1 and after.would_finish == [] and after.exit_code == ExitCode.OK
