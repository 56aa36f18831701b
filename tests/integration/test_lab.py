"""The lab on this machine, for real: systemd-nspawn hosts with systemd as PID 1, sshd, own IPs.

Uses the machine's one lab (default state dir, or $FLEETOPS_LAB_DIR) and the cached rootfs (the
first run builds it: about 1-2 min). It brings the lab down before and after: do not run it next to
a lab you are using. Once the rootfs is cached the whole file takes well under a minute.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetops.errors import FleetopsError
from fleetops_lab import Lab, LabError, LabHost, rootfs
from fleetops_lab import _system as system
from fleetops_lab.cli import main as lab_main

pytestmark = pytest.mark.lab

needs_lab = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
    reason="the lab needs root and systemd-nspawn (apt-get install -y systemd-container)",
)

BOOT_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- refusals (no lab needed)


@pytest.mark.parametrize("count", [0, -1, 65, 200, True, "2", 1.5])
def test_up_refuses_a_bad_count_and_changes_nothing(tmp_path: Path, count: object) -> None:
    lab = Lab(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    with pytest.raises(LabError, match=r"^Failed to start the lab: the number of hosts must be 1 \.\. 64"):
        lab.up(count)  # type: ignore[arg-type]
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "cache").exists()


def test_up_and_down_refuse_without_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    lab = Lab(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    with pytest.raises(LabError, match="needs root"):
        lab.up(2)
    with pytest.raises(LabError, match="needs root"):
        lab.down()
    assert not (tmp_path / "state").exists()


def test_up_refuses_without_systemd_nspawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    lab = Lab(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    with pytest.raises(LabError, match=r"missing systemd-nspawn.*apt-get install"):
        lab.up(1)
    assert not (tmp_path / "state").exists()


def test_lab_error_is_a_fleetops_error() -> None:
    assert issubclass(LabError, FleetopsError)


def test_cli_reports_a_bad_count_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert lab_main(["up", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Failed to start the lab: the number of hosts must be 1 .. 64" in err


# --------------------------------------------------------------------------- the real lab


def _boot_id(lab: Lab, name: str) -> str:
    return lab.run(name, "cat /proc/sys/kernel/random/boot_id", check=True, timeout=30).stdout.strip()


def _our_pids(lab: Lab, hosts: list[LabHost]) -> set[int]:
    pids: set[int] = set()
    for host in hosts:
        pids.update(p for p in (host.pid, host.supervisor_pid) if p)
        pids.update(system.cgroup_pids(f"{lab.names.cgroup_parent}/{host.name}"))
    return pids


def _assert_nothing_left(lab: Lab, pids: set[int]) -> None:
    alive = sorted(p for p in pids if system.pid_alive(p))
    assert not alive, f"processes left running: {alive}"
    assert not system.mounts_under(lab.state_dir), "mounts left under the state dir"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [ns for ns in netns.split() if ns.startswith(lab.names.netns_prefix)]
    assert not system.link_exists(lab.names.bridge)
    assert not [link for link in system.link_names() if link.startswith(lab.names.link_prefix)]
    left = [p for p in system.cgroup_paths(lab.names.cgroup_parent) if p.exists()]
    assert not left, f"cgroups left: {left}"
    assert lab.status() == []
    assert not lab.inventory_path().exists()
    assert not (lab.state_dir / "hosts").exists()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.down()
    try:
        yield lab
    finally:
        lab.down()


@needs_lab
def test_up_boots_ssh_ready_hosts_with_systemd_as_pid_1(lab: Lab) -> None:
    hosts = lab.up(2, progress=print, timeout=BOOT_TIMEOUT_S + 120)  # the first run builds the rootfs
    assert [h.name for h in hosts] == ["lab-01", "lab-02"]
    net = (
        lab.names.network.network_address
    )  # the default lab's is 10.213.0.0 (tests/fleetops/test_lab_names.py)
    assert [h.ip for h in hosts] == [str(net + 11), str(net + 139)]
    assert [h.az for h in hosts] == ["lab-1a", "lab-1b"]
    assert all(h.running and h.ssh_ok and h.pid and h.supervisor_pid for h in hosts)
    for host in hosts:
        facts = lab.run(
            host.name,
            "ps -p 1 -o comm=; systemctl is-system-running; hostname; hostname -I; ip route",
            timeout=30,
        ).stdout.split("\n")
        assert facts[0] == "systemd"
        assert facts[1] in ("running", "degraded"), facts
        assert facts[2] == host.name
        assert facts[3].split() == [host.ip]
        assert "default" not in "\n".join(facts[4:])  # no default route: nothing hangs on DNS
        # sshd offers the cheap key exchange only (fleetops_lab.rootfs.SSHD_DROPIN)
        kex = lab.run(host.name, "sshd -T | grep -i '^kexalgorithms '", timeout=30, check=True).stdout.split()
        assert kex == ["kexalgorithms", "curve25519-sha256,curve25519-sha256@libssh.org"], kex
        # ... and takes many connections at once (a simulated fleet's host is many inventory hosts)
        starts = lab.run(
            host.name, "sshd -T | grep -i '^maxstartups '", timeout=30, check=True
        ).stdout.split()
        assert starts == ["maxstartups", "1000:30:1000"], starts

    inventory = yaml.safe_load(lab.inventory_path().read_text())
    children = inventory["all"]["children"]
    assert children["fleetops_lab"]["hosts"] == {
        "lab-01": {"ansible_host": str(net + 11), "fleetops_az": "lab-1a"},
        "lab-02": {"ansible_host": str(net + 139), "fleetops_az": "lab-1b"},
    }
    assert children["fleetops_lab"]["vars"]["ansible_ssh_private_key_file"] == str(lab.key_path)
    assert children["az_lab_1a"] == {"hosts": {"lab-01": {}}}
    assert children["az_lab_1b"] == {"hosts": {"lab-02": {}}}


@needs_lab
def test_inventory_works_with_ansible(lab: Lab) -> None:
    ansible = Path(sys.executable).with_name("ansible")
    if not ansible.exists():
        pytest.skip("ansible is not installed next to this Python")
    proc = subprocess.run(
        [str(ansible), "-i", str(lab.inventory_path()), "all", "-m", "ping"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == 2


@needs_lab
def test_cli_inventory_status_and_ssh(lab: Lab) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleetops_lab.cli", *args], capture_output=True, text=True, timeout=60
        )

    assert cli("inventory").stdout.strip() == str(lab.inventory_path())
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "lab-02" in status.stdout
    assert cli("ssh", "lab-02", "hostname").stdout.strip() == "lab-02"
    assert cli("ssh", "lab-01", "echo $(hostname) ok").stdout.strip() == "lab-01 ok"
    assert cli("ssh", "lab-01", "false").returncode == 1


@needs_lab
def test_up_again_is_a_no_op(lab: Lab) -> None:
    before = {h.name: (h.pid, h.supervisor_pid) for h in lab.status()}
    boot_ids = {name: _boot_id(lab, name) for name in before}
    hosts = lab.up(2, timeout=BOOT_TIMEOUT_S)
    assert {h.name: (h.pid, h.supervisor_pid) for h in hosts} == before
    assert {name: _boot_id(lab, name) for name in before} == boot_ids


@needs_lab
def test_host_root_is_the_guest_filesystem(lab: Lab) -> None:
    (lab.host_root("lab-02") / "root/dropped.txt").write_text("from the controller\n")
    assert lab.run("lab-02", "cat /root/dropped.txt", check=True).stdout == "from the controller\n"
    with pytest.raises(LabError, match="not up"):
        lab.host_root("lab-09")
    with pytest.raises(LabError, match=r"lab-01 \.\. lab-64"):
        lab.host_root("web-1")


@needs_lab
def test_run_check_raises_lab_error(lab: Lab) -> None:
    with pytest.raises(LabError, match=r"^Failed to run 'exit 3' on lab-01: exit status 3"):
        lab.run("lab-01", "exit 3", check=True)
    assert lab.run("lab-01", ["printf", "%s", "a b"]).stdout == "a b"


@needs_lab
def test_guest_reboot_comes_back_with_a_new_boot_id(lab: Lab) -> None:
    before = next(h for h in lab.status() if h.name == "lab-01")
    boot_id = _boot_id(lab, "lab-01")
    lab.run("lab-01", "systemctl reboot", timeout=30)  # the connection may drop: no check
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    new_id = boot_id
    while time.monotonic() < deadline:
        proc = lab.run("lab-01", "cat /proc/sys/kernel/random/boot_id", timeout=15)
        if proc.returncode == 0 and proc.stdout.strip() and proc.stdout.strip() != boot_id:
            new_id = proc.stdout.strip()
            break
        time.sleep(0.5)
    assert new_id != boot_id, "lab-01 did not come back from its reboot"
    assert lab.run("lab-01", "systemctl is-system-running --wait", timeout=60).stdout.strip() in (
        "running",
        "degraded",
    )
    after = next(h for h in lab.status() if h.name == "lab-01")
    assert after.supervisor_pid == before.supervisor_pid  # the same supervisor restarted nspawn
    assert after.pid != before.pid
    assert after.running and after.ssh_ok


@needs_lab
def test_down_leaves_nothing(lab: Lab) -> None:
    hosts = lab.status()
    assert len(hosts) == 2
    pids = _our_pids(lab, hosts)
    assert pids
    lab.down()
    _assert_nothing_left(lab, pids)
    lab.down()  # idempotent
    _assert_nothing_left(lab, pids)


@needs_lab
def test_a_killed_run_is_recovered_by_up_and_cleaned_by_down(lab: Lab) -> None:
    hosts = lab.up(2, timeout=BOOT_TIMEOUT_S)
    one, two = hosts
    # Kill lab-01 the hard way (its guest keeps running, orphaned, in its cgroups) and only the
    # supervisor of lab-02; leave a pid file that names a dead process.
    assert one.supervisor_pid and one.pid and two.supervisor_pid
    os.kill(one.supervisor_pid, signal.SIGKILL)
    os.kill(one.pid, signal.SIGKILL)
    os.kill(two.supervisor_pid, signal.SIGKILL)
    assert system.wait_until(lambda: not system.pid_alive(one.pid or 0), 5)
    state = {h.name: h for h in lab.status(probe_ssh=False)}
    assert not state["lab-01"].running
    assert not state["lab-02"].running
    (lab.state_dir / "hosts/lab-01/supervisor.pid").write_text("4194000\n")

    recovered = lab.up(2, timeout=BOOT_TIMEOUT_S)  # up alone repairs it
    assert all(h.running and h.ssh_ok for h in recovered)
    assert {h.supervisor_pid for h in recovered}.isdisjoint({one.supervisor_pid, two.supervisor_pid})
    assert lab.run("lab-01", "hostname", check=True).stdout.strip() == "lab-01"

    # Kill everything again, mounts and namespaces stay behind: down must clean it all.
    victims = lab.status(probe_ssh=False)
    pids = _our_pids(lab, victims)
    for host in victims:
        for pid in (host.supervisor_pid, host.pid):
            if pid:
                os.kill(pid, signal.SIGKILL)
    assert system.mounts_under(lab.state_dir)
    lab.down()
    _assert_nothing_left(lab, pids)

    hosts = lab.up(1, timeout=BOOT_TIMEOUT_S)  # and up works after it
    assert [h.name for h in hosts] == ["lab-01"] and hosts[0].ssh_ok
    pids = _our_pids(lab, hosts)
    lab.down()
    _assert_nothing_left(lab, pids)


@needs_lab
def test_down_removes_what_a_killed_rootfs_build_left(lab: Lab) -> None:
    # A build whose controller was SIGKILLed: a half-built tree with /proc still mounted in it, and a
    # debootstrap still working on it.
    stale = lab.cache_dir / "rootfs" / f"{rootfs.SUITE}-{rootfs.recipe_hash()}.tmp-4194000"
    (stale / "proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(stale / "proc")], check=True)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(stale)])
    try:
        lab.down()
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert not system.mounts_under(stale)
        assert not stale.exists()
        assert rootfs.rootfs_dir(lab.cache_dir).is_dir()  # the complete rootfs stays cached
    finally:
        if worker.poll() is None:
            worker.kill()
        system.unmount_under(stale, what="clean up")
        shutil.rmtree(stale, ignore_errors=True)
