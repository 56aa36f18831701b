"""Rollout safety guards (issue 14) on real lab hosts: a hostile inventory name is refused up front,
and SIGTERM mid-batch aborts at once, releases the lock, and a resume finishes with every host
rebooted exactly once (boots counted from each host's persistent journal, as test_rollout_lab does).

In this worker's lab (FLEETOPS_LAB: tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops_lab import Lab
from tests.helpers import FLEETOPS, REPO, boots, fleetops, wait_for_a_batch

pytestmark = pytest.mark.lab
HOSTS = ["lab-01", "lab-02", "lab-03"]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(3)
    try:
        yield lab
    finally:
        lab.down()


def _boots(lab: Lab) -> dict[str, tuple[str, int]]:
    """Each host's (boot id, number of boots in its persistent journal)."""
    return boots(lab, HOSTS)


def _run_processes(env: dict[str, str]) -> list[str]:
    """Processes of this test's fleetops ansible runs still alive (they carry FLEETOPS_RUN_DIR and the
    test's own FLEETOPS_STATE_DIR: other labs' runs go on beside it), but ssh masters."""
    mine = f"\0FLEETOPS_STATE_DIR={env['FLEETOPS_STATE_DIR']}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = b"\0" + Path(f"/proc/{entry}/environ").read_bytes()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if b"\0FLEETOPS_RUN_DIR=" in environ and mine in environ and "[mux]" not in argv:
            found.append(argv)
    return found


def test_a_pattern_named_host_is_refused_up_front_and_nothing_reboots(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """lab-03 renamed "!spare" (an EC2 Name tag can say that): as a --limit it would select every
    other host. The rollout refuses before anything runs: exit 2, no lock, no state, no reboot."""
    inventory = yaml.safe_load(lab.inventory_path().read_text())
    group = inventory["all"]["children"]["fleetops_lab"]["hosts"]
    group["!spare"] = group.pop("lab-03")
    for name, body in inventory["all"]["children"].items():
        if name != "fleetops_lab" and "lab-03" in (body.get("hosts") or {}):
            body["hosts"]["!spare"] = body["hosts"].pop("lab-03")
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(inventory))
    before = _boots(lab)
    refused = fleetops("remediate", "reboot", "-i", str(inv), "--apply", env=env, timeout=300)
    assert refused.rc == 2, refused.stderr
    assert "host name '!spare' contains !, which ansible reads as a host pattern" in refused.stderr
    planned = fleetops("plan", "reboot", "-i", str(inv), env=env, timeout=300)
    assert planned.rc == 2 and "host name '!spare'" in planned.stderr
    assert _boots(lab) == before
    state = Path(env["FLEETOPS_STATE_DIR"])
    assert not list(state.glob("locks/*.lock")) and not list(state.glob("rollouts/*.json"))


def test_sigterm_mid_batch_aborts_at_once_and_resume_reboots_each_host_once(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    state = tmp_path / "reboot.json"
    before = _boots(lab)
    proc = subprocess.Popen(
        [str(FLEETOPS), "remediate", "reboot", "-i", str(lab.inventory_path()), "--apply", "--max-parallel", "1",
         "--canary", "1", "--cooldown", "0", "--state", str(state), "--format", "json"],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_a_batch(state)
        time.sleep(0.5)  # inside batch 1's ansible run
        deadline = time.monotonic() + 60  # the check below can fail: this run's workers are seen
        while not _run_processes(env):
            assert time.monotonic() < deadline, "batch 1's ansible run never showed up"
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # to fleetops only, as systemd or a CI runner would
        _out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert took < 30, took
    print(f"SIGTERM to exit: {took:.1f} s")
    saved = json.loads(state.read_text())
    assert saved["status"] == "interrupted" and saved["stopped"]["reason"] == "aborted mid-batch (SIGTERM)"
    assert saved["stopped"]["in_doubt"] and set(saved["stopped"]["in_doubt"]) <= set(HOSTS)
    assert not list(Path(env["FLEETOPS_STATE_DIR"]).glob("locks/*.lock"))  # released
    assert _run_processes(env) == []  # the aborted batch's ansible workers were ended too

    resumed = fleetops("remediate", "--resume", str(state), "--format", "json", env=env, timeout=600)
    assert resumed.rc == 0, resumed.stderr
    assert resumed.json()["status"] == "done"
    after = _boots(lab)
    for host in HOSTS:
        assert after[host][1] == before[host][1] + 1, (host, before[host], after[host])  # exactly once
        assert after[host][0] != before[host][0], host


def test_a_host_gone_from_the_inventory_is_left_out_of_the_resume(
    lab: Lab, env: dict[str, str], tmp_path: Path
) -> None:
    """A rollout stopped by SIGTERM; before the resume a host it has not done leaves the inventory (a
    terminated instance, an inventory filter). The resume leaves that host out, skipped with the
    reason, and finishes the others: exit 3, never 0; no ansible run is asked for a host it lacks."""
    inv, state = tmp_path / "inv.yml", tmp_path / "reclaim.json"
    inv.write_text(lab.inventory_path().read_text())
    proc = subprocess.Popen(
        [str(FLEETOPS), "remediate", "reclaim", "-i", str(inv), "--apply", "--min-zombies", "999999999",
         "--max-parallel", "1", "--per-group-max", "none", "--canary", "0", "--cooldown", "20",
         "--state", str(state), "--format", "json"],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_a_batch(state)
        proc.send_signal(signal.SIGTERM)  # in batch 1 or the 20 s cooldown after it: the others pending
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    hosts = json.loads(state.read_text())["hosts"]
    pending = sorted(h for h, s in hosts.items() if s == "pending")
    assert len(pending) == 2, hosts
    gone, kept = pending
    inventory = yaml.safe_load(inv.read_text())
    for body in inventory["all"]["children"].values():
        (body.get("hosts") or {}).pop(gone, None)
    inv.write_text(yaml.safe_dump(inventory))

    resumed = fleetops("remediate", "--resume", str(state), "--format", "json", env=env, timeout=600)
    assert resumed.rc == 3, resumed.stdout + resumed.stderr
    report = resumed.json()
    assert report["hosts"][gone] == "skipped" and report["hosts"][kept] == "done", report["hosts"]
    assert all(s in ("done", "skipped") for s in report["hosts"].values()), report["hosts"]
    assert f"resume: {gone} is not in the inventory now" in resumed.stderr, resumed.stderr
    assert "Could not match supplied host pattern" not in resumed.stderr
