"""Quarantine's Slurm backend against a real Slurm 22.05 cluster on the lab (``fleetops-lab up 3 --slurm``:
slurmctld on lab-01, slurmd and munged on every host) and this machine's real scontrol (slurm-client),
authenticated by the lab's munged: nothing here is a stand-in.

A job runs on lab-02; an uncorrectable ECC error there (the lab's stand-in GPU) and one `remediate auto`
pass drain lab-02 with our reason while the job runs (DRAINING); the next pass's reboot rung waits for
DRAINED, which comes once the job ends (no job is cancelled); after the fix, unquarantine resumes it and a
new job runs there. lab-03, drained by an admin with another reason and in lab-02's group here, counts
against the floor (the pass reads it from scontrol) and is neither re-reasoned by a quarantine nor resumed
by the unquarantine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.fleetops.node.plugins.module_utils import slurm

from fleetops_lab import Lab
from fleetops_lab import slurm as lab_slurm
from fleetops_lab.hardware import clear_hardware, inject_ecc, install_gpu
from tests.helpers import fleetops

pytestmark = pytest.mark.lab
SICK, ADMIN, OTHER = "lab-02", "lab-03", "lab-01"
JOB_MAX_S = 120  # the job's own limit; the test ends it sooner (DONE_FILE) once DRAINING is seen
DONE_FILE = "/tmp/fleetops-test-job-done"
ADMIN_REASON = "admin: firmware update"
POLICY = """
schema: fleetops.policy/v1
budgets:
  quarantine: {unlimited: true}
  reboot: {unlimited: true}
floor: {min_available_pct: 0, min_available: 0}
rules:
  - name: gpu-fatal
    match: [{check: gpu_health, severity: [critical]}]
    ladder:
      - {action: quarantine, clear_after: 1s}
      - {action: reboot, clear_after: 30m}
      - {action: human}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(3, slurm=True)
    try:
        yield lab
    finally:
        lab.down()


def _scontrol(lab: Lab, *args: str) -> str:
    proc = subprocess.run(
        ["scontrol", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, **lab_slurm.controller_env(lab.state_dir)},
    )
    return proc.stdout


def _node(lab: Lab, name: str) -> dict[str, Any]:
    node = slurm.parse_show_node(_scontrol(lab, "show", "node", name))
    assert node is not None
    return node


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.3)


def _long_job(lab: Lab, node: str) -> str:
    """A job on ``node`` that ends on its own (exit 0) once DONE_FILE exists there: the test decides when the
    job ends without cancelling it, so the quarantine's time on a busy machine cannot outlast it."""
    wrap = f"for i in $(seq {JOB_MAX_S * 5}); do [ -e {DONE_FILE} ] && exit 0; sleep 0.2; done"
    argv = [*lab_slurm.submit_argv(node, 1)[:-1], f"--wrap={wrap}"]
    proc = lab.run(lab_slurm.CONTROLLER_HOST, argv, check=True, timeout=30)
    return proc.stdout.strip().split(";")[0]


def _job(lab: Lab, job: str) -> dict[str, str]:
    words = _scontrol(lab, "show", "job", "--oneliner", job).split()
    return dict(w.split("=", 1) for w in words if "=" in w)


def test_quarantine_drains_our_node_as_its_job_ends_and_unquarantine_resumes_only_ours(
    lab: Lab, tmp_path: Path, env: dict[str, str]
) -> None:
    # Each host picks its backend in the inventory: every lab host is a Slurm node here.
    backend = tmp_path / "slurm.yml"
    # lab-03 joins lab-02's group (AZ) here, so its drain counts against lab-02's floor
    backend.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {"fleetops_lab": {"vars": {"fleetops_quarantine_backend": "slurm"}}},
                    "hosts": {ADMIN: {"fleetops_az": "lab-1b"}},
                }
            }
        )
    )
    common = ("-i", str(lab.inventory_path()), "-i", str(backend), "--apply", "--format", "json")
    hosts = ("-l", f"{SICK},{ADMIN}", "--per-group-max", "none", "--max-parallel", "2", "--canary", "0")

    _scontrol(lab, "update", f"NodeName={ADMIN}", "State=DRAIN", f"Reason={ADMIN_REASON}")
    lab.run(SICK, ["rm", "-f", DONE_FILE], check=True)
    job = _long_job(lab, SICK)
    _wait("the job runs on lab-02", lambda: _job(lab, job).get("JobState") == "RUNNING", 30)

    # A dry run changes nothing; a node name Slurm does not know fails only its host, with scontrol's cause.
    unknown = tmp_path / "unknown.yml"
    unknown.write_text(yaml.safe_dump({"all": {"hosts": {OTHER: {"fleetops_slurm_node": "lab-99"}}}}))
    both = ("-l", f"{OTHER},{SICK}", "--per-group-max", "none", "--max-parallel", "2", "--canary", "0")
    dry = fleetops(
        "remediate", "quarantine", *common[:4], "-i", str(unknown), "--format", "json", *both,
        "--finding", "gpu_health", env=env,
    )  # fmt: skip
    assert dry.rc != 0
    dry_results = {h: r for b in json.loads(dry.stdout)["batches"] for h, r in b["results"].items()}
    assert dry_results[OTHER]["status"] == "failed"
    assert (
        "Failed to drain Slurm node lab-99: scontrol show node: Node lab-99 not found"
        in dry_results[OTHER]["msg"]
    )
    assert dry_results[SICK]["status"] == "ok" and dry_results[SICK]["changed"] is True
    assert any("dry run: slurm node lab-02: would drain" in n for n in dry_results[SICK]["notes"])
    for name in (OTHER, SICK):
        node = _node(lab, name)
        assert (slurm.phase(node), node["reason"], node["comment"]) == ("in", "", ""), name

    # One auto pass: the ECC fault on lab-02 is quarantined: drained with our reason while its job runs.
    install_gpu(lab, SICK)
    inject_ecc(lab, SICK, uncorrected=1)
    policy = tmp_path / "policy.yml"
    policy.write_text(POLICY)
    auto = (
        "remediate",
        "auto",
        *common[:4],
        "--policy",
        str(policy),
        "--sample-seconds",
        "1",
        "--canary",
        "0",
    )
    first = fleetops(*auto, "--apply", "--format", "json", env=env)
    assert first.rc == 0, first.stderr
    one = json.loads(first.stdout)
    assert [(a["action"], a["done"]) for a in one["actions"]] == [("quarantine", [SICK])], first.stderr
    sick = _node(lab, SICK)
    assert _job(lab, job).get("JobState") == "RUNNING"  # asserted after the read: it was running throughout
    assert slurm.phase(sick) == "draining" and sick["reason"].startswith("fleetops: gpu_health: "), sick
    assert slurm.parse_record(sick["comment"])["check"] == "gpu_health"  # type: ignore[index]
    # the admin's drain, read from scontrol by the pass, counts against lab-02's group
    assert one["nodes"]["out"] == {
        ADMIN: {"backend": "slurm", "node": ADMIN, "phase": "drained", "ours": False, "reason": ADMIN_REASON}
    }, one["nodes"]
    (group,) = [c for c in one["capacity"] if c["group"] == "lab-1b"]
    assert group["unavailable"] == {ADMIN: f"slurm drained by someone else, reason: {ADMIN_REASON}"}, group
    ours = sick["reason"]

    # The next pass: the ladder's next rung (reboot) waits while the job runs; nothing is started.
    second = fleetops(*auto, "--apply", "--format", "json", env=env)
    assert second.rc == 0, second.stderr
    two = json.loads(second.stdout)
    (waits,) = [d for d in two["decisions"] if d["host"] == SICK]
    assert (waits["status"], waits["rung_action"]) == ("wait", "reboot"), waits
    assert "waits for Slurm node lab-02 to drain (its jobs still run)" in waits["reason"]
    assert two["actions"] == [] and _job(lab, job).get("JobState") == "RUNNING"
    drained = two["nodes"]["out"][SICK]
    since = drained.pop("since")  # when fleetops drained it, from our record in the node's Comment
    assert drained == {"backend": "slurm", "node": SICK, "phase": "draining", "ours": True, "reason": ours}
    assert abs(since - time.time()) < 300, since

    # The job is not cancelled: it ends on its own, and then the node is DRAINED with our reason.
    time.sleep(1)
    assert slurm.phase(_node(lab, SICK)) == "draining"
    lab.run(SICK, ["touch", DONE_FILE], check=True)
    _wait("lab-02 drained", lambda: slurm.phase(_node(lab, SICK)) == "drained", 30)
    assert _job(lab, job)["JobState"] == "COMPLETED"
    assert _node(lab, SICK)["reason"] == ours

    # A scan shows each host's node as Slurm has it (one scontrol call on this machine), whose drain it is.
    scan = fleetops(
        "scan", *common[:4], "--transport", "ssh", "--format", "json", "--sample-seconds", "0", env=env
    )
    assert scan.rc == 1, scan.stderr  # lab-02's ECC finding; every node read
    nodes = {h: e["node"] for h, e in json.loads(scan.stdout)["hosts"].items()}
    assert {h: (n["phase"], n["ours"], n["reason"]) for h, n in nodes.items()} == {
        SICK: ("drained", True, ours),
        ADMIN: ("drained", False, ADMIN_REASON),
        OTHER: ("in", False, ""),
    }, nodes

    # A quarantine of the drained node changes nothing (our reason and record stay); the admin's node is left
    # alone, its reason not overwritten.
    again = fleetops(
        "remediate", "quarantine", *common, *hosts, "--finding", "gpu_health", "--reason", "1 uncorrectable ECC error",
        env=env,
    )  # fmt: skip
    assert again.rc == 0, again.stderr
    assert _node(lab, SICK)["reason"] == ours
    admin = _node(lab, ADMIN)
    assert (slurm.phase(admin), admin["reason"], admin["comment"]) == ("drained", ADMIN_REASON, "")
    results = {h: r for b in json.loads(again.stdout)["batches"] for h, r in b["results"].items()}
    assert results[SICK]["changed"] is False and results[ADMIN]["changed"] is False
    assert any("left alone: drained by someone else" in n for n in results[ADMIN]["notes"])

    assert clear_hardware(lab, SICK)  # the fix: the GPU is replaced

    freed = fleetops("remediate", "unquarantine", *common, *hosts, "--sample-seconds", "1", env=env)
    assert freed.rc == 0, freed.stderr
    sick = _node(lab, SICK)
    assert (slurm.phase(sick), sick["reason"], sick["comment"]) == ("in", "", "")
    admin = _node(lab, ADMIN)
    assert (slurm.phase(admin), admin["reason"]) == (
        "drained",
        ADMIN_REASON,
    )  # neither resumed nor re-reasoned
    assert _node(lab, OTHER)["reason"] == ""  # never touched

    after = lab_slurm.submit(lab.run, SICK, 1)
    _wait("a new job ran on lab-02", lambda: _job(lab, after).get("JobState") == "COMPLETED", 30)
    assert _job(lab, after)["NodeList"] == SICK


def test_evict_requeues_the_jobs_of_a_node_fleetops_drains_and_of_no_other(
    lab: Lab, tmp_path: Path, env: dict[str, str]
) -> None:
    """`quarantine --evict` on a Slurm host: the node is drained and its running job requeued (Slurm kills
    it and queues it again; pinned to this node, it waits); an admin's drained node keeps its job. Before
    that, the admin's drain holds a reboot of its group (the rollout's capacity floor reads scontrol)."""
    backend = tmp_path / "slurm.yml"
    backend.write_text(yaml.safe_dump({"all": {"vars": {"fleetops_quarantine_backend": "slurm"}}}))
    inv = ("-i", str(lab.inventory_path()), "-i", str(backend))
    for name in (OTHER, ADMIN):
        lab.run(name, ["rm", "-f", DONE_FILE], check=True)
    if slurm.phase(_node(lab, ADMIN)) != "in":  # the test above leaves it drained by its admin
        _scontrol(lab, "update", f"NodeName={ADMIN}", "State=RESUME")
    ours, theirs = _long_job(lab, OTHER), _long_job(lab, ADMIN)
    try:
        _wait(
            "both jobs run", lambda: {_job(lab, j).get("JobState") for j in (ours, theirs)} == {"RUNNING"}, 30
        )
        _scontrol(lab, "update", f"NodeName={ADMIN}", "State=DRAIN", f"Reason={ADMIN_REASON}")
        # the admin's drain takes capacity from lab-01's group (lab-1a): a reboot of lab-01 that allows no
        # unhealthy host there is held before its batch, read from scontrol; nothing is rebooted
        held = fleetops("remediate", "reboot", *inv, "-l", OTHER, "--max-unhealthy", "0", "--canary", "0",
                        "--apply", "--format", "json", env=env)  # fmt: skip
        assert held.rc == 3, held.stderr
        stopped = json.loads(held.stdout)["stopped"]
        assert stopped["reason"].startswith(f"group lab-1a: 1 of its 2 hosts are unhealthy ({ADMIN})"), (
            stopped
        )
        assert stopped["pending"] == [OTHER] and _job(lab, ours)["JobState"] == "RUNNING"
        hosts = ("-l", f"{OTHER},{ADMIN}", "--per-group-max", "none", "--max-parallel", "2", "--canary", "0")
        quarantine = (
            "remediate",
            "quarantine",
            *inv,
            *hosts,
            "--finding",
            "gpu_health",
            "--evict",
            "--format",
            "json",
        )
        dry = fleetops(*quarantine, env=env)
        assert dry.rc == 0, dry.stderr
        notes = {h: r["notes"] for b in json.loads(dry.stdout)["batches"] for h, r in b["results"].items()}
        assert any(f"would requeue job(s) {ours}" in n for n in notes[OTHER]), notes
        assert _job(lab, ours)["JobState"] == "RUNNING"  # a dry run requeues nothing

        # a quarantine with evict cut off after its drain (a pass killed mid-batch): the node is ours and
        # drained, its job still running; the next pass runs the quarantine with evict again, which must
        # requeue the job on a node fleetops already drained (issue 25: a cut-off drain is drained again)
        # lab-01 is in service with an old record of ours in its Comment (an admin resumed our drain of it a
        # month ago): the drain writes a fresh record, never reuses the old one, whose time would make a
        # rung's drain_wait already past (issue 38)
        old = slurm.encode_record("gpu_health", "20261101T000000Z-abcdef", "2026-11-01T00:00:00Z")
        _scontrol(lab, "update", f"NodeName={OTHER}", f"Comment={old}")
        first = fleetops("remediate", "quarantine", *inv, "-l", OTHER, "--canary", "0", "--finding", "gpu_health",
                         "--apply", env=env)  # fmt: skip
        assert first.rc == 0, first.stderr
        assert slurm.phase(_node(lab, OTHER)) == "draining" and _job(lab, ours)["JobState"] == "RUNNING"
        record = slurm.parse_record(_node(lab, OTHER)["comment"])
        assert record is not None and record["rollout"] != "20261101T000000Z-abcdef", record
        drained_at = datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert abs(drained_at.timestamp() - time.time()) < 300, record
        done = fleetops(*quarantine, "--apply", env=env)
        assert done.rc == 0, done.stderr
        notes = {h: r["notes"] for b in json.loads(done.stdout)["batches"] for h, r in b["results"].items()}
        assert any(f"requeued job(s) {ours}" in n for n in notes[OTHER]), notes
        _wait("lab-01 drained, its job requeued", lambda: slurm.phase(_node(lab, OTHER)) == "drained", 30)
        job = _job(lab, ours)
        assert job["JobState"] in ("PENDING", "REQUEUED") and int(job["Restarts"]) >= 1, job
        node = _node(lab, OTHER)
        assert node["reason"].startswith("fleetops: gpu_health") and slurm.parse_record(node["comment"]), node
        # someone else's drain: left alone, its job untouched
        assert _job(lab, theirs)["JobState"] == "RUNNING" and _job(lab, theirs)["Restarts"] == "0"
        assert _node(lab, ADMIN)["reason"] == ADMIN_REASON
        assert any("left alone: drained by someone else" in n for n in notes[ADMIN]), notes
    finally:
        subprocess.run(
            ["scancel", ours, theirs], env={**os.environ, **lab_slurm.controller_env(lab.state_dir)}, check=False,
            capture_output=True, timeout=30,
        )  # fmt: skip
    freed = fleetops("remediate", "unquarantine", *inv, "-l", OTHER, "--canary", "0", "--sample-seconds", "1",
                     "--apply", env=env)  # fmt: skip
    assert freed.rc == 0, freed.stderr
    assert slurm.phase(_node(lab, OTHER)) == "in"
