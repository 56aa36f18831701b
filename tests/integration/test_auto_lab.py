"""`fleetops remediate auto` over a lab fleet with real faults, through the lab's EC2 endpoint.

Four lab hosts, registered as EC2 instances of the lab's moto endpoint (``up(4, ec2=True)``):

- lab-01: a crash-looping unit (real systemd restarts);
- lab-02: a scheduled EC2 ``system-reboot`` event (the lab's proxy serves it, as AWS would);
- lab-03: a service running the real UCX 1.19 with its default, leaking setup;
- lab-04: an uncorrectable-ECC GPU fault. There is no GPU here: the lab host's ``nvidia-smi`` is the
  lab's stand-in (fleetops_lab.hardware), reading a per-host "hardware" file that an EC2 stop-start
  (new hardware) clears and a reboot keeps.

kubectl is the stand-in tests/kubectl_standin/kubectl (no Kubernetes API server runs here; it keeps
nodes in a JSON file and enforces cordon and taints). Everything else is real: the scans, the
rollouts, the EC2 API calls, the power cycles.

Pass 1 fixes lab-01 and lab-03 in software, stop-starts lab-02 and quarantines lab-04. Pass 2, after
quarantine's clear time: lab-04 climbs to stop-start, and the policy's budget (1 stop-start an hour,
spent on lab-02) holds it back, saying so; lab-02's ladder is reset and its ladder tag deleted, and a
third controller with an empty state directory is still held back by lab-02's fleetops.io/spent tag
(the budget outlives the ladder). Pass 3, with the budget raised to 2: lab-04 is stop-started,
its fault gone on "new hardware". Pass 4: every host clean, the ladders reset; lab-04 is still
quarantined until `remediate unquarantine`, which removes only our taint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.ansible.collection import module_utils
from fleetops.auto.marks import IN_FLIGHT_TAG
from fleetops_lab import Lab
from fleetops_lab.ec2 import REGION, running
from fleetops_lab.ec2sim import STOP_SECONDS_TAG, client
from fleetops_lab.hardware import inject_ecc, install_gpu
from fleetops_lab.host_faults import (
    UCX_UNFIXED_VERSION,
    ensure_ucx_wheel,
    install_crashloop_unit,
    install_worker_service,
    remove_crashloop_unit,
    remove_worker_service,
)
from tests.helpers import FLEETOPS, REPO, boots, fleetops, kill_tree
from tests.paths import KUBECTL_STANDIN

LEASE_TAG_PREFIX = module_utils("lease").KEY_PREFIX

pytestmark = pytest.mark.lab
CRASH, EVENT, UCX, ECC = "lab-01", "lab-02", "lab-03", "lab-04"
STANDIN = KUBECTL_STANDIN
KEY = "fleetops.io/quarantine"
SPENT = "fleetops.io/spent"
FOREIGN = {"key": "example.com/maintenance", "value": "nic", "effect": "NoSchedule"}

POLICY = """
schema: fleetops.policy/v1
budgets:
  stop-start: {{window: 1h, max: {stop_starts}}}
  quarantine: {{unlimited: true}}
  fix: {{unlimited: true}}
rules:
  - name: gpu-fatal
    match:
      - check: gpu_health
        severity: [critical]
        data: {{gpus.*.ecc_uncorrected_volatile: {{gte: 1}}}}
    ladder:
      - {{action: quarantine, clear_after: 1s}}
      - {{action: stop-start, clear_after: 30m}}
      - {{action: human, note: the fault survived new hardware}}
  - name: ec2-event
    match: [{{check: ec2_scheduled_event}}]
    ladder:
      - {{action: stop-start, clear_after: 30m}}
      - {{action: human}}
  - name: ucx
    match: [{{check: ucx_mmap_hooks, data: {{fixable_unit: true}}}}]
    ladder:
      - {{action: fix, clear_after: 30m, params: {{ucx_fix: hooks-off, sample_seconds: 2}}}}
      - {{action: human}}
  - name: crashloop
    match: [{{check: crashloop_unit}}]
    ladder:
      - {{action: fix, clear_after: 30m, params: {{sample_seconds: 2}}}}
      - {{action: human}}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    ensure_ucx_wheel(UCX_UNFIXED_VERSION)
    lab = Lab()
    lab.up(4, ec2=True)
    try:
        yield lab
    finally:
        remove_crashloop_unit(lab, CRASH)
        remove_worker_service(lab, UCX, name="ucx-old")
        lab.down()


def _policy(tmp_path: Path, stop_starts: int) -> str:
    path = tmp_path / f"policy-{stop_starts}.yml"
    path.write_text(POLICY.format(stop_starts=stop_starts))
    return str(path)


def _pass(
    lab: Lab, env: dict[str, str], policy: str, *extra: str, inventory: Path | None = None
) -> tuple[int, dict[str, Any], str]:
    inv = inventory if inventory is not None else lab.ec2_inventory_path()
    result = fleetops(
        "remediate", "auto", "-i", str(inv), "--policy", policy, "--sample-seconds", "3",
        "--kubectl", str(STANDIN), "--canary", "0", "--format", "json", *extra, env=env,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.rc, json.loads(result.stdout), result.stderr


def _cluster(tmp_path: Path) -> dict[str, str]:
    """The stand-in's cluster, none of its nodes cordoned: a pass given --kubectl reads its nodes."""
    kube = tmp_path / "kube.json"
    kube.write_text(json.dumps({"nodes": {h: {} for h in (CRASH, EVENT, UCX, ECC)}, "pods": [], "pdbs": []}))
    return {"FLEETOPS_KUBECTL_STATE": str(kube)}


def _ladder_tags(lab: Lab, key: str = "fleetops.io/ladder") -> dict[str, str]:
    """{Name: the tag ``key``} as EC2 itself holds them (the lab's endpoint)."""
    url = running(lab.state_dir)
    assert url is not None
    ec2 = client(url, REGION)
    out = {}
    for res in ec2.describe_instances()["Reservations"]:
        for inst in res["Instances"]:
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            if key in tags:
                out[tags["Name"]] = tags[key]
    return out


def _decisions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["host"]: d for d in doc["decisions"]}


def _actions(doc: dict[str, Any]) -> list[tuple[str, list[str], list[str]]]:
    return [(a["action"], a["hosts"], a["done"]) for a in doc["actions"]]


def test_passes_fix_software_quarantine_hardware_climb_within_budget_and_reset(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    kube = tmp_path / "kube.json"
    nodes = {h: {} for h in (CRASH, EVENT, UCX)}
    nodes[ECC] = {"taints": [FOREIGN]}  # someone else's taint: never ours to remove
    kube.write_text(json.dumps({"nodes": nodes, "pods": [], "pdbs": []}))
    env = {**env, "FLEETOPS_KUBECTL_STATE": str(kube)}
    install_crashloop_unit(lab, CRASH, restart_sec=0.5)
    install_worker_service(lab, UCX, name="ucx-old", ucx_version=UCX_UNFIXED_VERSION)
    install_gpu(lab, ECC)
    inject_ecc(lab, ECC, uncorrected=2)
    time.sleep(6)  # let the unit crash a few times
    boots_before = boots(lab, [EVENT, ECC])

    # a dry run decides the same and changes nothing, records nothing
    rc, dry, err = _pass(lab, env, _policy(tmp_path, 1))
    d = _decisions(dry)
    assert (d[CRASH]["action"], d[EVENT]["action"], d[UCX]["action"], d[ECC]["action"]) == (
        "fix", "stop-start", "fix", "quarantine",
    ), err  # fmt: skip
    assert not (Path(env["FLEETOPS_STATE_DIR"]) / "auto" / "ladder.json").exists()
    node = json.loads(kube.read_text())["nodes"][ECC]  # the stand-in fills in its defaults when it reads
    assert node["taints"] == [FOREIGN] and not node.get("unschedulable") and not node.get("annotations")

    # pass 1: software fixes, the EC2 event host stop-started, the ECC host quarantined
    rc, one, err = _pass(lab, env, _policy(tmp_path, 1), "--apply")
    assert rc == 0, err
    acted = {(a, tuple(h), tuple(done)) for a, h, done in _actions(one)}
    assert acted == {
        ("fix", (CRASH,), (CRASH,)),
        ("fix", (UCX,), (UCX,)),
        ("quarantine", (ECC,), (ECC,)),
        ("stop-start", (EVENT,), (EVENT,)),
    }, err
    node = json.loads(kube.read_text())["nodes"][ECC]
    assert node["unschedulable"] is True
    assert sorted(t["key"] for t in node["taints"]) == sorted([FOREIGN["key"], KEY])
    after_one = boots(lab, [EVENT, ECC])
    assert after_one[EVENT][1] == boots_before[EVENT][1] + 1  # powered off and on, once
    assert after_one[EVENT][0] != boots_before[EVENT][0]
    assert after_one[ECC] == boots_before[ECC]  # quarantine does not touch the host
    tags = _ladder_tags(lab)  # each host's ladder travels in its instance's tag too
    assert sorted(tags) == [CRASH, EVENT, UCX, ECC], tags
    assert tags[ECC].startswith("gpu-fatal=0:quarantine:") and tags[EVENT].startswith(
        "ec2-event=0:stop-start:"
    )
    spent = _ladder_tags(lab, SPENT)  # the budgeted actions (here only stop-start has a budget)
    assert list(spent) == [EVENT] and re.fullmatch(r"stop-start:\d+", spent[EVENT]), spent

    # pass 2, from another controller (an empty state directory, as an AWX job in a fresh container):
    # the tags say where each ladder stands, so the ECC host climbs to stop-start; the budget (1 an
    # hour), spent on lab-02 by the first controller as its tag records, says no
    rc, two, err = _pass(lab, env, _policy(tmp_path, 1), "--apply", "--state-dir", str(tmp_path / "other"))
    assert rc == 0, err
    d = _decisions(two)
    assert d[ECC]["status"] == "budget" and d[ECC]["rung_action"] == "stop-start", d[ECC]
    assert "stop-start 1/h across the fleet used" in d[ECC]["reason"]
    assert "budget: stop-start 1/h across the fleet used" in err  # the operator is told
    assert {d[h]["status"] for h in (CRASH, EVENT, UCX)} == {"clean"}, two
    assert _actions(two) == []
    assert sorted(_ladder_tags(lab)) == [ECC]  # the cleared ladders' tags are deleted
    assert _ladder_tags(lab, SPENT) == spent, err  # but lab-02's stop-start still counts for its hour

    # pass 2b, from a third fresh controller: lab-02's ladder tag is gone with its fault, and its spent tag
    # alone still holds the hour's one stop-start
    rc, two_b, err = _pass(lab, env, _policy(tmp_path, 1), "--apply", "--state-dir", str(tmp_path / "third"))
    assert rc == 0, err
    d = _decisions(two_b)
    assert d[ECC]["status"] == "budget" and "stop-start 1/h across the fleet used" in d[ECC]["reason"], d[ECC]
    assert _actions(two_b) == []

    # pass 3: the budget raised to 2: stop-start, new hardware, the fault gone, the gate passed
    rc, three, err = _pass(lab, env, _policy(tmp_path, 2), "--apply")
    assert rc == 0, err
    assert _actions(three) == [("stop-start", [ECC], [ECC])], err
    after_three = boots(lab, [ECC])
    assert after_three[ECC][1] == boots_before[ECC][1] + 1 and after_three[ECC][0] != boots_before[ECC][0]
    rc, four, err = _pass(lab, env, _policy(tmp_path, 2), "--apply")
    assert rc == 0, err
    d = _decisions(four)
    assert {x["status"] for x in d.values()} == {"clean"}, four
    assert "gpu-fatal" in d[ECC]["still_quarantined"]
    assert json.loads((Path(env["FLEETOPS_STATE_DIR"]) / "auto" / "ladder.json").read_text())["hosts"] == {}
    assert _ladder_tags(lab) == {}
    spent = _ladder_tags(lab, SPENT)  # both stop-starts of this hour, on the hosts they were taken on
    assert sorted(spent) == [EVENT, ECC] and all(re.fullmatch(r"stop-start:\d+", v) for v in spent.values())

    # the quarantine is released by a person: only our taint and cordon go
    freed = fleetops(
        "remediate", "unquarantine", "-i", str(lab.ec2_inventory_path()), "-l", ECC, "--apply",
        "--kubectl", str(STANDIN), "--sample-seconds", "2", "--canary", "0", env=env,
    )  # fmt: skip
    assert freed.rc == 0, freed.stderr
    node = json.loads(kube.read_text())["nodes"][ECC]
    assert node["taints"] == [FOREIGN] and node.get("unschedulable") is False


def test_a_pause_from_one_controller_holds_a_pass_on_another_until_unpaused(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """The shared store: DynamoDB served by the lab's endpoint (moto, behind the lab's EC2 proxy), named by
    FLEETOPS_STORE_TABLE beside the EC2 source. One controller pauses; an auto pass on another (a fresh
    state directory, as an AWX job in a new container) decides but acts on nothing (exit 5); after
    unpause, the next acts."""
    env = {**env, "FLEETOPS_STORE_TABLE": "fleetops-lab-pause", **_cluster(tmp_path)}
    inv = str(lab.ec2_inventory_path())
    unit = install_crashloop_unit(lab, CRASH, name="pauser", restart_sec=0.5)
    try:
        time.sleep(4)  # a few restarts
        paused = fleetops("pause", "-i", inv, "--reason", "lab: driver rollout", env=env)
        assert paused.rc == 0 and "automation paused by" in paused.stderr, paused.stderr
        rc, held, err = _pass(
            lab, env, _policy(tmp_path, 2), "--apply", "-l", CRASH, "--state-dir", str(tmp_path / "b")
        )
        assert rc == 5, err
        assert _decisions(held)[CRASH]["action"] == "fix" and _actions(held) == [], err
        assert "lab: driver rollout" in held["store"]["paused"]
        assert lab.run(CRASH, f"systemctl is-enabled {unit}").stdout.strip() == "enabled"

        lifted = fleetops("unpause", "-i", inv, "--reason", "rollout done", env=env)
        assert lifted.rc == 0, lifted.stderr
        rc, acted, err = _pass(
            lab, env, _policy(tmp_path, 2), "--apply", "-l", CRASH, "--state-dir", str(tmp_path / "c")
        )
        assert rc == 0, err
        assert _actions(acted) == [("fix", [CRASH], [CRASH])], err
        assert lab.run(CRASH, f"systemctl is-enabled {unit}").stdout.strip() == "masked"
    finally:
        remove_crashloop_unit(lab, CRASH, name="pauser")


KILL_POLICY = """
schema: fleetops.policy/v1
budgets:
  stop-start: {window: 1h, max: 5}
rules:
  - name: crashloop
    match: [{check: crashloop_unit}]
    ladder:
      - {action: stop-start, clear_after: 30m}
      - {action: human}
"""


def _instance(lab: Lab, name: str) -> dict[str, Any]:
    url = running(lab.state_dir)
    assert url is not None
    answer = client(url, REGION).describe_instances(Filters=[{"Name": "tag:Name", "Values": [name]}])
    (instance,) = [i for r in answer["Reservations"] for i in r["Instances"]]
    return dict(instance)


def _leases(lab: Lab, name: str) -> list[str]:
    """The rollout lease tags (``fleetops:lease:*``) on ``name``'s instance."""
    return [t["Key"] for t in _instance(lab, name).get("Tags") or [] if t["Key"].startswith(LEASE_TAG_PREFIX)]


def test_a_pass_killed_after_a_stop_start_stopped_its_instance_is_finished_by_the_next(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL (the controller and its ansible run) while the pass's stop-start is stopping lab-01's
    instance. A new pass — another state directory, an inventory that lists only running instances, so
    lab-01 is not in it — finds the dead pass's reservation in the shared store, starts the instance,
    and touches nothing else. It releases the dead pass's rollout lease on the instance (its process here
    is gone): the next test's controller, without a store, reads the tags alone and takes it at once."""
    env = {**env, "FLEETOPS_STORE_TABLE": "fleetops-lab-inflight", **_cluster(tmp_path)}
    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    config["filters"]["instance-state-name"] = ["running"]  # as AWX's inventory of running instances
    inv = tmp_path / "running.fleet_ec2.yml"
    inv.write_text(yaml.safe_dump(config))
    policy = tmp_path / "kill.yml"
    policy.write_text(KILL_POLICY)
    install_crashloop_unit(lab, CRASH, name="killed", restart_sec=0.5)
    iid = _instance(lab, CRASH)["InstanceId"]
    url = running(lab.state_dir)
    assert url is not None
    client(url, REGION).create_tags(Resources=[iid], Tags=[{"Key": STOP_SECONDS_TAG, "Value": "15"}])
    others = [EVENT, UCX, ECC]
    before = boots(lab, others)
    try:
        time.sleep(4)  # a few restarts
        argv = [str(FLEETOPS), "remediate", "auto", "-i", str(inv), "--policy", str(policy), "--apply",
                "-l", CRASH, "--canary", "0", "--sample-seconds", "2", "--state-dir", str(tmp_path / "dead")]  # fmt: skip
        first = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        try:
            deadline, seen = time.monotonic() + 180, ""
            while time.monotonic() < deadline and first.poll() is None:
                seen = _instance(lab, CRASH)["State"]["Name"]
                if seen == "stopping":
                    break
                time.sleep(0.2)
            kill_tree(first.pid)  # the CLI and ansible-playbook (a session of its own) with it
        finally:
            first.wait(timeout=30)
        assert seen == "stopping", (seen, first.stderr.read() if first.stderr else "")
        deadline = time.monotonic() + 60
        while _instance(lab, CRASH)["State"]["Name"] != "stopped" and time.monotonic() < deadline:
            time.sleep(1)
        assert _instance(lab, CRASH)["State"]["Name"] == "stopped"  # and nobody starts it

        rc, doc, err = _pass(
            lab, env, str(policy), "--apply", "--state-dir", str(tmp_path / "fresh"), inventory=inv
        )
        assert rc == 0, err
        assert CRASH not in _decisions(doc)  # not in the inventory: stopped when it was listed
        assert [line.split(":")[0] for line in doc["store"]["finished"]] == [f"{CRASH} ({iid})"], err
        assert len(doc["store"]["recovered"]) == 1 and doc["store"]["recovered"][0].startswith(
            f"{CRASH}: stop-start"
        )
        assert "took over the shared store's lease" in err  # the dead pass's, at once: its PID is gone
        assert _actions(doc) == []  # nothing else is touched
        assert _instance(lab, CRASH)["State"]["Name"] == "running"
        assert _leases(lab, CRASH) == [], err  # the dead rollout's lease released (its process is gone)
        deadline = time.monotonic() + 120
        while lab.run(CRASH, "true").returncode != 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert boots(lab, others) == before
    finally:
        remove_crashloop_unit(lab, CRASH, name="killed")


def test_without_a_store_a_pass_killed_after_a_stop_start_stopped_its_instance_is_finished_by_the_next(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """The same kill with no shared store (issue 38, item 11): the dead pass marked lab-01's instance
    (tag ``fleetops:in-flight``) before its stop. A new pass — an empty state directory, an inventory of
    running instances that does not list lab-01 — finds the mark with one filtered DescribeInstances
    call, starts the instance, removes the mark, and touches nothing else."""
    env = {k: v for k, v in {**env, **_cluster(tmp_path)}.items() if not k.startswith("FLEETOPS_STORE")}
    config = yaml.safe_load(lab.ec2_inventory_path().read_text())
    config.pop("store_table", None)
    config["filters"]["instance-state-name"] = ["running"]  # as AWX's inventory of running instances
    inv = tmp_path / "running.fleet_ec2.yml"
    inv.write_text(yaml.safe_dump(config))
    policy = tmp_path / "kill.yml"
    policy.write_text(KILL_POLICY)
    install_crashloop_unit(lab, CRASH, name="nostore", restart_sec=0.5)
    iid = _instance(lab, CRASH)["InstanceId"]
    url = running(lab.state_dir)
    assert url is not None
    client(url, REGION).create_tags(Resources=[iid], Tags=[{"Key": STOP_SECONDS_TAG, "Value": "15"}])
    others = [EVENT, UCX, ECC]
    before = boots(lab, others)
    try:
        time.sleep(4)  # a few restarts
        argv = [str(FLEETOPS), "remediate", "auto", "-i", str(inv), "--policy", str(policy), "--apply",
                "-l", CRASH, "--canary", "0", "--sample-seconds", "2", "--state-dir", str(tmp_path / "dead")]  # fmt: skip
        first = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        try:
            deadline, seen = time.monotonic() + 180, ""
            while time.monotonic() < deadline and first.poll() is None:
                seen = _instance(lab, CRASH)["State"]["Name"]
                if seen == "stopping":
                    break
                time.sleep(0.2)
            kill_tree(first.pid)  # the CLI and ansible-playbook (a session of its own) with it
        finally:
            first.wait(timeout=30)
        assert seen == "stopping", (seen, first.stderr.read() if first.stderr else "")
        deadline = time.monotonic() + 60
        while _instance(lab, CRASH)["State"]["Name"] != "stopped" and time.monotonic() < deadline:
            time.sleep(1)
        assert _instance(lab, CRASH)["State"]["Name"] == "stopped"  # and nobody starts it
        tags = {t["Key"]: t["Value"] for t in _instance(lab, CRASH).get("Tags") or []}
        assert json.loads(tags[IN_FLIGHT_TAG])["action"] == "stop-start"

        rc, doc, err = _pass(
            lab, env, str(policy), "--apply", "--state-dir", str(tmp_path / "fresh"), inventory=inv
        )
        assert rc == 0, err
        assert "store" not in doc
        assert CRASH not in _decisions(doc)  # not in the inventory: stopped when it was listed
        assert [line.split(":")[0] for line in doc["in_flight"]["finished"]] == [f"{CRASH} ({iid})"], err
        assert "no shared store: the records of this pass" in err
        assert _actions(doc) == []  # nothing else is touched
        assert _instance(lab, CRASH)["State"]["Name"] == "running"
        assert IN_FLIGHT_TAG not in {t["Key"] for t in _instance(lab, CRASH).get("Tags") or []}
        deadline = time.monotonic() + 120
        while lab.run(CRASH, "true").returncode != 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert boots(lab, others) == before
    finally:
        remove_crashloop_unit(lab, CRASH, name="nostore")
