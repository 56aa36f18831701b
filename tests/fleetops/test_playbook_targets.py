"""The playbooks' own selection check (tasks/targets.yml, issue 38 item 9): a fleetops_targets that is set
but blank, or of which a part matches no host, fails the run on the controller before any task on a host,
naming the parts. Real ansible-playbook runs (ansible-runner) against hosts that cannot be reached: a task
that got past the check would show as unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetops.ansible.runner import RunnerOptions, run_playbook

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
CHECK_TASK = "Act on no more and no fewer hosts than fleetops_targets names"  # tasks/targets.yml's
UNREACHABLE = """\
all:
  vars:
    ansible_connection: ssh
    ansible_host: 127.0.0.1
    ansible_port: 1
  children:
    gpu:
      hosts:
        gpu-01:
        gpu-02:
    spares: {}
"""


def test_every_playbook_that_acts_checks_its_targets_first() -> None:
    checked = []
    for path in sorted(PLAYBOOKS.glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            if path.stem == "scan":  # a scan keeps ansible's behaviour (fleetops scan says so)
                continue
            if "fleetops_targets" in str(play.get("hosts")) or path.stem == "remediate_auto":
                first = play["tasks"][0]
                assert first.get("ansible.builtin.import_tasks") == "tasks/targets.yml", path.name
                checked.append(path.stem)
    assert {"rolling_reboot", "stop_start", "replace", "unquarantine", "remediate_auto"} <= set(checked)


@pytest.mark.parametrize(
    ("playbook", "targets", "named"),
    [
        ("rolling_reboot", "gpu-01,gpu-5", '"gpu-01,gpu-5": gpu-5 matched no host'),
        ("stop_start", "gpu,!spares", '"gpu,!spares": !spares matched no host'),
        ("quarantine", ",", '"," is blank: an empty selection never means all hosts'),  # ansible: all
        ("remediate_auto", "", '"" is blank'),  # the pass would run without -l: every host
    ],
)
def test_a_playbook_refuses_its_targets_before_any_host_task(
    tmp_path: Path, playbook: str, targets: str, named: str
) -> None:
    inv = tmp_path / "fleet.yml"
    inv.write_text(UNREACHABLE)
    run = run_playbook(
        RunnerOptions(
            playbook=f"fleetops.node.{playbook}",
            inventory=[inv],
            extravars={"fleetops_targets": targets, "fleetops_lease": False},
            check=True,
            connect_timeout=2,
        )
    )
    assert run.status == "failed"
    results = [tr for trs in run.tasks.values() for tr in trs]
    assert [(tr.task, tr.status) for tr in results] == [(CHECK_TASK, "failed")], results
    assert named in results[0].msg and "fleetops_targets" in results[0].msg, results[0].msg
