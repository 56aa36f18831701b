"""node_health as a facts module: gather_facts with facts_modules returns one namespaced fact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO

PLAY = """
- hosts: localhost
  gather_facts: true
  tasks:
    - name: Branch on the fleet facts like any other fact
      ansible.builtin.debug:
        msg: "CHECKS={{ fleetops_node_health.checks | join(',') }} ERRORS={{ fleetops_node_health.errors | length }} CG={{ fleetops_node_health.facts.memcg.cgroup_version }}"
"""


def test_gather_facts_with_node_health_as_the_facts_module(tmp_path: Path) -> None:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_FACTS_MODULES": "fleetops.node.node_health",
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(REPO / "inventory" / "localhost.yml"),
         str(play), "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "CHECKS=zombie_memcg,crashloop_unit,crashloop_container,anon_rss_growth,ucx_mmap_hooks,ec2_scheduled_event"
        in proc.stdout
    )
    assert "ERRORS=0" in proc.stdout
    assert "CG=1" in proc.stdout
