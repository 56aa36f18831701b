"""The built collection, installed into an empty directory, runs its scan playbook against localhost.

Nothing of this checkout may take part: the tarball is built with `ansible-galaxy collection build`,
installed with `ansible-galaxy collection install` into an empty folder, and `ansible-playbook -i
localhost, -c local fleetops.node.scan` runs from a folder outside the repository with no ansible.cfg
and ANSIBLE_COLLECTIONS_PATH naming only that folder. At -vvv ansible names the playbook file of every
task ("task path:"), and any module file it ships ("Using module file"): node_health's action ships none, it
sends the installed runner archive (its fast path, ``fleetops_path: runner``).
The result is read from the playbook's own set_stats summary (ANSIBLE_SHOW_CUSTOM_STATS) and from the
node_health result that the json result format prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(extra)
    return env


def test_built_tarball_installs_into_an_empty_dir_and_scans_localhost(tmp_path: Path) -> None:
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    dist, install, work = tmp_path / "dist", tmp_path / "collections", tmp_path / "work"
    for d in (dist, install, work):
        d.mkdir()
    env = _env(
        ANSIBLE_COLLECTIONS_PATH=str(install), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp")
    )

    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(dist)],
        check=True,
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    tarball = dist / f"fleetops-node-{version}.tar.gz"
    assert tarball.is_file(), list(dist.iterdir())
    assert not any(install.iterdir())
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(install)],
        check=True,
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    installed = install / "ansible_collections" / "fleetops" / "node"
    manifest = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("fleetops", "node", version)
    assert not installed.is_symlink() and (installed / "playbooks" / "scan.yml").is_file()

    # The interpreter is named: discovery may land on a pyenv shim of another version on these machines.
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "fleetops.node.scan",
            "-vvv",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**env, "ANSIBLE_SHOW_CUSTOM_STATS": "true", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    # the installed copy ran: its playbook and node_health's action, whose fast path sends the installed
    # runner archive instead of the module file; nothing from the checkout
    task_paths = set(re.findall(r"^task path: (\S+?):\d+$", out, re.M))
    assert task_paths == {str(installed / "playbooks" / "scan.yml")}, task_paths
    modules = set(re.findall(r"Using module file (\S+)", out))
    assert modules == set(), modules
    for part in ("plugins", "playbooks", "collections"):
        assert str(REPO / part) not in out, part

    # what the module found, as the playbook reports it (set_stats, shown as CUSTOM STATS)
    stats = re.search(r"^\s*RUN: (\{.*\})\s*$", out, re.M)
    assert stats is not None, out[-3000:]
    summary = json.loads(stats.group(1))["fleetops_scan"]
    assert list(summary) == ["localhost"]
    entry = summary["localhost"]
    assert entry["status"] == "ok", entry
    assert set(entry["findings"]) == {"critical", "warning", "info"}
    assert all(isinstance(n, int) and n >= 0 for n in entry["findings"].values())
    assert len(entry["summaries"]) == sum(entry["findings"].values())

    # and the module result itself (json result format): facts of the zombie_memcg detector
    result = re.search(r"^ok: \[localhost\] => (\{\n.*?\n\})$", out, re.M | re.S)
    assert result is not None, out[-3000:]
    node_health = json.loads(result.group(1))
    assert "zombie_memcg" in node_health["checks"]
    assert node_health["fleetops_path"] == "runner"
    assert isinstance(node_health["facts"]["memcg"]["total"], int)
