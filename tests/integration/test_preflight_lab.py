"""Preflight through a ProxyJump, on real lab hosts: lab-02 under a name only lab-01 resolves
(``behind-lab-02``, in lab-01's /etc/hosts) is reachable only by jumping through lab-01. Preflight
must probe it the way ansible connects (ansible's ssh with the ProxyJump) and find it reachable; the
same host without the jump is unreachable, with the reason. Then a real rollout (dry run and
--apply) goes through its preflight to the host behind the jump."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops.ansible.inventory import load_hosts
from fleetops.rollout.preflight import preflight
from fleetops_lab import Lab
from tests.helpers import fleetops

pytestmark = pytest.mark.lab
JUMP, BEHIND = "lab-01", "lab-02"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(2)
    try:
        lab.run(JUMP, f"echo '{lab.host_ip(BEHIND)} behind-lab-02' >> /etc/hosts", check=True)
        yield lab
    finally:
        lab.down()


def _inventory(lab: Lab, tmp_path: Path) -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host lab-jump\n  HostName {lab.host_ip(JUMP)}\n  User root\n  IdentityFile {lab.key_path}\n"
        f"  UserKnownHostsFile {lab.known_hosts_path}\n  StrictHostKeyChecking yes\n"
        f"Host behind-lab-02\n  HostKeyAlias {BEHIND}\n"
    )
    common = {
        "ansible_host": "behind-lab-02",
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(lab.key_path),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    known = f"-o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes"
    hosts = {
        "via-jump": {**common, "ansible_ssh_common_args": f"-F {config} {known} -o ProxyJump=lab-jump"},
        "no-jump": {**common, "ansible_ssh_common_args": known},
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def test_a_host_only_reachable_through_a_jump_host_passes_preflight(lab: Lab, tmp_path: Path) -> None:
    inventory = _inventory(lab, tmp_path)
    reasons = preflight(load_hosts([inventory], None), timeout=10, inventory=[inventory])
    assert reasons["via-jump"] is None, reasons
    assert reasons["no-jump"] is not None and reasons["no-jump"].startswith("unreachable: "), reasons
    # the whole rollout: preflight, then the remediation over the same jump
    state = tmp_path / "state.json"
    result = fleetops(
        "remediate", "reclaim", "-i", str(inventory), "--limit", "via-jump", "--apply", "--no-gate",
        "--state", str(state), "--format", "json",
        env={"FLEETOPS_STATE_DIR": str(tmp_path / "home"), "FLEETOPS_AUDIT_LOG": ""},
    )  # fmt: skip
    assert result.rc == 0, result.stderr
    assert result.json()["hosts"] == {"via-jump": "done"}
    assert "preflight" not in result.stderr, result.stderr
