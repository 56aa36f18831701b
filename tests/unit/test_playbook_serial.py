"""Remediation playbooks are safe when run without the wrapper (plain ansible-playbook, AWX).

They default to one host at a time and stop at the first failed host (`serial` / `max_fail_percentage`
from the knobs fleetops_serial / fleetops_max_fail_percentage); the rollout engine passes 100% / 100
for each of its batches, whose size and failures it controls itself. The behaviour is checked with
real ansible-playbook runs on three local-connection hosts where the module fails on every one of
them: disable_unit refuses sshd.service (protected; or, on a host without systemd, not a systemd host),
a real per-host error that changes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from fleetops.remediations import REMEDIATIONS as REGISTRY
from fleetops.rollout.engine import BATCH_VARS

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Every playbook the rollout engine runs that changes hosts (the registry's; quarantine and unquarantine
# change Kubernetes nodes through kubectl on the controller, not the hosts). remediate_auto.yml is not
# here: it runs `fleetops remediate auto` on the controller, whose rollouts run these playbooks.
KUBE_ONLY = frozenset({"quarantine", "unquarantine"})
REMEDIATIONS = sorted(
    {
        REPO / "playbooks" / f"{r.playbook.rsplit('.', 1)[1]}.yml"
        for r in REGISTRY.values()
        if r.name not in KUBE_ONLY
    }
)


def test_every_remediation_playbook_defaults_to_one_host_and_stops_at_a_failure() -> None:
    for path in REMEDIATIONS:
        for play in yaml.safe_load(path.read_text()):
            assert play.get("serial") == "{{ fleetops_serial | default(1) }}", path.name
            assert play.get("max_fail_percentage") == "{{ fleetops_max_fail_percentage | default(0) }}", (
                path.name
            )
            assert "fleetops_serial" in path.read_text().split("\n- name:")[0], (
                f"{path.name}: knob undocumented"
            )


def _recap(tmp_path: Path, *extra: str) -> dict[str, int]:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        f"    ansible_python_interpreter: {sys.executable}\n"
        "  hosts:\n    h1: {}\n    h2: {}\n    h3: {}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "fleetops.node.remediate_disable_unit", "--check",
         "-e", "fleetops_unit=sshd.service", *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    # a real per-host refusal that changes nothing: sshd is protected, or (a container without systemd as
    # PID 1, like this CI's) the host does not run systemd; either way the module fails on every host
    assert re.search(
        r"Failed to disable (unit )?sshd\.service: (it is protected|this host is not running systemd)",
        proc.stdout + proc.stderr,
    ), proc.stdout
    failed = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(h\d)\s*: ok=\d+.*?failed=(\d+)", proc.stdout, re.M)
    }
    return failed


def test_plain_run_stops_after_the_first_failed_host(tmp_path: Path) -> None:
    failed = _recap(tmp_path)
    assert failed == {"h1": 1}, "serial 1 + max_fail 0: h2 and h3 must never be touched"


def test_the_engines_batch_vars_run_the_whole_batch(tmp_path: Path) -> None:
    extra = [arg for key, value in BATCH_VARS.items() for arg in ("-e", f"{key}={value}")]
    failed = _recap(tmp_path, *extra)
    assert failed == {"h1": 1, "h2": 1, "h3": 1}
