"""VM lab hosts (QEMU, each with its own kernel): what the nspawn lab cannot prove.

Two VMs (``fleetops-lab up 2 --vm``; TCG here, where KVM guests hang under nested virtualisation)
share one module-scoped fleet: each has its own cgroup v2 hierarchy, so the zombie count is the
host's (scope host), a zombie or kernel-log fault lands on one host only, and a reboot is a new
kernel. Zombies are real (mkdir + page cache + rmdir inside the VM), the Xid line is a real
record in that VM's /dev/kmsg, the reboot goes through `fleetops remediate reboot --apply`.
Measured here (TCG, 2 cores): about 60 s from QEMU start to ssh, 35 s for a scan of both VMs.

After the reboot (fresh kernels): the crash-loop incident on one v2 VM (found, culprit named from its
kernel's nr_dying_descendants growth, fixed by `remediate fix --apply`, back to the baseline), then
`remediate reclaim --method memory_reclaim` frees zombies while another service's cached files stay.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops_lab import Lab, host_faults
from fleetops_lab.errors import LabError
from fleetops_lab.host_faults import install_crashloop_unit, remove_crashloop_unit
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
    """1,500 real zombies made inside lab-01, an Xid 79 line in lab-02's kernel log, an ENA reset line in
    lab-01's; one scan."""
    host_faults.make_zombie_memcgs(lab, "lab-01", ZOMBIES, tag="vmtest")
    host_faults.write_kernel_log(lab, "lab-02", host_faults.XID_79)
    host_faults.write_kernel_log(lab, "lab-01", host_faults.ENA_RESET)
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
        # the identity disk brought sshd's cheap key exchange too (fleetops_lab.rootfs.SSHD_DROPIN)
        kex = lab.run(name, "sshd -T | grep -i '^kexalgorithms '", check=True).stdout.split()
        assert kex == ["kexalgorithms", "curve25519-sha256,curve25519-sha256@libssh.org"], kex
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


def test_an_ena_reset_line_without_an_ena_nic_is_read_from_that_vms_log_and_ignored(
    faulted: dict[str, Any],
) -> None:
    """A VM's NIC is virtio: an ENA reset line in its kernel log is noise (no finding), counted as ignored."""
    ena = faulted["hosts"]["lab-01"]["facts"]["ena"]
    assert ena["interfaces"] == {} and ena["ignored_log_lines"] == 1, ena
    assert "1 ENA driver line(s) in the kernel log ignored" in ena["reason"], ena
    assert _findings(faulted, "lab-01", "ena_resets") == []
    other = faulted["hosts"]["lab-02"]["facts"]["ena"]
    assert other["ignored_log_lines"] == 0, other  # lab-02's own kernel log has no such line


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


def _dying(lab: Lab, host: str) -> int:
    """The host kernel's dying cgroups (v2: nr_dying_descendants of the root cgroup.stat)."""
    out = lab.run(host, "grep nr_dying_descendants /sys/fs/cgroup/cgroup.stat", check=True).stdout.split()
    return int(out[1])


# The tolerance of "back to the baseline" after a reclaim: the lab's own ssh/ansible sessions each leave a
# dying session scope (user.slice) for a while; measured on these VMs, 19 dying at boot, 9 after the fix.
BASELINE_TOLERANCE = 10
CRASH_HOST, QUIET_HOST = "lab-02", "lab-01"


def test_crash_loop_on_a_v2_vm_found_culprit_named_fixed_back_to_baseline(
    lab: Lab, faulted: dict[str, Any], tmp_path: Path
) -> None:
    """The Pinterest incident on a real cgroup v2 kernel (runs after the reboot: fresh kernels)."""
    baseline = _dying(lab, CRASH_HOST)
    install_crashloop_unit(lab, CRASH_HOST, restart_sec=0.5)
    try:
        deadline = time.monotonic() + 180
        while _dying(lab, CRASH_HOST) < baseline + 30 and time.monotonic() < deadline:
            time.sleep(3)
        assert _dying(lab, CRASH_HOST) >= baseline + 30, "the crash loop left no zombies"
        # Under TCG the loop restarts about 15 times a minute (each start takes seconds): the growth level
        # that names culprits is lowered from 10 to 4 memcgs/min so a slower minute still names it.
        report = _scan(lab, "--sample-seconds", "10", "-e", "fleetops_zombie_growth_warning_per_min=4")
        sick = report["hosts"][CRASH_HOST]
        loops = _findings(report, CRASH_HOST, "crashloop_unit")
        assert [f["data"]["unit"] for f in loops] == ["ecs.service"], sick["findings"]
        assert loops[0]["data"]["vendor_unit"] is True and loops[0]["data"]["rate_basis"] == "samples"
        memcg = sick["facts"]["memcg"]
        assert memcg["cgroup_version"] == 2 and memcg["scope"] == "host", memcg
        assert "nr_dying_descendants" in memcg["basis"], memcg  # this 6.1 kernel's v2 counter
        assert memcg["growth"]["zombies_per_min"] >= 4, memcg["growth"]
        (zombie,) = _findings(report, CRASH_HOST, "zombie_memcg")
        assert [c["unit"] for c in zombie["data"]["culprits"]] == ["ecs.service"], zombie
        assert zombie["data"]["growth_basis"] == "zombies", (
            zombie
        )  # the host's own count, not a host-wide total
        assert "likely culprit: ecs.service" in zombie["summary"]
        # The other VM's kernel has no loop and no zombies piling up.
        assert _findings(report, QUIET_HOST, "crashloop_unit") == []
        assert _findings(report, QUIET_HOST, "zombie_memcg") == [], report["hosts"][QUIET_HOST]["findings"]

        fixed = fleetops(
            "remediate", "fix", "-i", str(lab.inventory_path()), "-l", CRASH_HOST, "--sample-seconds", "3",
            "--min-zombies", str(baseline + 10), "--apply", "--format", "json",
            env={"FLEETOPS_STATE_DIR": str(tmp_path / "state"), "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl")},
            timeout=900,
        )  # fmt: skip
        assert fixed.rc == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
        rollout = fixed.json()
        assert rollout["plan"]["batches"] == [[CRASH_HOST]], rollout["plan"]
        assert rollout["summary"]["changed"] == 1, rollout["summary"]
        assert lab.run(CRASH_HOST, "systemctl is-enabled ecs.service").stdout.strip() == "masked"
        assert lab.run(CRASH_HOST, "systemctl is-active ecs.service").stdout.strip() == "inactive"
        after = _dying(lab, CRASH_HOST)
        assert after <= baseline + BASELINE_TOLERANCE, (baseline, after)
        print(f"crash loop on {CRASH_HOST}: dying cgroups {baseline} before, {after} after the fix")
    finally:
        remove_crashloop_unit(lab, CRASH_HOST)


def test_memory_reclaim_frees_zombies_and_leaves_other_cgroups_cache(lab: Lab, tmp_path: Path) -> None:
    """The gentler rung on a real v2 kernel: memory.reclaim under the zombies' parent, not drop_caches."""
    host = QUIET_HOST
    # A service's hot file, read through its own cgroup (caches dropped first so the read charges it there).
    lab.run(
        host,
        "head -c 16M /dev/urandom > /var/tmp/hot && sync && echo 1 > /proc/sys/vm/drop_caches && "
        "systemd-run --unit fleetops-hot --service-type=exec sh -c 'cat /var/tmp/hot > /dev/null; exec sleep 3600' "
        "&& sleep 5 && fincore -b -n -o RES /var/tmp/hot",
        check=True,
        timeout=120,
    )
    cached = int(lab.run(host, "fincore -b -n -o RES /var/tmp/hot", check=True).stdout)
    assert cached >= 15 << 20, cached
    baseline = _dying(lab, host)
    host_faults.make_zombie_memcgs(lab, host, 1200, tag="reclaim")
    try:
        assert _dying(lab, host) >= baseline + 1200 * 0.95
        result = fleetops(
            "remediate", "reclaim", "-i", str(lab.inventory_path()), "-l", host, "--method", "memory_reclaim",
            "--min-zombies", "1000", "--apply", "--format", "json",
            env={"FLEETOPS_STATE_DIR": str(tmp_path / "state"), "FLEETOPS_AUDIT_LOG": str(tmp_path / "audit.jsonl")},
            timeout=600,
        )  # fmt: skip
        assert result.rc == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert result.json()["summary"]["changed"] == 1
        after = _dying(lab, host)
        assert after <= baseline + BASELINE_TOLERANCE, (baseline, after)
        # The service's file stays: memory.reclaim wrote only to the zombies' own parent (enough to get under
        # min_zombies, so not to system.slice, whose few dying children sit beside the service: writing there
        # took 5% of the file before targets were picked); drop_caches takes all of it, as the next step shows.
        kept = int(lab.run(host, "fincore -b -n -o RES /var/tmp/hot", check=True).stdout)
        assert kept >= cached * 0.95, (cached, kept)
        dropped = int(
            lab.run(
                host, "sync; echo 1 > /proc/sys/vm/drop_caches; fincore -b -n -o RES /var/tmp/hot", check=True
            ).stdout
        )
        assert dropped <= cached * 0.05, (cached, dropped)
        print(
            f"memory_reclaim on {host}: dying {baseline + 1200} -> {after}; the service's cached file "
            f"{cached} -> {kept} bytes (drop_caches: -> {dropped})"
        )
    finally:
        host_faults.release_zombie_memcgs(lab, host, tag="reclaim")
        lab.run(host, "systemctl stop fleetops-hot; rm -f /var/tmp/hot", check=False)


_INJECT = r"""
import json, sys
sys.path.insert(0, "/var/tmp/fleetops-inject")
import faults

def dying():
    for line in open("/sys/fs/cgroup/cgroup.stat"):
        if line.startswith("nr_dying_descendants "):
            return int(line.split()[1])

hierarchy = faults.memory_hierarchy()
before = dying()
batch = faults.create_zombie_memcgs(int(sys.argv[1]), parent="fleetops-inject")
made = dying()
batch.release()
total = faults.wait_memcg_total(batch.baseline_total + 10, timeout=30)
print(json.dumps({"version": hierarchy.version, "root": str(hierarchy.root), "count": batch.count,
                  "before": before, "made": made, "after": dying(), "baseline_total": batch.baseline_total,
                  "total_after": total, "parent": str(batch.cgroup)}))
"""


def _fleetops_closure(path: Path) -> dict[str, str]:
    """The fleetops modules ``path`` imports, and theirs, as {path relative to src/: source} (read with
    ast, so a module that gains an import is copied with it). A package is its ``__init__.py``; the
    top package's is written empty (its own imports are not needed to import a submodule)."""
    import ast
    import importlib.util

    import fleetops

    src = Path(fleetops.__file__).parent.parent
    files: dict[str, str] = {"fleetops/__init__.py": ""}
    todo, seen = [path], {"fleetops"}
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                # `from fleetops.x import y` needs fleetops.x, and fleetops.x.y when y is a module
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                if name.split(".")[0] != "fleetops" or name in seen:
                    continue
                seen.add(name)
                try:
                    spec = importlib.util.find_spec(name)
                except ModuleNotFoundError:  # y is a name inside fleetops.x, not a module
                    continue
                if spec is None or spec.origin is None:
                    continue
                origin = Path(spec.origin)
                files[str(origin.relative_to(src))] = origin.read_text()
                todo.append(origin)
    return files


def test_the_local_zombie_injector_works_on_a_v2_kernel(lab: Lab) -> None:
    """fleetops_lab.faults (what make demo and the kernel tests use on this machine) inside a VM's v2 kernel.

    The module file and the fleetops modules it imports (fleetops.errors and what that imports) are
    copied in as they are: the VM's Python runs the same code, on cgroup v2 (this machine's kernel is v1).
    """
    import fleetops_lab.faults

    host, count = "lab-02", 300
    faults_py = Path(fleetops_lab.faults.__file__)
    files = {"faults.py": faults_py.read_text(), **_fleetops_closure(faults_py)}
    assert "fleetops/errors.py" in files and "fleetops/exitcodes.py" in files, sorted(files)
    for rel, text in files.items():
        lab.run(host, f"mkdir -p $(dirname /var/tmp/fleetops-inject/{rel}) && cat > /var/tmp/fleetops-inject/{rel}",
                input=text, check=True)  # fmt: skip
    try:
        out = lab.run(host, f"python3 - {count}", input=_INJECT, check=True, timeout=180).stdout
    finally:
        lab.run(host, "rm -rf /var/tmp/fleetops-inject", check=False)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["version"] == 2 and result["root"] == "/sys/fs/cgroup", result
    assert result["count"] == count and result["parent"] == "/sys/fs/cgroup/fleetops-inject", result
    assert result["made"] - result["before"] >= count * 0.95, result  # real zombies in that kernel
    assert result["total_after"] <= result["baseline_total"] + 10, result  # freed once released
    assert result["after"] <= result["before"] + 10, result
    assert lab.run(host, "test -e /sys/fs/cgroup/fleetops-inject").returncode != 0  # its parent removed
