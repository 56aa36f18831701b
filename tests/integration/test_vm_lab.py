"""VM lab hosts (QEMU, each with its own kernel): what the nspawn lab cannot prove.

Two VMs (``fleetops-lab up 2 --vm``; TCG here, where KVM guests hang under nested virtualisation)
share one module-scoped fleet: each has its own cgroup v2 hierarchy, so the zombie count is the
host's (scope host), a zombie or kernel-log fault lands on one host only, and a reboot is a new
kernel. Zombies are real (mkdir + page cache + rmdir inside the VM), the Xid line is a real
record in that VM's /dev/kmsg, the reboot goes through `fleetops remediate reboot --apply`.
Measured here (TCG, 2 cores): about 60 s from QEMU start to ssh, 35 s for a scan of both VMs.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab, host_faults
from fleetops_lab.errors import LabError
from tests.helpers import boots, fleetops

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None,
        reason="QEMU is not installed (tools/debian-deps.sh --vm)",
    ),
]
HOSTS = ["lab-01", "lab-02"]
ZOMBIES = 1500


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab()
    lab.up(2, vm=2, progress=print)
    try:
        yield lab
    finally:
        lab.down()


def _scan(lab: Lab, *extra: str) -> dict[str, Any]:
    result = fleetops(
        "scan", "-i", str(lab.inventory_path()), "--format", "json", "--quiet", *extra, timeout=600
    )
    assert result.rc in (0, 1), result.stderr
    report: dict[str, Any] = result.json()
    return report


def _boots(lab: Lab) -> dict[str, tuple[str, int]]:
    """Each host's (boot id, number of boots in its persistent journal)."""
    return boots(lab, HOSTS)


@pytest.fixture(scope="module")
def baseline(lab: Lab) -> dict[str, Any]:
    return _scan(lab, "--zombie-warning", "1000", "--zombie-critical", "100000")


@pytest.fixture(scope="module")
def faulted(lab: Lab, baseline: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """1,500 real zombies made inside lab-01, an Xid 79 line in lab-02's kernel log; one scan."""
    host_faults.make_zombie_memcgs(lab, "lab-01", ZOMBIES, tag="vmtest")
    host_faults.write_kernel_log(lab, "lab-02", host_faults.XID_79)
    try:
        yield _scan(lab, "--zombie-warning", "1000", "--zombie-critical", "100000")
    finally:
        host_faults.release_zombie_memcgs(lab, "lab-01", tag="vmtest")


def _findings(report: dict[str, Any], host: str, check: str) -> list[dict[str, Any]]:
    return [f for f in report["hosts"][host]["findings"] if f["check"] == check]


def test_up_vm_boots_vms_with_their_own_kernel_that_answer_ssh(lab: Lab) -> None:
    hosts = {h.name: h for h in lab.status()}
    assert sorted(hosts) == HOSTS
    for name in HOSTS:
        assert hosts[name].kind == "vm" and hosts[name].running and hosts[name].ssh_ok, hosts[name]
        out = lab.run(name, "hostname; stat -fc %T /sys/fs/cgroup; systemctl is-system-running", check=True)
        assert out.stdout.split() == [name, "cgroup2fs", "running"], out.stdout
    # Their own kernels: different boot ids from each other and from this machine.
    ids = {lab.run(n, "cat /proc/sys/kernel/random/boot_id", check=True).stdout.strip() for n in HOSTS}
    ids.add(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    assert len(ids) == 3


def test_up_refuses_vms_memory_cannot_hold_and_changes_nothing(lab: Lab) -> None:
    before = {h.name: h.pid for h in lab.status(probe_ssh=False)}
    with pytest.raises(LabError, match=r"Failed to start 2 VM\(s\): .* but MemAvailable is \d+ MiB"):
        lab.up(2, vm=2, vm_memory_mib=65536)  # 2 x 64 GiB: more than this machine has
    with pytest.raises(LabError, match=r"number of VM hosts must be 0 \.\. 1"):
        lab.up(1, vm=2)
    assert {h.name: h.pid for h in lab.status(probe_ssh=False)} == before
    assert lab.inventory_path().exists()


def test_scan_reports_host_scope_zombie_counts_on_vms(baseline: dict[str, Any]) -> None:
    for name in HOSTS:
        host = baseline["hosts"][name]
        assert host["status"] == "ok", host
        memcg = host["facts"]["memcg"]
        assert memcg["scope"] == "host" and memcg["cgroup_version"] == 2, memcg
        assert isinstance(memcg["zombies"], int) and 0 <= memcg["zombies"] < 1000, memcg
        assert not _findings(baseline, name, "zombie_memcg"), host["findings"]
        assert not _findings(baseline, name, "gpu_health") or all(
            f["severity"] == "info" for f in _findings(baseline, name, "gpu_health")
        )


def test_real_zombies_in_one_vm_warn_on_that_host_only(
    baseline: dict[str, Any], faulted: dict[str, Any]
) -> None:
    before = baseline["hosts"]["lab-01"]["facts"]["memcg"]["zombies"]
    memcg = faulted["hosts"]["lab-01"]["facts"]["memcg"]
    expected = before + ZOMBIES
    assert abs(memcg["zombies"] - expected) <= 0.05 * expected, (memcg, before)
    zombie = _findings(faulted, "lab-01", "zombie_memcg")
    assert [f["severity"] for f in zombie] == ["warning"], faulted["hosts"]["lab-01"]["findings"]
    assert zombie[0]["data"]["zombies"] == memcg["zombies"]
    # The other VM's kernel has none of them.
    other = faulted["hosts"]["lab-02"]["facts"]["memcg"]
    assert other["zombies"] < 1000, other
    assert not _findings(faulted, "lab-02", "zombie_memcg")


def test_an_xid_in_one_vms_kernel_log_is_critical_on_that_host_only(faulted: dict[str, Any]) -> None:
    gpu = _findings(faulted, "lab-02", "gpu_health")
    assert [f["severity"] for f in gpu] == ["critical"], faulted["hosts"]["lab-02"]["findings"]
    assert "79" in str(gpu[0]), gpu
    assert all(f["severity"] == "info" for f in _findings(faulted, "lab-01", "gpu_health"))


def test_remediate_reboot_gives_each_vm_a_new_kernel_boot(
    lab: Lab, faulted: dict[str, Any], tmp_path: Path
) -> None:
    before = _boots(lab)
    started = time.monotonic()
    result = fleetops(
        "remediate", "reboot", "-i", str(lab.inventory_path()), "--apply", "--per-group-max", "1",
        "--max-parallel", "100%", "--cooldown", "0", "--format", "json",
        env={"FLEETOPS_STATE_DIR": str(tmp_path / "state"), "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl")},
        timeout=900,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert result.rc == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = _boots(lab)
    for host in HOSTS:
        assert after[host][0] != before[host][0], host  # a new kernel: a new boot id
        assert after[host][1] == before[host][1] + 1, (
            host,
            before[host],
            after[host],
        )  # exactly one boot more
    print(f"rolling reboot of {len(HOSTS)} VMs: {seconds:.0f} s")
    # Each kernel's zombies died with it: the rebooted lab-01 starts from its own boot's count.
    zombies = lab.run(
        "lab-01", "grep nr_dying_descendants /sys/fs/cgroup/cgroup.stat", check=True
    ).stdout.split()
    assert int(zombies[1]) < 1000, zombies
