"""The rollout engine on real lab hosts: AZ-capped rolling reboots, gates, breaker, lock, resume.

Six systemd-nspawn hosts in two lab AZs (fleetops_az lab-1a / lab-1b). Reboots are real (the guest's
systemd reboots, nspawn exits 133 and the lab restarts it): every boot id changes and the guest's
persistent journal counts boots, so "rebooted exactly once" is read from the hosts themselves.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.lab import Lab
from tests.helpers import FLEETOPS, REPO, fleetops

pytestmark = pytest.mark.lab
HOSTS = [f"lab-{i:02d}" for i in range(1, 7)]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(6)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "FLEETOPS_STATE_DIR": str(tmp_path / "state"),
        "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }


def _boots(lab: Lab) -> dict[str, tuple[str, int]]:
    """Each host's (boot id, number of boots in its persistent journal)."""
    out = {}
    for host in HOSTS:
        text = lab.run(
            host,
            "cat /proc/sys/kernel/random/boot_id; journalctl --list-boots --no-pager -q | wc -l",
            check=True,
        ).stdout.split()
        out[host] = (text[0], int(text[1]))
    return out


def _az(host: str) -> str:
    return "lab-1a" if int(host[-2:]) % 2 else "lab-1b"


def _reboot(lab: Lab, env: dict[str, str], *extra: str, timeout: float = 600) -> Any:
    return fleetops(
        "remediate", "reboot", "-i", str(lab.inventory_path()), "--apply", "--per-group-max", "1",
        "--max-parallel", "100%", "--cooldown", "0", "--format", "json", *extra, env=env, timeout=timeout,
    )  # fmt: skip


def _audit(env: dict[str, str]) -> list[dict[str, Any]]:
    path = Path(env["FLEETOPS_AUDIT_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_rolling_reboot_caps_each_az_and_reboots_every_host_once(lab: Lab, env: dict[str, str]) -> None:
    before = _boots(lab)
    result = _reboot(lab, env, "--canary", "1")
    assert result.rc == 0, result.stderr
    report = result.json()
    assert report["status"] == "done"
    batches = [b["hosts"] for b in report["batches"]]
    assert len(batches[0]) == 1  # the canary
    assert sorted(h for b in batches for h in b) == HOSTS
    for batch in batches:  # never two hosts of one AZ at once
        azs = [_az(h) for h in batch]
        assert len(azs) == len(set(azs)), batches
    assert len(batches) == report["plan"]["lower_bound"] == 4

    after = _boots(lab)
    for host in HOSTS:
        assert after[host][0] != before[host][0], host  # boot id changed
        assert after[host][1] == before[host][1] + 1, host  # exactly one more boot

    # The audit log has one entry per host, with the boot ids before and after, in batch order.
    entries = _audit(env)
    assert sorted(e["host"] for e in entries) == HOSTS
    for e in entries:
        assert e["action"] == "reboot" and e["result"]["status"] == "ok"
        assert e["before"]["boot_id"] == before[e["host"]][0]
        assert e["after"]["boot_id"] == after[e["host"]][0]
    # Batches ran one after the other: a batch's reboots all finished before the next began.
    windows = [(b["started"], b["finished"]) for b in report["batches"]]
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert end <= start


def _nsenter_ssh(lab: Lab, host: str, action: str) -> None:
    """Repair or break a guest from this machine (ssh may be down): enter its namespaces."""
    (status,) = [h for h in lab.status(probe_ssh=False) if h.name == host]
    assert status.pid
    child = subprocess.run(["pgrep", "-P", str(status.pid)], capture_output=True, text=True, check=True)
    init = child.stdout.split()[0]
    subprocess.run(
        ["nsenter", "-t", init, "-m", "-u", "-i", "-n", "-p", "systemctl", *action.split()],
        check=True,
        timeout=60,
    )


def test_host_that_does_not_come_back_trips_the_breaker_and_resume_finishes(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    state = tmp_path / "rollout.json"
    # lab-03 will not come back: its sshd is disabled before the reboot.
    lab.run("lab-03", "systemctl disable ssh.service", check=True)
    before = _boots(lab)
    result = _reboot(lab, env, "--canary", "1", "--reboot-timeout", "20", "--state", str(state))
    try:
        assert result.rc == 3, result.stderr
        report = result.json()
        assert report["status"] == "stopped"
        assert report["hosts"]["lab-03"] == "failed"
        pending = report["stopped"]["pending"]
        assert pending, report["stopped"]
        mid = _boots_of(lab, [h for h in HOSTS if h != "lab-03"])
        for host in pending:  # no host after the failure was touched
            assert mid[host] == before[host], host
    finally:
        _nsenter_ssh(lab, "lab-03", "enable --now ssh.service")  # repair
    resumed = fleetops("remediate", "--resume", str(state), "--format", "json", env=env, timeout=600)
    assert resumed.rc == 0, resumed.stderr
    done = resumed.json()
    assert done["status"] == "done"
    assert set(done["hosts"].values()) == {"done"}
    after = _boots(lab)
    for host in HOSTS:
        assert after[host][1] == before[host][1] + 1, host  # every host exactly once, lab-03 included


def _boots_of(lab: Lab, hosts: list[str]) -> dict[str, tuple[str, int]]:
    all_boots = {}
    for host in hosts:
        text = lab.run(
            host,
            "cat /proc/sys/kernel/random/boot_id; journalctl --list-boots --no-pager -q | wc -l",
            check=True,
        ).stdout.split()
        all_boots[host] = (text[0], int(text[1]))
    return all_boots


def test_lock_refuses_a_second_rollout_and_a_killed_rollout_resumes_without_double_reboots(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    state = tmp_path / "killed.json"
    before = _boots(lab)
    first = subprocess.Popen(
        [str(FLEETOPS), "remediate", "reboot", "-i", str(lab.inventory_path()), "--apply", "--per-group-max", "1",
         "--max-parallel", "100%", "--canary", "1", "--cooldown", "3", "--state", str(state)],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        # wait until it holds the locks and is inside a batch
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if state.exists() and "running" in json.loads(state.read_text())["hosts"].values():
                break
            time.sleep(0.2)
        else:
            pytest.fail("the first rollout never started a batch")
        second = _reboot(lab, env, "--canary", "1")
        assert second.rc == 4, second.stderr
        assert "held by another rollout" in second.stderr
        time.sleep(1.0)  # mid-batch: the reboot is under way
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=30)
    caught = json.loads(state.read_text())
    assert caught["status"] == "running"  # killed: it never got to write anything else
    resumed = fleetops("remediate", "--resume", str(state), "--format", "json", env=env, timeout=600)
    assert resumed.rc == 0, resumed.stderr
    assert resumed.json()["status"] == "done"
    after = _boots(lab)
    for host in HOSTS:
        assert after[host][1] == before[host][1] + 1, host  # no host lost, none rebooted twice


def test_preflight_refuses_when_too_many_hosts_are_unreachable_and_changes_nothing(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    group = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    group["lab-ghost"] = {"ansible_host": "10.213.0.250"}  # in the lab's subnet, nobody there
    # a host whose key does not match what known_hosts says (a rebuilt host, or worse)
    bad_known = tmp_path / "known_hosts"
    bad_known.write_text(
        "10.213.0.139 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    group["lab-02"] = {
        **group["lab-02"],
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={bad_known} -o StrictHostKeyChecking=yes",
    }
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(inventory))
    before = _boots(lab)
    refused = fleetops("remediate", "reboot", "-i", str(inv), "--apply", env=env, timeout=300)
    assert refused.rc == 3, refused.stderr
    assert "preflight found 2 of 7 host(s) unreachable, more than the 0 allowed" in refused.stderr
    assert "lab-ghost: unreachable" in refused.stderr
    assert "lab-02: host key mismatch" in refused.stderr
    assert _boots(lab) == before  # nothing was changed
    assert not list(Path(env["FLEETOPS_STATE_DIR"]).glob("locks/*.lock"))

    # Allowed to leave them out: the rest is remediated, the two are reported as skipped.
    state = tmp_path / "reclaim.json"
    ok = fleetops(
        "remediate", "reclaim", "-i", str(inv), "--apply", "--preflight-max-unreachable", "2", "--max-parallel",
        "100%", "--per-group-max", "none", "--canary", "0", "--state", str(state), "--format", "json",
        env=env, timeout=300,
    )  # fmt: skip
    assert ok.rc == 0, ok.stderr
    report = ok.json()
    assert report["hosts"]["lab-ghost"] == "skipped" and report["hosts"]["lab-02"] == "skipped"
    assert all(report["hosts"][h] == "done" for h in HOSTS if h != "lab-02")
    summary = fleetops("report", str(state), env=env)
    assert summary.rc == 0, summary.stderr
    assert "status done" in summary.stdout and "skipped" in summary.stdout
