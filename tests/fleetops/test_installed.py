"""The CLI as it runs on a controller with no checkout: real processes, real collections installed with
ansible-galaxy, ansible-doc as the judge of which collection ansible-core uses.

"No checkout" is FLEETOPS_COLLECTION_ROOT naming an empty folder (this checkout's editable install would
otherwise find itself); tests/integration/test_collection_install.py runs the real wheel in a fresh venv.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import FLEETOPS, REPO

BIN = Path(sys.executable).parent
VERSION = str(yaml.safe_load((REPO / "galaxy.yml").read_text())["version"])


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(out)],
        check=True,
        capture_output=True,
        cwd=out,
        env={k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
    )
    return out / f"fleetops-node-{VERSION}.tar.gz"


@pytest.fixture
def no_checkout(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p
        for p in env.get("PYTHONPATH", "").split(os.pathsep)
        if p and not (Path(p) / "ansible_collections").exists()
    )
    env.update(HOME=str(home), FLEETOPS_COLLECTION_ROOT=str(home), COLUMNS="120", ANSIBLE_NOCOLOR="1")
    return env


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd, stdin=subprocess.DEVNULL
    )


def _install(tarball: Path, where: Path, env: dict[str, str]) -> Path:
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(where)],
        check=True,
        capture_output=True,
        env=env,
        cwd=where.parent,
    )
    return where / "ansible_collections" / "fleetops" / "node"


def test_with_no_checkout_and_no_inventory_the_shipped_localhost_inventory_is_used(
    no_checkout: dict[str, str], tarball: Path, tmp_path: Path
) -> None:
    """`-i` left out: the package's localhost inventory, as --help says (was: "no fleetops checkout found")."""
    _install(tarball, tmp_path / "collections", no_checkout)
    env = no_checkout | {"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections")}
    proc = _run(env, tmp_path, str(FLEETOPS), "plan", "reboot", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["batches"] == [["localhost"]]
    shipped = Path(__import__("fleetops").__file__).parent / "localhost.yml"
    assert shipped.read_text() == (REPO / "inventory" / "localhost.yml").read_text()


def test_a_collection_found_twice_is_the_one_ansible_core_uses_and_version_says_which(
    no_checkout: dict[str, str], tarball: Path, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for where in (second, first):
        _install(tarball, where, no_checkout)
    env = no_checkout | {"ANSIBLE_COLLECTIONS_PATH": f"{first}:{second}"}
    version = _run(env, tmp_path, str(FLEETOPS), "--version")
    assert version.returncode == 0 and version.stderr == "", version
    lines = version.stdout.splitlines()
    used = first / "ansible_collections" / "fleetops" / "node"
    assert lines[0].startswith(f"fleetops {VERSION} (Python "), lines
    assert lines[1] == f"collection fleetops.node {VERSION} at {used}", lines
    assert lines[2] == f"  also found, not used {VERSION} at {second / 'ansible_collections/fleetops/node'}"
    doc = _run(env, tmp_path, str(BIN / "ansible-doc"), "fleetops.node.node_health")
    assert doc.returncode == 0, doc.stderr
    match = re.search(r"\((/[^)]+/plugins/modules/node_health\.py)\)", doc.stdout)
    assert match and Path(match.group(1)).is_relative_to(used), doc.stdout[:300]
    # and the controller loads that collection's code
    load = _run(
        env,
        tmp_path,
        sys.executable,
        "-c",
        "from fleetops.ansible import collection; print(collection.module_utils('findings').__file__)",
    )
    assert load.stdout.strip() == str(used / "plugins" / "module_utils" / "findings.py"), load


def test_an_ansible_core_outside_the_range_gets_one_line_before_anything_runs(tmp_path: Path) -> None:
    """What a later `pip install ansible-core==2.19.0` leaves: its metadata first on the path. The command
    says what fleetops needs in one line (exit 2) before it reads an inventory; --help still answers."""
    old = tmp_path / "site" / "ansible_core-2.19.0.dist-info"
    old.mkdir(parents=True)
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: ansible-core\nVersion: 2.19.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(old.parent), os.environ.get("PYTHONPATH", "")]))
    proc = _run(env, tmp_path, str(FLEETOPS), "scan", "-i", str(tmp_path / "missing.yml"))
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == (
        f"fleetops: error: fleetops needs ansible-core<2.22,>=2.20; {sys.executable} has ansible-core 2.19.0: "
        "pip install 'ansible-core<2.22,>=2.20'\n"
    )
    assert _run(env, tmp_path, str(FLEETOPS), "scan", "--help").returncode == 0
