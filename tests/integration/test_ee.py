"""Jobs run the way AWX runs them, inside the built execution environment, against real lab hosts.

Two paths, both with the image `make ee` builds (localhost/fleetops-ee:latest; built here if missing):
(a) ``ansible-runner run --process-isolation`` with podman: the runner on this machine starts the EE
    container, which runs ansible-playbook (AWX's control plane running a job in an EE);
(b) the execution-node stream ``ansible-runner transmit | podman run -i <EE> ansible-runner worker |
    ansible-runner process``: what receptor carries between AWX and an execution node, the worker inside
    the EE container. Nothing is mounted into that container: the inventory, the extra vars, the known
    hosts and the ssh key (``env/ssh_key``, where AWX puts a machine credential) travel in the stream.
Both run the collection's playbook ``fleetops.node.scan``; the ``fleetops_scan`` stats it sets (AWX keeps
them as the job's artifacts) must match ``fleetops scan`` on the same hosts: the host set, each host's
status, and each host's findings as (check, severity) pairs. The hosts are two lab hosts plus an address
in the lab's subnet where nothing answers (an unreachable host), and an allow-list that leaves every
enabled unit but sshd unexpected, so that both sides have findings to agree on.

Needs root, the lab (systemd-nspawn) and podman; `make test-ee` installs podman (tools/debian-deps.sh
--ee) and builds the image first. Podman runs with ee/containers.conf (runc and lowered ulimits: crun
cannot start a container on these machines).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab
from tests.helpers import fleetops
from tests.paths import REPO

IMAGE = "localhost/fleetops-ee:latest"
BIN = Path(sys.executable).parent
GHOST = ("lab-ghost", "10.213.0.250")  # in the lab's subnet, nothing answers: no route to host
ALLOWLIST = ["ssh.service"]

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed: `make test-ee` installs it (tools/debian-deps.sh --ee), "
        "builds the execution environment and runs these tests",
    ),
]


def _env() -> dict[str, str]:
    """This environment with ee/containers.conf for podman, without the Makefile's ANSIBLE_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.setdefault("CONTAINERS_CONF", str(REPO / "ee" / "containers.conf"))
    return env


@pytest.fixture(scope="module")
def image() -> str:
    """The EE image, built by ee/build.sh (which does nothing when the image matches its inputs)."""
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(REPO / "ee" / "build.sh")],
        capture_output=True,
        text=True,
        env={**_env(), "PY": sys.executable},
        cwd=REPO,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(f"ee/build.sh: {time.monotonic() - started:.1f} s: {proc.stdout.strip().splitlines()[-1]}")
    return IMAGE


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(2)
    try:
        yield lab
    finally:
        lab.down()


def _lab_inventory(lab: Lab) -> dict[str, Any]:
    inventory: dict[str, Any] = yaml.safe_load(lab.inventory_path().read_text())
    inventory["all"]["children"]["fleetops_lab"]["hosts"][GHOST[0]] = {"ansible_host": GHOST[1]}
    return inventory


def _private_data_dir(lab: Lab, path: Path) -> Path:
    """An AWX-style private data dir: inventory/, env/extravars, env/ssh_key; the known hosts beside them.

    The lab's inventory names its key and known_hosts by paths on this machine; here the key is the
    job's credential (env/ssh_key: the runner loads it into an ssh-agent in the container) and the known
    hosts are found relative to the inventory, wherever the directory is unpacked.
    """
    inventory = _lab_inventory(lab)
    group_vars = inventory["all"]["children"]["fleetops_lab"]["vars"]
    del group_vars["ansible_ssh_private_key_file"]
    group_vars["ansible_ssh_common_args"] = (
        "-o UserKnownHostsFile={{ inventory_dir }}/../known_hosts -o StrictHostKeyChecking=yes"
    )
    (path / "inventory").mkdir(parents=True)
    (path / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (path / "env").mkdir()
    (path / "env" / "extravars").write_text(yaml.safe_dump({"fleetops_unit_allowlist": ALLOWLIST}))
    (path / "env" / "ssh_key").write_text(lab.key_path.read_text())
    (path / "env" / "ssh_key").chmod(0o600)
    shutil.copy(lab.known_hosts_path, path / "known_hosts")
    return path


def _stats(private_data_dir: Path) -> tuple[str, dict[str, Any]]:
    """The job's status and the `fleetops_scan` stats of its playbook_on_stats event (AWX's artifacts).

    `ansible-runner run` writes artifacts/<ident>/; `ansible-runner process` writes artifacts/ itself.
    """
    artifacts = private_data_dir / "artifacts"
    if not (artifacts / "status").exists():
        (artifacts,) = artifacts.iterdir()
    status = (artifacts / "status").read_text().strip()
    for event_file in sorted((artifacts / "job_events").glob("*.json")):
        event = json.loads(event_file.read_text())
        if event.get("event") == "playbook_on_stats":
            scan: dict[str, Any] = event["event_data"]["artifact_data"]["fleetops_scan"]
            return status, scan
    out = (artifacts / "stdout").read_text() if (artifacts / "stdout").exists() else ""
    raise AssertionError(f"no playbook_on_stats event with artifact_data (status {status}):\n{out[-3000:]}")


def _from_stats(scan: dict[str, Any]) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """{host: (status, sorted [(check, severity)])} from the playbook's stats ("<severity> <check>: ...")."""
    out = {}
    for host, entry in scan.items():
        pairs = []
        for line in entry["summaries"]:
            severity, rest = line.split(" ", 1)
            pairs.append((rest.split(":", 1)[0], severity))
        counts = entry["findings"]
        assert sum(counts.values()) == len(pairs), (host, entry)
        out[host] = (entry["status"], sorted(pairs))
    return out


@pytest.fixture(scope="module")
def expected(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """`fleetops scan` on the same hosts, with the same allow-list."""
    work = tmp_path_factory.mktemp("baseline")
    (work / "hosts.yml").write_text(yaml.safe_dump(_lab_inventory(lab)))
    started = time.monotonic()
    result = fleetops(
        "scan",
        "-i",
        str(work / "hosts.yml"),
        "--format",
        "json",
        "--quiet",
        "-e",
        json.dumps({"fleetops_unit_allowlist": ALLOWLIST}),
    )
    print(f"fleetops scan: {time.monotonic() - started:.1f} s")
    assert result.rc == 3, result.stderr  # 3: a host was unreachable
    report = result.json()
    out = {
        host: (entry["status"], sorted((f["check"], f["severity"]) for f in entry.get("findings", [])))
        for host, entry in report["hosts"].items()
    }
    assert out[GHOST[0]][0] == "unreachable"
    assert {host for host, (status, _) in out.items() if status == "ok"} == {"lab-01", "lab-02"}
    # the allow-list leaves units unexpected on every reachable host: there are findings to compare
    assert all(("unexpected_unit", "warning") in out[h][1] for h in ("lab-01", "lab-02")), out
    return out


def test_process_isolation_run_in_the_ee_matches_fleetops_scan(
    image: str, lab: Lab, expected: dict[str, Any], tmp_path: Path
) -> None:
    pdd = _private_data_dir(lab, tmp_path / "job")
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(BIN / "ansible-runner"),
            "run",
            str(pdd),
            "-p",
            "fleetops.node.scan",
            "--process-isolation",
            "--process-isolation-executable",
            "podman",
            "--container-image",
            image,
            # the lab's bridge is reached from the host's network namespace; rootful podman runs the
            # EE's user 1000 without a user namespace, and the runner's artifacts dir is root's (0700)
            "--container-option=--network=host",
            "--container-option=--user=0",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    print(f"ansible-runner run --process-isolation: {time.monotonic() - started:.1f} s")
    status, scan = _stats(pdd)
    (artifacts,) = (pdd / "artifacts").iterdir()
    # the job ran in the EE container: the runner recorded the podman command line it ran
    command = json.loads((artifacts / "command").read_text())["command"]
    assert command[:2] == ["podman", "run"] and image in command, command
    # an unreachable host fails the play (ansible-playbook rc 4), as `fleetops scan` says with rc 3
    assert (status, proc.returncode) == ("failed", 4), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _from_stats(scan) == expected


@pytest.mark.parametrize("playbook", ["fleetops.node.scan", "playbooks/scan.yml"])
def test_execution_node_stream_through_the_ee_worker_matches_fleetops_scan(
    image: str, lab: Lab, expected: dict[str, Any], tmp_path: Path, playbook: str
) -> None:
    """The collection's playbook, and the project's playbooks/scan.yml as AWX's "fleetops scan" template
    names it (a project checkout is the private data dir's project/; the module comes from the EE)."""
    pdd = _private_data_dir(lab, tmp_path / "job")
    if not playbook.startswith("fleetops."):
        (pdd / "project" / "playbooks").mkdir(parents=True)
        shutil.copy(REPO / playbook, pdd / "project" / playbook)
    out = tmp_path / "processed"
    out.mkdir()
    runner = BIN / "ansible-runner"
    pipeline = (
        f"{runner} transmit {pdd} -p {playbook}"
        f" | podman run -i --rm --network host {image} ansible-runner worker"
        f" | {runner} process {out}"
    )
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True, env=_env(), timeout=600
    )
    print(f"transmit | worker in the EE | process ({playbook}): {time.monotonic() - started:.1f} s")
    # the worker ran in the container: nothing of the job's results exists on this side but what
    # `process` rebuilt from the stream
    assert not (pdd / "artifacts").exists()
    status, scan = _stats(out)
    # `process` exits with the job's rc: 4, a host was unreachable
    assert (status, proc.returncode) == ("failed", 4), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _from_stats(scan) == expected
