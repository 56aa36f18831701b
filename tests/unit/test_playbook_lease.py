"""Every remediation and reboot playbook changes its hosts under the EC2 lease (issue 16 item 3).

Each serial play keeps its deadline check (tasks/not_after.yml) first, then names the run's lease and
runs all its changes inside one block whose first task takes the lease (``checked`` when the CLI
already holds it) and whose ``always:`` releases it. The lease tasks are the exact text that
tests/unit/plugins/modules/test_ec2_lease.py runs against a real EC2 API (moto), so what is checked
here is that every playbook carries that tested text, and that no task that could change a host runs
outside the lease. ansible-playbook --syntax-check proves the result is a playbook Ansible loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.remediations import REMEDIATIONS
from tests.paths import REPO
from tests.unit.plugins.modules.test_ec2_lease import LEASE_BLOCK

BIN = Path(sys.executable).parent
# Every playbook the rollout engine runs that changes hosts (the registry's; quarantine and unquarantine
# change Kubernetes nodes through kubectl on the controller, not the hosts). remediate_auto.yml is not
# here: it runs `fleetops remediate auto` on the controller, whose rollouts run these playbooks.
KUBE_ONLY = frozenset({"quarantine", "unquarantine"})
PLAYBOOKS = sorted(
    {
        REPO / "playbooks" / f"{r.playbook.rsplit('.', 1)[1]}.yml"
        for r in REMEDIATIONS.values()
        if r.name not in KUBE_ONLY
    }
)
MODULE = "fleetops.node.ec2_lease"
KNOBS = ("fleetops_lease", "fleetops_lease_rollout", "fleetops_lease_ttl")
REBOOT_TTL = (
    "{{ fleetops_lease_ttl | default((fleetops_reboot_timeout | default(600) | int)"
    " + (fleetops_drain_timeout | default(600) | int) + 600) }}"
)
STOP_START_TTL = (  # a stop and a start
    "{{ fleetops_lease_ttl | default((fleetops_stop_timeout | default(600) | int)"
    " + (fleetops_start_timeout | default(600) | int) + 600) }}"
)
REPLACE_TTL = (  # the group back at capacity, then the new host's ssh
    "{{ fleetops_lease_ttl | default((fleetops_replace_timeout | default(600) | int)"
    " + (fleetops_replace_connect_timeout | default(600) | int) + 600) }}"
)
LONG_TTL = {"rolling_reboot.yml": REBOOT_TTL, "stop_start.yml": STOP_START_TTL, "replace.yml": REPLACE_TTL}


def _tested() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The tested lease tasks: (name the lease, the block without its changes, take, release), each with
    the time limit every remediation task has (tests/fleetops/test_rollout.py)."""
    name, block = yaml.safe_load(LEASE_BLOCK)
    return (
        {"timeout": 60, **name},
        block,
        {"timeout": 300, **block["block"][0]},
        {"timeout": 300, **block["always"][0]},
    )


def _walk(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task, blocks flattened (block, rescue, always), in order."""
    out: list[dict[str, Any]] = []
    for task in tasks:
        if "block" in task:
            for part in ("block", "rescue", "always"):
                out += _walk(task.get(part, []))
        else:
            out.append(task)
    return out


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_every_change_runs_under_the_lease(path: Path) -> None:
    name, tested_block, take, release = _tested()
    plays = [play for play in yaml.safe_load(path.read_text()) if "serial" in play]
    assert plays, f"{path.name}: no serial play"
    for play in plays:
        # the selection check (tasks/targets.yml), the deadline, the lease's name, then the lease block
        targets, *tasks = play["tasks"]
        assert targets.get("ansible.builtin.import_tasks") == "tasks/targets.yml", path.name
        assert tasks[0].get("ansible.builtin.import_tasks") == "tasks/not_after.yml", path.name
        assert tasks[1] == name, f"{path.name}: the lease is not named as tested"
        assert len(tasks) == 3, f"{path.name}: a task runs outside the lease block: {tasks[3:]}"
        block = tasks[2]
        assert block["name"] == tested_block["name"] and block["vars"] == tested_block["vars"], path.name
        assert block["always"] == [release], f"{path.name}: the release is not the tested one"
        got_take = dict(block["block"][0])
        want_take = dict(take)
        if path.name in LONG_TTL:  # its lease must outlast what one host's change waits for
            assert got_take[MODULE]["ttl"] == LONG_TTL[path.name]
            got_take[MODULE] = {**got_take[MODULE], "ttl": want_take[MODULE]["ttl"]}
        assert got_take == want_take, f"{path.name}: the take is not the tested one"
        changes = block["block"][1:]
        assert changes, f"{path.name}: nothing inside the lease"
        assert all(MODULE not in task for task in _walk(changes)), path.name


def test_the_lease_takes_before_and_releases_after_every_change() -> None:
    """Order, from Ansible's own view (ansible-playbook --list-tasks, which leaves out `always:`): the
    take is the first task after the selection check, the deadline check and the lease's name, the
    changes follow it."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    for path in PLAYBOOKS:
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", "--list-tasks", str(path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        listed = [
            line.strip().split("\t")[0]
            for line in proc.stdout.splitlines()
            if "TAGS:" in line and not line.strip().startswith("play #")
        ]
        take = listed.index(
            "Take the EC2 lease on every target (refused while another rollout, CLI or AWX, holds one)"
        )
        assert listed[take - 1] == "Name this run's EC2 lease (the CLI's rollout, the AWX job, or this run)"
        assert listed[0] == "Act on no more and no fewer hosts than fleetops_targets names", listed
        assert all("deadline" in t.lower() or "run started" in t for t in listed[1 : take - 1]), listed
        assert take < len(listed) - 1, f"{path.name}: no change after the take"


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_the_lease_knobs_are_documented(path: Path) -> None:
    header = path.read_text().split("\n- name:")[0]
    for knob in KNOBS:
        assert f"#   {knob} " in header, f"{path.name}: {knob} undocumented"
