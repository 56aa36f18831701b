"""`fleetops remediate stop-start`: its options, its gate, and its playbook's shape (the lease, the probe).

The real run (lab hosts powered off and on through the lab's EC2) is tests/integration/test_stop_start_lab.py;
the module against moto is tests/unit/plugins/modules/test_ec2_stop_start.py.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.ansible.runner import RunnerOptions, run_playbook
from fleetops.cli.app import build_parser
from fleetops.cli.remediate import remediation_request
from fleetops.errors import UsageError
from fleetops.remediations import REMEDIATIONS
from fleetops.rollout.engine import BATCH_VARS, LEASE_VAR
from fleetops.rollout.outcome import HostOutcome, host_outcome
from tests.paths import REPO
from tests.unit.plugins.modules.test_ec2_lease import LEASE_BLOCK

STOP_START = REMEDIATIONS["stop-start"]
PLAYBOOK = REPO / "playbooks" / "stop_start.yml"


def _gate(before: str | None, after: str | None, findings: list[dict[str, Any]], **xv: Any) -> str | None:
    outcome = HostOutcome(
        status="ok",
        changed=True,
        before={"boot_id": before} if before else None,
        after={"boot_id": after} if after else None,
    )
    assert STOP_START.gate is not None
    return STOP_START.gate("gpu-1", outcome, None, {"status": "ok", "findings": findings}, xv)


def _finding(check: str, severity: str, summary: str = "", **data: Any) -> dict[str, Any]:
    return {"check": check, "severity": severity, "summary": summary or check, "data": data}


def test_the_gate_passes_a_host_that_powered_off_and_on_clean() -> None:
    info = _finding("gpu_health", "info", "1 GPU, healthy")
    assert _gate("a", "b", [info], fleetops_stop_start_finding="gpu_health") is None


@pytest.mark.parametrize(
    ("before", "after", "findings", "xv", "reason"),
    [
        ("a", "a", [], {}, "gate: boot id unchanged: the host did not power off and on"),
        ("a", None, [], {}, "gate: could not read the boot id before and after the stop-start"),
        (
            "a", "b", [_finding("ec2_scheduled_event", "warning", code="instance-retirement")], {},
            "gate: a scheduled EC2 event is still there after the stop-start: instance-retirement",
        ),
        (
            "a", "b", [_finding("gpu_health", "critical", "GPU 0: 2 uncorrectable ECC errors")],
            {"fleetops_stop_start_finding": "gpu_health"},
            "gate: gpu_health still found after the stop-start: GPU 0: 2 uncorrectable ECC errors",
        ),
    ],
)  # fmt: skip
def test_the_gate_fails(
    before: str, after: str | None, findings: list[dict[str, Any]], xv: dict[str, Any], reason: str
) -> None:
    assert _gate(before, after, findings, **xv) == reason


def test_without_finding_a_warning_of_another_check_is_not_the_gates_business() -> None:
    assert _gate("a", "b", [_finding("gpu_health", "critical")]) is None


def test_cli_options_become_the_playbooks_vars() -> None:
    args = build_parser().parse_args(
        ["remediate", "stop-start", "-i", "inv.yml", "--stop-timeout", "90", "--start-timeout", "300",
         "--finding", "gpu_health"]
    )  # fmt: skip
    request = remediation_request(args)
    params = STOP_START.resolve(request.params)
    assert STOP_START.extravars(params) == {
        "fleetops_stop_timeout": 90,
        "fleetops_start_timeout": 300,
        "fleetops_stop_start_finding": "gpu_health",
    }
    assert STOP_START.extravars(STOP_START.resolve({})) == {
        "fleetops_stop_timeout": 600,
        "fleetops_start_timeout": 600,
    }
    assert STOP_START.max_unhealthy == REMEDIATIONS["reboot"].max_unhealthy  # the reboot's capacity floor
    assert STOP_START.probe_vars == {"fleetops_probe_only": True}


def test_a_finding_that_is_no_check_name_is_refused() -> None:
    with pytest.raises(UsageError, match="is not a check name"):
        STOP_START.extravars(STOP_START.resolve({"finding": "gpu health; rm"}))


def test_the_host_timeout_must_cover_the_stop_and_the_start() -> None:
    xv = STOP_START.extravars(STOP_START.resolve({}))
    with pytest.raises(
        UsageError, match=r"--host-timeout 1200 must be more than --stop-timeout 600 \+ --start-timeout 600"
    ):
        STOP_START.check_host_timeout(1200, xv)
    assert STOP_START.check_host_timeout(1201, xv) == 1201
    assert STOP_START.host_timeout > 1200


def test_the_playbook_changes_hosts_under_the_tested_lease() -> None:
    """The same lease tasks as every remediation playbook (tests/unit/test_playbook_lease.py), its own TTL."""
    name, block = yaml.safe_load(LEASE_BLOCK)
    (play,) = yaml.safe_load(PLAYBOOK.read_text())
    targets, *tasks = play["tasks"]
    assert targets == {
        "name": "Act on no more and no fewer hosts than fleetops_targets names",
        "ansible.builtin.import_tasks": "tasks/targets.yml",
    }
    assert tasks[0] == {
        "name": "Start no batch after the deadline",
        "ansible.builtin.import_tasks": "tasks/not_after.yml",
    }
    assert tasks[1] == {"timeout": 60, **name}
    assert len(tasks) == 3
    assert tasks[2]["vars"] == block["vars"] and tasks[2]["always"] == [
        {"timeout": 300, **block["always"][0]}
    ]
    take = dict(tasks[2]["block"][0])
    assert "fleetops_stop_timeout" in take["fleetops.node.ec2_lease"]["ttl"]  # it outlasts a stop-start
    take["fleetops.node.ec2_lease"] = {
        **take["fleetops.node.ec2_lease"],
        "ttl": "{{ fleetops_lease_ttl | default(omit) }}",
    }
    assert take == {"timeout": 300, **block["block"][0]}
    names = [t["name"] for t in tasks[2]["block"]]
    # refused before anything is read or done; the boot id read before and after the stop-start
    assert names.index("Refuse a host that is not an EC2 instance") < names.index("Read the boot id before")
    assert names.index("Read the boot id before") < names.index(
        "Stop the instance, wait until it is stopped, start it, wait until it runs"
    )
    slurps = [t for t in tasks[2]["block"] if "ansible.builtin.slurp" in t]
    assert [("when" in t) for t in slurps] == [False, True]  # probe-only mode reads the boot id once


def _run_locally(tmp_path: Path, extravars: dict[str, Any], check: bool = False) -> HostOutcome:
    """The playbook as the engine runs it (ansible-runner, the batch vars), on this machine as `here`."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    run = run_playbook(
        RunnerOptions(
            playbook=str(PLAYBOOK),
            inventory=[inventory],
            limit="here",
            extravars={**BATCH_VARS, LEASE_VAR: False, **extravars},
            check=check,
        )
    )
    return host_outcome(run.results_for("here"), STOP_START.actions)


def test_probe_only_reads_the_boot_id_and_changes_nothing(tmp_path: Path) -> None:
    """What a resume relies on: the probe reads the boot id ("before") and is an ok outcome, even for a
    host without an instance id (the refusal is for acting, not for probing)."""
    outcome = _run_locally(
        tmp_path, {**STOP_START.extravars(STOP_START.resolve({})), **(STOP_START.probe_vars or {})}
    )
    assert outcome.status == "ok" and not outcome.changed, outcome
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert outcome.before == {"boot_id": boot_id} and outcome.after is None


def test_a_dry_run_refuses_a_host_without_an_instance_id(tmp_path: Path) -> None:
    outcome = _run_locally(tmp_path, STOP_START.extravars(STOP_START.resolve({})), check=True)
    assert outcome.status == "failed"
    assert outcome.msg == (
        "here has no ec2_instance_id hostvar: stop-start needs an EC2 instance (a host of the "
        "fleetops.node.ec2 inventory); the host was not touched"
    )


def test_an_auto_scaling_groups_instance_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped member of an Auto Scaling group is replaced by the group, outside every budget and
    floor: stop-start leaves it out, skipped with one line saying why (exit 3); the other host runs."""
    from fleetops import api
    from fleetops.api import launch
    from fleetops.exitcodes import ExitCode

    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(tmp_path / "home"))
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n"
        "    m1: {ansible_connection: local, ec2_tags: {'aws:autoscaling:groupName': gpu-pool}}\n"
        "    s1: {ansible_connection: local}\n"
    )
    ran: list[list[str]] = []

    def runner(hosts: Sequence[str], extravars: dict[str, Any], **k: Any) -> Any:
        from fleetops.ansible.runner import PlaybookRun

        ran.append(list(hosts))
        return PlaybookRun(status="successful", rc=0)

    monkeypatch.setattr(launch, "PlaybookBatchRunner", lambda playbook, inventory, **k: runner)
    lines: list[str] = []

    class Observer(api.NullObserver):
        def message(self, text: str, style: str = "") -> None:
            lines.append(text)

    result = api.remediate(api.RemediationRequest(action="stop-start", inventory=[inv]), Observer())
    assert ran == [["s1"]]  # the dry run of the other host; m1 never reaches the playbook
    assert result.rollout is not None and result.rollout.hosts["m1"] == "skipped"
    assert result.rollout.results["m1"].msg.startswith(
        "refused: it is an instance of the Auto Scaling group gpu-pool"
    )
    assert result.exit_code == ExitCode.FAILED
    assert any(
        line.startswith("m1: refused: it is an instance of the Auto Scaling group gpu-pool") for line in lines
    )
