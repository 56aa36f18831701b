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

The EC2 lease, both ways, with the same hosts as instances of the lab's local EC2 endpoint (moto): a
running `fleetops remediate reclaim` holds it and the collection's remediate_reclaim, run as AWX job 4242
through the stream, fails on its lease task naming the CLI's rollout before any host task; an AWX job
(4343) holds it and `fleetops remediate reclaim --apply` exits 4 naming awx-job-4343, no host run.

The controller package in the EE (no lab needed: run them with -k fleetops_in_the_ee): `fleetops remediate
auto --help` runs, the package's default policy passes `python -m fleetops.policy --check`, the package
finds the collection the EE installed; and playbooks/remediate_auto.yml, run as an AWX job through the
stream, runs the real `fleetops` there: given a policy it refuses, the job fails with exit 2's meaning and
keeps the CLI's error as its artifacts. With the lab (its two hosts as instances of the lab's EC2
endpoint), the same template's check job runs a real pass in the EE: the fleet listed through EC2, the
hosts reached with the job's ssh key, scanned, decided by a project policy that leaves lab-02's
scheduled EC2 event to a human: with fleetops_auto_fail_on: human the job fails naming lab-02, a dry run
that wrote no tag.

Needs root, the lab (systemd-nspawn) and podman; `make test-ee` installs podman (tools/debian-deps.sh
--ee) and builds the image first. Podman runs with ee/containers.conf (runc and lowered ulimits: crun
cannot start a container on these machines).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops_lab import Lab
from tests.helpers import FLEETOPS, LAB_ANSWERED, fleetops
from tests.paths import REPO

IMAGE = "localhost/fleetops-ee:latest"
BIN = Path(sys.executable).parent
GHOST = "lab-ghost"  # at Lab.unused_ip: in the lab's subnet, nothing answers: no route to host
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
    lab.up(2, ec2=True)  # the hosts also as instances of a local EC2 endpoint (moto): the lease tests
    try:
        yield lab
    finally:
        lab.down()


def _lab_inventory(lab: Lab) -> dict[str, Any]:
    inventory: dict[str, Any] = yaml.safe_load(lab.inventory_path().read_text())
    inventory["all"]["children"]["fleetops_lab"]["hosts"][GHOST] = {"ansible_host": lab.unused_ip}
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
    assert out[GHOST][0] == "unreachable"
    assert {host for host, (status, _) in out.items() if status == LAB_ANSWERED} == {"lab-01", "lab-02"}
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
        _project_tasks(pdd / "project")
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


# ------------------------------------------------------------------ the EC2 lease: a CLI rollout and an AWX job
#
# The same two lab hosts, as instances of the lab's EC2 endpoint (moto on 127.0.0.1, reached from the EE
# container through --network host). The AWX job gets the endpoint and keys the way an AWS credential
# reaches a job (env/envvars: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the hosts'
# ec2_instance_id / ec2_region hostvars in its inventory (a static copy of what the EC2 inventory gives).

LEASE_PREFIX = "fleetops:lease:"
RECLAIM = "fleetops.node.reclaim_memcg"


def _ec2(lab: Lab) -> tuple[str, str, Any]:
    """The lab's EC2 endpoint URL, its region and a boto3 client for it."""
    from fleetops_lab.ec2sim import client

    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    url, region = config["endpoint_url"], config["regions"][0]
    return url, region, client(url, region)


def _lease_tags(lab: Lab) -> dict[str, list[str]]:
    """Name tag -> the instance's fleetops:lease:* tag keys."""
    _, _, ec2 = _ec2(lab)
    tags = ec2.describe_tags()["Tags"]
    names = {t["ResourceId"]: t["Value"] for t in tags if t["Key"] == "Name"}
    leases: dict[str, list[str]] = {}
    for tag in tags:
        if tag["Key"].startswith(LEASE_PREFIX):
            leases.setdefault(names.get(tag["ResourceId"], tag["ResourceId"]), []).append(tag["Key"])
    return leases


def _drop_leases(lab: Lab) -> None:
    """Cleanup: remove every lease tag left on the lab's instances."""
    _, _, ec2 = _ec2(lab)
    for tag in ec2.describe_tags()["Tags"]:
        if tag["Key"].startswith(LEASE_PREFIX):
            ec2.delete_tags(Resources=[tag["ResourceId"]], Tags=[{"Key": tag["Key"]}])


def _ec2_hostvars(lab: Lab) -> dict[str, dict[str, Any]]:
    """The EC2 inventory's hostvars, as `ansible-inventory --list` gives them."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
    }
    proc = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(lab.ec2_inventory_path()), "--list"],
        capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout, object_hook=lambda o: o.get("__ansible_unsafe", o) if len(o) == 1 else o)
    hostvars: dict[str, dict[str, Any]] = data["_meta"]["hostvars"]
    return hostvars


def _awx_ec2_job(lab: Lab, path: Path, extravars: dict[str, Any]) -> Path:
    """An AWX-style private data dir for a job on the lab hosts as EC2 instances, with an AWS credential."""
    pdd = _private_data_dir(lab, path)
    inventory = yaml.safe_load((pdd / "inventory" / "hosts.yml").read_text())
    hosts = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    del hosts[GHOST]
    ec2_vars = _ec2_hostvars(lab)
    for host, hostvars in hosts.items():
        hostvars["ec2_instance_id"] = ec2_vars[host]["ec2_instance_id"]
        hostvars["ec2_region"] = ec2_vars[host]["ec2_region"]
    assert sorted(hosts) == ["lab-01", "lab-02"]
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    url, region, _ = _ec2(lab)
    envvars = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": region,
    }
    (pdd / "env" / "envvars").write_text(yaml.safe_dump(envvars))
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(extravars))
    return pdd


def _stream(
    image: str, pdd: Path, playbook: str, out: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    """transmit | the worker in the EE | process, as AWX runs a job on an execution node."""
    out.mkdir()
    runner = BIN / "ansible-runner"
    pipeline = (
        f"{runner} transmit {pdd} -p {playbook}"
        f" | podman run -i --rm --network host {image} ansible-runner worker"
        f" | {runner} process {out}"
    )
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True, env=_env(), timeout=300
    )
    return proc, time.monotonic() - started


def _project_tasks(project: Path) -> None:
    """The task files the project's playbooks include (playbooks/tasks/: the targets check first), as a
    project checkout has them beside the playbooks."""
    shutil.copytree(REPO / "playbooks" / "tasks", project / "playbooks" / "tasks", dirs_exist_ok=True)


def _events(out: Path) -> list[dict[str, Any]]:
    """The runner's events in order. Some carry no event_data: a `verbose` event (a warning ansible
    printed outside a task, e.g. a library's deprecation warning) has only its stdout; they read as {}."""
    events = [json.loads(f.read_text()) for f in sorted((out / "artifacts" / "job_events").glob("*.json"))]
    for event in events:
        event.setdefault("event_data", {})
    return events


def _ran(events: list[dict[str, Any]], action: str) -> list[tuple[str, str]]:
    """(event, host) of every per-host event of a task with this action."""
    return [
        (e["event"], e["event_data"].get("host", ""))
        for e in events
        if e["event"].startswith("runner_on_")
        and action in (e["event_data"].get("task_action"), e["event_data"].get("resolved_action"))
    ]


def test_awx_job_in_the_ee_is_refused_while_a_cli_rollout_holds_the_ec2_lease(
    image: str, lab: Lab, tmp_path: Path
) -> None:
    """A real `fleetops remediate reclaim` holds the lease (its cooldown keeps it between batches); the
    collection's remediate_reclaim, run as AWX job 4242 through the stream, fails on the lease task naming
    the CLI's rollout, and no reclaim task ran on any host."""
    _drop_leases(lab)
    env = {
        **os.environ,
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }
    state = tmp_path / "cli.json"
    stderr = tmp_path / "cli.stderr"
    cmd = [str(FLEETOPS), "remediate", "reclaim", "-i", str(lab.ec2_inventory_path()), "--apply",
           "--min-zombies", "999999999", "--cooldown", "120", "--per-group-max", "1",
           "--state", str(state), "--format", "json"]  # fmt: skip
    with stderr.open("w") as err:
        cli = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 120
            rollout = ""
            while time.monotonic() < deadline:
                if state.exists():
                    rollout = json.loads(state.read_text())["id"]
                    if _lease_tags(lab) == {h: [LEASE_PREFIX + rollout] for h in ("lab-01", "lab-02")}:
                        break
                assert cli.poll() is None, stderr.read_text()
                time.sleep(0.3)
            else:
                pytest.fail("the CLI rollout never held its lease: " + stderr.read_text())
            pdd = _awx_ec2_job(
                lab,
                tmp_path / "job",
                {"awx_job_id": 4242, "awx_user_name": "carol", "fleetops_min_zombies": 1},
            )
            out = tmp_path / "processed"
            proc, seconds = _stream(image, pdd, "fleetops.node.remediate_reclaim", out)
            print(f"AWX job refused by the CLI's lease: {seconds:.1f} s")
            # the CLI still runs and still holds its lease: the job took nothing
            assert cli.poll() is None, stderr.read_text()
            assert _lease_tags(lab) == {h: [LEASE_PREFIX + rollout] for h in ("lab-01", "lab-02")}
        finally:
            if cli.poll() is None:
                cli.send_signal(signal.SIGINT)  # stops in its cooldown, releasing its lease
                try:
                    cli.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    cli.kill()
                    cli.wait()
            _drop_leases(lab)
    text = proc.stdout + proc.stderr
    status = (out / "artifacts" / "status").read_text().strip()
    assert status == "failed" and proc.returncode != 0, text[-3000:]
    events = _events(out)
    failed = [e for e in events if e["event"] == "runner_on_failed"]
    assert [e["event_data"]["resolved_action"] for e in failed] == ["fleetops.node.ec2_lease"], text[-3000:]
    msg = failed[0]["event_data"]["res"]["msg"]
    assert "Failed to take the EC2 lease on 2 instance(s) held by another rollout" in msg, msg
    assert f"rollout {rollout} by " in msg, msg
    assert _ran(events, RECLAIM) == []  # no host was touched
    # nothing ran on a host: the only tasks that ran are the controller-side ones (the lease id, the
    # deadline check, the lease take and its release, all on localhost)
    actions = {e["event_data"].get("resolved_action") for e in events if e["event"].startswith("runner_on_")}
    assert actions <= {"ansible.builtin.set_fact", "ansible.builtin.assert", "fleetops.node.ec2_lease"}, (
        actions
    )


LEASE_ONLY = """\
# takes the EC2 lease on every target as an AWX job does, and keeps it (no release)
- name: Hold the EC2 lease
  hosts: all
  gather_facts: false
  tasks:
    - name: Take the EC2 lease on every target
      fleetops.node.ec2_lease:
        state: acquired
        rollout: "awx-job-{{ awx_job_id }}"
        operator: "{{ awx_user_name }}@awx"
        instances: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'ec2_instance_id'))) }}"
        instance_regions: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'ec2_region'))) }}"
      delegate_to: localhost
      run_once: true
      become: false
"""


def test_cli_rollout_is_refused_while_an_awx_job_in_the_ee_holds_the_ec2_lease(
    image: str, lab: Lab, tmp_path: Path
) -> None:
    """AWX job 4343, run through the stream in the EE, takes the lease and keeps it; `fleetops remediate
    reclaim --apply` then exits 4 naming awx-job-4343, and no host ran."""
    _drop_leases(lab)
    pdd = _awx_ec2_job(lab, tmp_path / "job", {"awx_job_id": 4343, "awx_user_name": "carol"})
    (pdd / "project").mkdir()
    (pdd / "project" / "lease.yml").write_text(LEASE_ONLY)
    out = tmp_path / "processed"
    try:
        proc, seconds = _stream(image, pdd, "lease.yml", out)
        print(f"AWX job taking the lease: {seconds:.1f} s")
        assert (proc.returncode, (out / "artifacts" / "status").read_text().strip()) == (0, "successful"), (
            proc.stdout[-3000:] + proc.stderr[-3000:]
        )
        assert _lease_tags(lab) == {h: [LEASE_PREFIX + "awx-job-4343"] for h in ("lab-01", "lab-02")}
        env = {
            "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
            "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        }
        state = tmp_path / "cli.json"
        started = time.monotonic()
        result = fleetops(
            "remediate", "reclaim", "-i", str(lab.ec2_inventory_path()), "--apply", "--lease-settle", "0",
            "--state", str(state), "--format", "json", env=env, timeout=300,
        )  # fmt: skip
        print(f"fleetops remediate reclaim refused: {time.monotonic() - started:.1f} s")
        # the job's lease is untouched by the refused rollout
        assert _lease_tags(lab) == {h: [LEASE_PREFIX + "awx-job-4343"] for h in ("lab-01", "lab-02")}
    finally:
        _drop_leases(lab)
    assert result.rc == 4, result.stderr
    assert "Failed to take the EC2 lease on 2 instance(s) held by another rollout" in result.stderr
    assert "rollout awx-job-4343 by carol@awx" in result.stderr, result.stderr
    # no host ran: the state (if written) has no host past pending, the audit log no host result
    if state.exists():
        saved = json.loads(state.read_text())
        assert all(s == "pending" for s in saved.get("hosts", {}).values()), saved
        assert not any(b.get("hosts") for b in saved.get("batches", [])), saved
    # with --apply every host the rollout runs gets an audit line: none was written
    audit = Path(env["FLEETOPS_AUDIT_LOG"])
    assert not audit.exists() or audit.read_text() == "", audit.read_text()


# ------------------------------------------------------------------ the controller package (fleetops) in the EE


def _in_ee(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "run", "--rm", image, "bash", "-c", script],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )


def test_fleetops_in_the_ee_runs_and_its_default_policy_passes_the_check(image: str) -> None:
    started = time.monotonic()
    helped = _in_ee(image, "fleetops remediate auto --help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: fleetops remediate auto"), helped.stdout
    for option in ("--policy", "--apply", "--state-dir", "--no-ec2-tags", "--kubectl", "--format"):
        assert option in helped.stdout, option
    # the policy the package ships (package data), found where the installed package is
    policy = _in_ee(
        image,
        "set -e; p=$(python3 -c 'import fleetops, pathlib; print(pathlib.Path(fleetops.__file__).parent"
        ' / "policies" / "default.yml")\'); echo "$p"; python3 -m fleetops.policy --check "$p"',
    )
    assert policy.returncode == 0, policy.stdout + policy.stderr
    path, verdict = policy.stdout.strip().splitlines()
    assert path.startswith("/usr/") and path.endswith("/fleetops/policies/default.yml"), path
    assert verdict.startswith(f"{path}: ok (") and "rules)" in verdict, verdict
    # the installed package (no checkout around it) loads the collection's code from the EE's collections
    loaded = _in_ee(
        image,
        "python3 -c 'from fleetops import paths; from fleetops.ansible import collection; "
        'print(paths.collection_root(), collection.module_utils("findings").__file__)\'',
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [
        "None",
        "/usr/share/ansible/collections/ansible_collections/fleetops/node/plugins/module_utils/findings.py",
    ], loaded.stdout
    print(f"fleetops in the EE: {time.monotonic() - started:.1f} s")


def test_remediate_auto_playbook_in_the_ee_runs_the_real_fleetops_and_fails_on_a_bad_policy(
    image: str, tmp_path: Path
) -> None:
    """The project's playbooks/remediate_auto.yml as AWX's "fleetops remediate auto" template runs it (a
    run job: --apply), through transmit | worker in the EE | process, with a policy the CLI refuses
    (exit 2, before any inventory is read): the job fails with exit 2's meaning and the CLI's error."""
    pdd = tmp_path / "job"
    (pdd / "project" / "playbooks").mkdir(parents=True)
    shutil.copy(
        REPO / "playbooks" / "remediate_auto.yml", pdd / "project" / "playbooks" / "remediate_auto.yml"
    )
    _project_tasks(pdd / "project")
    (pdd / "project" / "bad-policy.yml").write_text("schema: fleetops.policy/v0\nrules: []\n")
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts.yml").write_text(
        "all:\n  hosts:\n    gpu-1:\n      ansible_host: 192.0.2.1\n"
    )
    (pdd / "env").mkdir()
    (pdd / "env" / "extravars").write_text(
        yaml.safe_dump({"fleetops_auto_policy": "bad-policy.yml", "awx_job_id": 4444})
    )
    out = tmp_path / "processed"
    proc, seconds = _stream(image, pdd, "playbooks/remediate_auto.yml", out)
    print(f"remediate_auto.yml in the EE, refused policy: {seconds:.1f} s")
    status = (out / "artifacts" / "status").read_text().strip()
    assert status == "failed" and proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = _events(out)
    ran = [e for e in events if e["event_data"].get("task", "").startswith("Run one pass")
           and e["event"] == "runner_on_ok"]  # fmt: skip
    (run,) = ran
    res = run["event_data"]["res"]
    # the real CLI ran (argv, no shell), with --apply: a run job
    assert res["cmd"][4:8] == ["fleetops", "remediate", "auto", "--format"] and res["cmd"][-1] == "--apply"
    assert res["rc"] == 2 and "fleetops.policy/v1" in res["stderr"], res
    (failed,) = [e for e in events if e["event"] == "runner_on_failed"]
    msg = failed["event_data"]["res"]["msg"]
    assert msg.startswith("fleetops remediate auto exited 2: bad input (the policy or an option)"), msg
    (stats,) = [e for e in events if e["event"] == "playbook_on_stats"]
    artifacts = stats["event_data"]["artifact_data"]["fleetops_auto"]
    assert artifacts["exit_code"] == 2 and any("bad-policy.yml" in line for line in artifacts["error"]), (
        artifacts
    )


AUTO_POLICY = """\
schema: fleetops.policy/v1
description: an EC2 scheduled event needs a human (tests/integration/test_ee.py)
rules:
  - name: ec2-event
    match:
      - check: ec2_scheduled_event
    ladder:
      - {action: human, note: "an EC2 event: look at it"}
"""


def _auto_job(lab: Lab, pdd: Path, policy: str, check: bool, **knobs: object) -> Path:
    """A "fleetops remediate auto" job's private data dir: the project (the playbook, `policy` as
    policy.yml, the lab's EC2 config without the key and known hosts), the job's ssh key, and a check or
    run job's command line (``knobs``: more extra vars)."""
    project = pdd / "project"
    (project / "playbooks").mkdir(parents=True)
    shutil.copy(REPO / "playbooks" / "remediate_auto.yml", project / "playbooks" / "remediate_auto.yml")
    _project_tasks(project)
    (project / "policy.yml").write_text(policy)
    # the lab's EC2 config, its connection variables but the key (the job's credential) and known hosts
    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    for key in ("ansible_ssh_private_key_file", "ansible_ssh_common_args"):
        config["compose"].pop(key)
    (project / "lab.fleet_ec2.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts.yml").write_text("all:\n  hosts: {}\n")  # AWX's inventory: not this pass's
    (pdd / "env").mkdir()
    (pdd / "env" / "ssh_key").write_text(lab.key_path.read_text())
    (pdd / "env" / "ssh_key").chmod(0o600)
    # AWX's default job environment does not check host keys (AWX_TASK_ENV ANSIBLE_HOST_KEY_CHECKING)
    (pdd / "env" / "envvars").write_text(yaml.safe_dump({"ANSIBLE_HOST_KEY_CHECKING": "False"}))
    (pdd / "env" / "extravars").write_text(
        yaml.safe_dump(
            {
                "fleetops_auto_policy": "policy.yml",
                "fleetops_auto_inventory": "lab.fleet_ec2.yml",
                "fleetops_sample_seconds": 0,
                "awx_job_id": 4545,
                **knobs,
            }
        )
    )
    if check:
        (pdd / "env" / "cmdline").write_text("--check")
    return pdd


def _pass(events: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's "Run one pass" result and the pass's document from its artifacts."""
    (run,) = [
        e
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"].get("task", "").startswith("Run one pass")
    ]
    (stats,) = [e for e in events if e["event"] == "playbook_on_stats"]
    document: dict[str, Any] = stats["event_data"]["artifact_data"]["fleetops_auto"]
    res: dict[str, Any] = run["event_data"]["res"]
    return res, document


def test_remediate_auto_job_in_the_ee_scans_the_lab_fleet_and_names_the_host_that_needs_a_human(
    image: str, lab: Lab, tmp_path: Path
) -> None:
    """The "fleetops remediate auto" template's job, as an execution node runs it (the stream), a check job:
    the real `fleetops` in the EE lists the fleet through the lab's EC2 endpoint (the project's
    fleet_ec2 config), reaches the hosts with the job's machine credential (env/ssh_key: the worker's
    ssh-agent), scans them and decides by the project's policy. lab-02 carries a scheduled EC2 event,
    which that policy leaves to a human: with fleetops_auto_fail_on: human (the pass's --fail-on human; by
    default a host that waits for a person does not fail the job) the job fails naming lab-02, and its
    artifacts hold the pass (a dry run: no ladder tag written)."""
    pdd = _auto_job(lab, tmp_path / "job", AUTO_POLICY, check=True, fleetops_auto_fail_on="human")
    _, _, ec2 = _ec2(lab)
    tags_before = ec2.describe_tags()["Tags"]
    out = tmp_path / "processed"
    proc, seconds = _stream(image, pdd, "playbooks/remediate_auto.yml", out)
    print(f"remediate auto job in the EE over the lab fleet: {seconds:.1f} s")
    text = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "artifacts" / "status").read_text().strip() == "failed" and proc.returncode == 2, text
    events = _events(out)
    (run,) = [
        e
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"].get("task", "").startswith("Run one pass")
    ]
    res = run["event_data"]["res"]
    assert res["rc"] == 1 and "--apply" not in res["cmd"], res  # a check job: a dry run
    (failed,) = [e for e in events if e["event"] == "runner_on_failed"]
    msg = failed["event_data"]["res"]["msg"]
    assert msg.startswith("fleetops remediate auto exited 1: a host needs a human"), msg
    assert "Needs a human: lab-02." in msg, msg
    (stats,) = [e for e in events if e["event"] == "playbook_on_stats"]
    document = stats["event_data"]["artifact_data"]["fleetops_auto"]
    assert document["schema"] == "fleetops.auto/v1" and document["apply"] is False
    decisions = {d["host"]: d for d in document["decisions"]}
    assert sorted(decisions) == ["lab-01", "lab-02"], decisions
    assert decisions["lab-02"]["status"] == "human" and decisions["lab-02"]["check"] == "ec2_scheduled_event"
    assert decisions["lab-01"]["status"] != "human" and document["actions"] == []
    # a dry run writes no tag
    assert ec2.describe_tags()["Tags"] == tags_before


LADDER_POLICY = """\
schema: fleetops.policy/v1
description: two reclaims for an EC2 event, at most one an hour (tests/integration/test_ee.py)
budgets:
  reclaim: {window: 1h, max: 1}
rules:
  - name: ec2-event
    match:
      - check: ec2_scheduled_event
    ladder:
      - {action: reclaim, clear_after: 1s}
      - {action: reclaim, clear_after: 1h}
      - {action: human, note: "an EC2 event: look at it"}
"""


def test_remediate_auto_jobs_in_fresh_ees_carry_the_ladder_and_the_budget_in_the_ec2_tag(
    image: str, lab: Lab, tmp_path: Path
) -> None:
    """Two run jobs of the "fleetops remediate auto" template, each in a fresh EE container (an empty
    state directory), over the lab fleet. Job 1 takes lab-02's first rung (reclaim, a real rollout on
    lab-02) and records it in the instance's fleetops.io/ladder tag. Job 2 knows it only from that tag:
    lab-02 climbs to the second rung, and the policy's budget (1 reclaim an hour), spent by job 1 and
    counted from the tags (fleetops.io/spent, and the ladder's rung), holds it back, saying so."""
    _, _, ec2 = _ec2(lab)
    ids = {t["Value"]: t["ResourceId"] for t in ec2.describe_tags()["Tags"] if t["Key"] == "Name"}

    def ladder_tags(key: str = "fleetops.io/ladder") -> dict[str, str]:
        tags = ec2.describe_tags(Filters=[{"Name": "key", "Values": [key]}])["Tags"]
        names = {v: k for k, v in ids.items()}
        return {names[t["ResourceId"]]: t["Value"] for t in tags}

    def drop_ladder_tags() -> None:
        for key in ("fleetops.io/ladder", "fleetops.io/spent"):
            for name in ladder_tags(key):
                ec2.delete_tags(Resources=[ids[name]], Tags=[{"Key": key}])

    drop_ladder_tags()
    try:
        first = _auto_job(lab, tmp_path / "job1", LADDER_POLICY, check=False)
        proc, seconds = _stream(image, first, "playbooks/remediate_auto.yml", tmp_path / "out1")
        print(f"remediate auto job 1 (acts): {seconds:.1f} s")
        res, doc = _pass(_events(tmp_path / "out1"))
        text = res.get("stderr", "")[-3000:] + proc.stdout[-2000:]
        assert "--apply" in res["cmd"] and doc["apply"] is True, text
        decisions = {d["host"]: d for d in doc["decisions"]}
        assert (decisions["lab-02"]["status"], decisions["lab-02"]["action"]) == ("act", "reclaim"), decisions
        assert [(a["action"], a["hosts"]) for a in doc["actions"]] == [("reclaim", ["lab-02"])], doc[
            "actions"
        ]
        assert "lab-02" in doc["actions"][0]["attempted"], doc["actions"]
        tags = ladder_tags()
        assert set(tags) == {"lab-02"}, tags  # the ladder travels with the instance
        spent = ladder_tags("fleetops.io/spent")  # and the budget it spent, in a tag of its own
        assert list(spent) == ["lab-02"] and spent["lab-02"].startswith("reclaim:"), spent
        time.sleep(2)  # past the first rung's clear_after
        second = _auto_job(lab, tmp_path / "job2", LADDER_POLICY, check=False)
        proc, seconds = _stream(image, second, "playbooks/remediate_auto.yml", tmp_path / "out2")
        print(f"remediate auto job 2 (held by the budget): {seconds:.1f} s")
        res, doc = _pass(_events(tmp_path / "out2"))
        assert (tmp_path / "out2" / "artifacts" / "status").read_text().strip() == "successful", res
        assert res["rc"] == 0, res
        decision = {d["host"]: d for d in doc["decisions"]}["lab-02"]
        assert decision["status"] == "budget" and decision["rung"] == 2, decision  # the second rung, 1-based
        assert "reclaim" in decision["reason"], decision
        assert doc["actions"] == [], doc["actions"]
    finally:
        drop_ladder_tags()
