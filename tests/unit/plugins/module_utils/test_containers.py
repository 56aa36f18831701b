"""crashloop_container: re-created and restarting docker containers (no engine here: see fixtures/docker)."""

from __future__ import annotations

import shutil

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import containers

from tests.localrun import run_command
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "docker"
FIRST = (FIXTURES / "ecs-agent-1.json").read_text()
SECOND = (FIXTURES / "ecs-agent-2.json").read_text()
T1 = containers.parse_timestamp("2026-11-29T15:00:05Z")
T2 = T1 + 10  # type: ignore[operator]


def test_timestamps() -> None:
    assert containers.parse_timestamp("2026-11-29T15:00:00.123456789Z") == pytest.approx(
        containers.parse_timestamp("2026-11-29T15:00:00Z") + 0.123456789  # type: ignore[operator]
    )
    assert containers.parse_timestamp("2026-11-29T16:00:00+01:00") == containers.parse_timestamp(
        "2026-11-29T15:00:00Z"
    )
    assert containers.parse_timestamp("0001-01-01T00:00:00Z") is None
    with pytest.raises(ValueError):
        containers.parse_timestamp("yesterday")


def _facts(text: str, now: float) -> dict[str, object]:
    return {"docker": True, "containers": containers.parse_inspect(text, now), "sampled_at": now}


def test_ecs_agent_recreated_with_restart_count_zero_is_a_loop() -> None:
    grown = containers.add_growth(_facts(FIRST, T1), _facts(SECOND, T2), 10.0)  # type: ignore[arg-type]
    ecs = grown["containers"]["ecs-agent"]
    assert ecs["restart_count"] == 0 and ecs["recreated"] == 1
    assert ecs["restarts_per_min"] == 6.0
    flappy = grown["containers"]["flappy"]
    assert flappy["recreated"] == 0 and flappy["restarts_in_window"] == 2
    findings = {f["data"]["name"]: f for f in containers.evaluate(grown)}
    assert set(findings) == {"ecs-agent", "flappy"}  # the steady one is left alone
    assert findings["ecs-agent"]["severity"] == "critical"
    assert findings["flappy"]["severity"] == "critical"
    assert "amazon/amazon-ecs-agent:latest" in findings["ecs-agent"]["summary"]


def test_one_sample_flags_a_young_exited_container_and_a_restarting_one() -> None:
    facts = _facts(FIRST, containers.parse_timestamp("2026-11-29T15:00:20Z"))  # type: ignore[arg-type]
    findings = {f["data"]["name"]: f for f in containers.evaluate(facts)}
    assert findings["ecs-agent"]["severity"] == "warning"
    assert "created 19.9s ago and already exited (exit 1)" in findings["ecs-agent"]["summary"]
    assert "RestartCount 41" in findings["flappy"]["summary"]
    assert "steady" not in findings


def test_malformed_inspect_output_is_a_detector_error() -> None:
    with pytest.raises(containers.ContainerError, match="Failed to parse docker inspect output"):
        containers.parse_inspect("{not json", 0.0)
    with pytest.raises(containers.ContainerError, match="container entry"):
        containers.parse_inspect('[{"Name": "/x"}]', 0.0)


def test_no_docker_no_finding_no_error() -> None:
    facts = containers.collect(run_command, None)
    assert facts["docker"] is False and containers.evaluate(facts) == []


@pytest.mark.skipif(
    shutil.which("docker") is None, reason="needs the docker client (this machine has it, no engine)"
)
def test_docker_client_without_a_daemon_is_no_finding_and_no_error() -> None:
    facts = containers.collect(run_command, shutil.which("docker"))
    assert facts["docker"] is False
    assert "daemon not reachable" in facts["reason"]
    assert containers.evaluate(facts) == []
