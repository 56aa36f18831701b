"""zombie_memcg parsers and collect(), on real captured inputs and temporary trees."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import memcg
from ansible_collections.fleetops.node.plugins.module_utils.findings import DetectorError

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "memcg"
INIT_NS = "cgroup:[4026531835]"
RELEASE = "6.18.44-fc-v595"  # this machine's kernel, where the fixtures come from
NO_SWAP = "proc_swaps.none_6.18.txt"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# parse_proc_cgroups
# ---------------------------------------------------------------------------------------------


def test_proc_cgroups_real_v1_host() -> None:
    cgroups = memcg.parse_proc_cgroups(fixture("proc_cgroups.v1_host.txt"))
    assert cgroups["memory"] == {"hierarchy": 4, "num_cgroups": 12, "enabled": True}
    assert cgroups["net_cls"] == {"hierarchy": 0, "num_cgroups": 1, "enabled": True}
    assert len(cgroups) == 12


def test_proc_cgroups_real_with_zombies() -> None:
    assert memcg.parse_proc_cgroups(fixture("proc_cgroups.v1_zombies.txt"))["memory"]["num_cgroups"] == 1536


def test_proc_cgroups_v2_variants() -> None:
    assert memcg.parse_proc_cgroups(fixture("proc_cgroups.v2_6.6.txt"))["memory"] == {
        "hierarchy": 0,
        "num_cgroups": 1287,
        "enabled": True,
    }
    no_memory = memcg.parse_proc_cgroups(fixture("proc_cgroups.v2_6.12_no_memory.txt"))
    assert "memory" not in no_memory
    assert no_memory["pids"]["num_cgroups"] == 88
    assert memcg.parse_proc_cgroups(fixture("proc_cgroups.memory_disabled.txt"))["memory"]["enabled"] is False


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "proc_cgroups.truncated.txt",
            r"^Failed to parse /proc/cgroups: line 6: truncated \(no trailing newline\): 'memory\\t4\\t1'$",
        ),
        (
            "proc_cgroups.non_integer.txt",
            r"^Failed to parse /proc/cgroups: line 6: num_cgroups '1z' is not an integer$",
        ),
        (
            "proc_cgroups.missing_field.txt",
            r"^Failed to parse /proc/cgroups: line 6: expected 4 fields .*got 3",
        ),
        ("proc_cgroups.binary_garbage.txt", r"^Failed to parse /proc/cgroups: "),
    ],
)
def test_proc_cgroups_malformed(name: str, expected: str) -> None:
    with pytest.raises(memcg.MemcgError, match=expected):
        memcg.parse_proc_cgroups(fixture(name))


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("", "file is empty"),
        ("memory\t4\t12\t1\n", "line 1: expected the header"),
        ("#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t4\t-3\t1\n", "num_cgroups -3 is negative"),
        ("#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t4\t3\t2\n", "enabled 2 is not 0 or 1"),
        (
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t4\t3\t1\nmemory\t4\t3\t1\n",
            "line 3: controller 'memory' listed twice",
        ),
    ],
)
def test_proc_cgroups_rejects(text: str, cause: str) -> None:
    with pytest.raises(memcg.MemcgError) as err:
        memcg.parse_proc_cgroups(text)
    assert cause in str(err.value)
    assert isinstance(err.value, DetectorError)


# ---------------------------------------------------------------------------------------------
# parse_mountinfo and the mount pickers
# ---------------------------------------------------------------------------------------------


def test_mountinfo_real_host() -> None:
    mounts = memcg.parse_mountinfo(fixture("mountinfo.v1_host.txt"))
    memory = memcg.find_memory_mount_v1(mounts)
    assert memory is not None
    assert memory["mount_point"] == "/sys/fs/cgroup/memory"
    assert memory["root"] == "/"
    assert memory["fstype"] == "cgroup"
    assert memory["super_options"] == ["rw", "memory"]
    unified = memcg.find_cgroup2_mount(mounts)
    assert unified is not None and unified["mount_point"] == "/sys/fs/cgroup/unified"


def test_mountinfo_real_cgroupns_root_is_relative() -> None:
    memory = memcg.find_memory_mount_v1(memcg.parse_mountinfo(fixture("mountinfo.v1_cgroupns.txt")))
    assert memory is not None and memory["root"] == "/../.."


def test_mountinfo_real_bind_mounted_subtree_covers_the_full_mount() -> None:
    mounts = memcg.parse_mountinfo(fixture("mountinfo.v1_nspawn_subtree.txt"))
    at_memory = [m for m in mounts if m["mount_point"] == "/sys/fs/cgroup/memory"]
    assert [m["root"] for m in at_memory] == ["/", "/fleetops-lab/lab-01"]
    memory = memcg.find_memory_mount_v1(mounts)
    assert memory is not None
    assert memory["root"] == "/fleetops-lab/lab-01"
    assert memory["mount_options"].startswith("ro,")


def test_mountinfo_nspawn_guest() -> None:
    mounts = memcg.parse_mountinfo(fixture("mountinfo.v1_nspawn.txt"))
    memory = memcg.find_memory_mount_v1(mounts)
    assert memory is not None and memory["root"] == "/fleetops-lab/lab-01"
    assert memory["optional"] == ["shared:358"]


def test_mountinfo_v2_host() -> None:
    mounts = memcg.parse_mountinfo(fixture("mountinfo.v2_host.txt"))
    assert memcg.find_memory_mount_v1(mounts) is None
    unified = memcg.find_cgroup2_mount(mounts)
    assert unified is not None
    assert unified["mount_point"] == "/sys/fs/cgroup"
    assert unified["super_options"] == ["rw", "nsdelegate", "memory_recursiveprot"]


def test_mountinfo_unescapes_octal() -> None:
    text = "50 27 0:32 /a\\040b /mnt/with\\040space rw - cgroup cgroup rw,memory\n"
    (mount,) = memcg.parse_mountinfo(text)
    assert mount["root"] == "/a b"
    assert mount["mount_point"] == "/mnt/with space"


@pytest.mark.parametrize(
    "text",
    [
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime cgroup cgroup rw,memory\n",
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup\n",
        "x 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
    ],
)
def test_mountinfo_malformed(text: str) -> None:
    with pytest.raises(memcg.MemcgError, match=r"^Failed to parse /proc/self/mountinfo: line 1: "):
        memcg.parse_mountinfo(text)


# ---------------------------------------------------------------------------------------------
# cgroup.stat, cgroup.controllers, namespace links
# ---------------------------------------------------------------------------------------------


def test_cgroup_stat_real_hybrid_6_18() -> None:
    assert memcg.parse_cgroup_stat(fixture("cgroup_stat.hybrid_unified_6.18.txt")) == {
        "nr_descendants": 0,
        "nr_subsys_perf_event": 1,
        "nr_subsys_hugetlb": 1,
        "nr_dying_descendants": 0,
        "nr_dying_subsys_perf_event": 0,
        "nr_dying_subsys_hugetlb": 0,
    }


def test_cgroup_stat_v2_formats() -> None:
    new = memcg.parse_cgroup_stat(fixture("cgroup_stat.v2_6.12.txt"))
    assert (new["nr_subsys_memory"], new["nr_dying_subsys_memory"], new["nr_dying_descendants"]) == (
        88,
        1523,
        1530,
    )
    assert memcg.parse_cgroup_stat(fixture("cgroup_stat.v2_6.6.txt")) == {
        "nr_descendants": 60,
        "nr_dying_descendants": 1226,
    }


def test_cgroup_stat_malformed() -> None:
    with pytest.raises(memcg.MemcgError, match="truncated"):
        memcg.parse_cgroup_stat(fixture("cgroup_stat.truncated.txt"))
    with pytest.raises(memcg.MemcgError, match="line 1: expected 'key value'"):
        memcg.parse_cgroup_stat("nr_descendants\n")
    with pytest.raises(memcg.MemcgError, match="not an integer"):
        memcg.parse_cgroup_stat("nr_descendants many\n")


def test_cgroup_controllers() -> None:
    assert memcg.parse_cgroup_controllers(fixture("cgroup_controllers.hybrid_unified.txt")) == ["hugetlb"]
    assert "memory" in memcg.parse_cgroup_controllers(fixture("cgroup_controllers.v2_host.txt"))
    assert memcg.parse_cgroup_controllers("\n") == []


def test_ns_links() -> None:
    assert memcg.parse_ns_link(fixture("ns_cgroup.init.txt").strip()) == memcg.PROC_CGROUP_INIT_INO
    assert memcg.parse_ns_link(fixture("ns_cgroup.cgroupns.txt").strip()) == 4026532177
    with pytest.raises(memcg.MemcgError, match="expected 'cgroup:\\[<inode>\\]'"):
        memcg.parse_ns_link("net:[4026531840]")


def test_id_headroom() -> None:
    assert memcg.id_headroom(1) == (65534, 99.99)
    assert memcg.id_headroom(52429) == (13106, 19.99)
    assert memcg.id_headroom(65535) == (0, 0.0)
    assert memcg.id_headroom(68680) == (0, 0.0)  # Pinterest's count: clamped, never negative
    assert memcg.id_headroom(52428) == (13107, 20.0)
    assert memcg.id_headroom(used=0) == (65535, 100.0)


def test_proc_swaps_real_no_swap() -> None:
    assert memcg.parse_proc_swaps(fixture(NO_SWAP)) == []


def test_proc_swaps_kernel_format() -> None:
    assert memcg.parse_proc_swaps(fixture("proc_swaps.partition_unused.txt")) == [
        {
            "filename": "/dev/nvme0n1p3",
            "type": "partition",
            "size_kib": 8388604,
            "used_kib": 0,
            "priority": -2,
        }
    ]
    assert memcg.parse_proc_swaps(fixture("proc_swaps.in_use.txt")) == [
        {
            "filename": "/dev/zram0",
            "type": "partition",
            "size_kib": 16777212,
            "used_kib": 4398892,
            "priority": 100,
        },
        {"filename": "/swapfile", "type": "file", "size_kib": 1048572, "used_kib": 0, "priority": -2},
    ]
    # seq_file_path() escapes a blank in the path as \040
    text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swap\\040file  file\t\t4\t\t1\t\t-3\n"
    (area,) = memcg.parse_proc_swaps(text)
    assert (area["filename"], area["used_kib"]) == ("/swap file", 1)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("", "file is empty"),
        (
            "/dev/sda2 partition 8388604 0 -2\n",
            "line 1: expected the header 'Filename Type Size Used Priority'",
        ),
        ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority", "truncated"),
        ("Filename Type Size Used Priority\n/dev/sda2 partition 8388604 -2\n", "line 2: expected 5 fields"),
        (
            "Filename Type Size Used Priority\n/dev/sda2 partition 8388604 x -2\n",
            "line 2: Used 'x' is not an integer",
        ),
        ("Filename Type Size Used Priority\n/dev/sda2 partition 8388604 0 high\n", "Priority 'high'"),
    ],
)
def test_proc_swaps_rejects(text: str, cause: str) -> None:
    with pytest.raises(memcg.MemcgError) as err:
        memcg.parse_proc_swaps(text)
    assert str(err.value).startswith("Failed to parse /proc/swaps: ")
    assert cause in str(err.value)


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        (RELEASE, (6, 18)),
        ("4.7.0", (4, 7)),
        ("4.19.0-27-amd64", (4, 19)),
        ("3.10.0-1160.el7.x86_64", (3, 10)),
        ("5.4", (5, 4)),
        ("6.8rc1", (6, 8)),
        ("6", None),
        ("", None),
        ("v6.18", None),
        ("6.x", None),
    ],
)
def test_parse_kernel_release(release: str, expected: tuple[int, int] | None) -> None:
    assert memcg.parse_kernel_release(release) == expected


# ---------------------------------------------------------------------------------------------
# collect() against temporary trees
# ---------------------------------------------------------------------------------------------


def make_host(
    tmp_path: Path,
    *,
    proc_cgroups: str | None,
    mountinfo: str,
    ns_link: str | None = INIT_NS,
    dirs: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    proc_swaps: str | None = NO_SWAP,
    kernel_release: str = RELEASE,
) -> dict[str, Any]:
    """A fake host under tmp_path; returns collect()'s keyword arguments.

    ``proc_swaps`` names a fixture (None: no /proc/swaps file).
    """
    fs_root = tmp_path / "root"
    fs_root.mkdir()
    for rel in dirs:
        (fs_root / rel.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for rel, text in (files or {}).items():
        path = fs_root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc = tmp_path / "proc"
    proc.mkdir()
    if proc_cgroups is not None:
        (proc / "cgroups").write_text(proc_cgroups)
    (proc / "mountinfo").write_text(mountinfo)
    if ns_link is not None:
        os.symlink(ns_link, proc / "ns_cgroup")
    if proc_swaps is not None:
        (proc / "swaps").write_text(fixture(proc_swaps))
    return {
        "proc_cgroups": str(proc / "cgroups"),
        "mountinfo": str(proc / "mountinfo"),
        "cgroupns": str(proc / "ns_cgroup"),
        "fs_root": str(fs_root),
        "proc_swaps": str(proc / "swaps"),
        "kernel_release": kernel_release,
    }


V1_LIVE_DIRS = (
    "sys/fs/cgroup/memory",
    "sys/fs/cgroup/memory/process_api/a",
    "sys/fs/cgroup/memory/process_api/b",
    "sys/fs/cgroup/memory/process_api/c",
    "sys/fs/cgroup/memory/fleetops-faults",
    "sys/fs/cgroup/memory/fotest",
)  # 7 directories, root included, as on the machine the fixture came from (+ the batch parent)


def test_collect_v1_host_with_real_zombies(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        dirs=V1_LIVE_DIRS,
        files={"sys/fs/cgroup/memory/memory.stat": "cache 0\n", "sys/fs/cgroup/memory/fotest/tasks": ""},
    )
    facts = memcg.collect(**host)
    assert facts == {
        "cgroup_version": 1,
        "scope": "host",
        "total": 1536,
        "live": 7,
        "zombies": 1529,
        "id_used": 7,  # no swap on 6.18: the 1,529 dying memcgs gave their IDs back
        "id_headroom": 65528,
        "id_headroom_pct": 99.98,
        "id_headroom_basis": memcg.ID_BASIS_LIVE_NO_SWAP,
        "basis": memcg.BASIS_V1,
        "scope_reason": "initial cgroup namespace (cgroup:[4026531835]) and the hierarchy is mounted at its root",
        "hierarchy": "/sys/fs/cgroup/memory",
        "reason": None,
    }


def test_collect_v1_clamps_zombies_at_zero(tmp_path: Path) -> None:
    # a cgroup created between the read of /proc/cgroups and the walk: more dirs than the total
    dirs = (*V1_LIVE_DIRS, *(f"sys/fs/cgroup/memory/new{i}" for i in range(10)))
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_host.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        dirs=dirs,
    )
    facts = memcg.collect(**host)
    assert (facts["total"], facts["live"], facts["zombies"]) == (12, 17, 0)
    assert facts["id_used"] == 12  # never more IDs than memcgs


def test_collect_v1_does_not_follow_symlinks(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_host.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        dirs=V1_LIVE_DIRS,
    )
    os.symlink("..", Path(host["fs_root"]) / "sys/fs/cgroup/memory/fotest/loop")
    assert memcg.collect(**host)["live"] == 7


def test_collect_v1_bind_mounted_subtree_is_namespace_scope(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_nspawn.txt"),
        dirs=("sys/fs/cgroup/memory/system.slice/ssh.service", "sys/fs/cgroup/memory/init.scope"),
    )
    facts = memcg.collect(**host)
    assert facts["cgroup_version"] == 1
    assert facts["scope"] == "namespace"
    assert facts["zombies"] is None  # never host total minus the visible subtree
    assert facts["total"] == 1536
    assert facts["live"] == 4
    # no swap, but the subtree's 4 live memcgs are not the host's: the worst case
    assert facts["id_used"] == 1536
    assert facts["id_headroom"] == 65535 - 1536
    assert facts["id_headroom_basis"] == memcg.ID_BASIS_NAMESPACE
    assert "subtree /fleetops-lab/lab-01" in facts["scope_reason"]
    assert facts["basis"] == memcg.BASIS_V1_NAMESPACE


def test_collect_v1_real_subtree_capture(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_host.txt"),
        mountinfo=fixture("mountinfo.v1_nspawn_subtree.txt"),
        dirs=("sys/fs/cgroup/memory/system.slice/ssh.service",),
    )
    facts = memcg.collect(**host)
    assert (facts["scope"], facts["zombies"], facts["live"]) == ("namespace", None, 3)


def test_collect_v1_in_a_cgroup_namespace(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_cgroupns.txt"),
        ns_link=fixture("ns_cgroup.cgroupns.txt").strip(),
        dirs=V1_LIVE_DIRS,
    )
    facts = memcg.collect(**host)
    assert facts["scope"] == "namespace"
    assert facts["zombies"] is None
    assert "not in the initial cgroup namespace (cgroup:[4026532177]" in facts["scope_reason"]
    assert "subtree /../.." in facts["scope_reason"]


def test_collect_v1_other_cgroupns_with_root_mount(tmp_path: Path) -> None:
    # e.g. docker --cgroupns=private on a v1 host: the mount looks like "/" but the ns is not init
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        ns_link="cgroup:[4026532999]",
        dirs=V1_LIVE_DIRS,
    )
    facts = memcg.collect(**host)
    assert (facts["scope"], facts["zombies"], facts["total"]) == ("namespace", None, 1536)
    assert "subtree" not in facts["scope_reason"]


def test_collect_v1_unknown_namespace_is_host(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        ns_link=None,
        dirs=V1_LIVE_DIRS,
    )
    facts = memcg.collect(**host)
    assert (facts["scope"], facts["zombies"]) == ("host", 1529)
    assert facts["scope_reason"].startswith("cgroup namespace unknown (")


def test_collect_v1_hierarchy_not_mounted(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
    )
    facts = memcg.collect(**host)
    assert (facts["cgroup_version"], facts["scope"], facts["total"]) == (1, "namespace", 1536)
    assert facts["live"] is None and facts["zombies"] is None and facts["hierarchy"] is None
    assert "not mounted" in facts["scope_reason"]


def test_collect_v1_unreadable_hierarchy_is_an_error(tmp_path: Path) -> None:
    host = make_host(
        tmp_path, proc_cgroups=fixture("proc_cgroups.v1_host.txt"), mountinfo=fixture("mountinfo.v1_host.txt")
    )
    with pytest.raises(
        memcg.MemcgError, match=r"^Failed to walk /sys/fs/cgroup/memory: No such file or directory$"
    ):
        memcg.collect(**host)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("proc_cgroups.truncated.txt", "Failed to parse {path}: line 6: truncated"),
        (
            "proc_cgroups.non_integer.txt",
            "Failed to parse {path}: line 6: num_cgroups '1z' is not an integer",
        ),
        ("proc_cgroups.binary_garbage.txt", "Failed to parse {path}: "),
    ],
)
def test_collect_malformed_proc_cgroups(tmp_path: Path, name: str, expected: str) -> None:
    host = make_host(
        tmp_path, proc_cgroups=fixture(name), mountinfo=fixture("mountinfo.v1_host.txt"), dirs=V1_LIVE_DIRS
    )
    with pytest.raises(memcg.MemcgError) as err:
        memcg.collect(**host)
    assert str(err.value).startswith(expected.format(path=host["proc_cgroups"]))


def test_collect_memory_disabled(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.memory_disabled.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
    )
    facts = memcg.collect(**host)
    assert facts["cgroup_version"] is None
    assert "cgroup_disable=memory" in facts["reason"]
    assert (facts["id_used"], facts["id_headroom"], facts["id_headroom_basis"]) == (None, None, "")


def _v2_files(
    stat: str, controllers: str = "cpuset cpu io memory hugetlb pids rdma misc\n"
) -> dict[str, str]:
    return {"sys/fs/cgroup/cgroup.stat": stat, "sys/fs/cgroup/cgroup.controllers": controllers}


def test_collect_v2_6_12_without_memory_line(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.12_no_memory.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
        files=_v2_files(fixture("cgroup_stat.v2_6.12.txt")),
    )
    facts = memcg.collect(**host)
    assert facts["cgroup_version"] == 2
    assert facts["scope"] == "host"
    assert (facts["live"], facts["zombies"], facts["total"]) == (88, 1523, 88 + 1523)
    assert facts["basis"] == memcg.BASIS_V2_SUBSYS + memcg.BASIS_TOTAL_STAT
    assert (facts["id_used"], facts["id_headroom"]) == (88, 65535 - 88)
    assert facts["hierarchy"] == "/sys/fs/cgroup"


def test_collect_v2_6_12_with_memory_line(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.6.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
        files=_v2_files(fixture("cgroup_stat.v2_6.12.txt")),
    )
    facts = memcg.collect(**host)
    assert (facts["live"], facts["zombies"], facts["total"]) == (88, 1523, 1287)
    assert facts["basis"].endswith(memcg.BASIS_TOTAL_PROC)


def test_collect_v2_before_6_12_counts_all_controllers(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.6.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
        files=_v2_files(fixture("cgroup_stat.v2_6.6.txt")),
    )
    facts = memcg.collect(**host)
    assert (facts["live"], facts["zombies"], facts["total"]) == (61, 1226, 1287)
    assert facts["basis"].startswith(memcg.BASIS_V2_DESCENDANTS)
    assert facts["id_used"] == 61
    assert "all controllers" in facts["basis"]


def test_collect_v2_truncated_stat_is_an_error(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.12_no_memory.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
        files=_v2_files(fixture("cgroup_stat.truncated.txt")),
    )
    with pytest.raises(
        memcg.MemcgError, match=r"^Failed to parse /sys/fs/cgroup/cgroup.stat: line \d+: truncated"
    ):
        memcg.collect(**host)


def test_collect_v2_namespace(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.6.txt"),
        mountinfo=fixture("mountinfo.v2_host.txt"),
        ns_link="cgroup:[4026532500]",
        files=_v2_files(fixture("cgroup_stat.v2_6.12.txt")),
    )
    facts = memcg.collect(**host)
    assert (facts["cgroup_version"], facts["scope"], facts["zombies"], facts["total"]) == (
        2,
        "namespace",
        None,
        1287,
    )
    assert (facts["id_used"], facts["id_headroom_basis"]) == (1287, memcg.ID_BASIS_NAMESPACE)


# ---------------------------------------------------------------------------------------------
# Which memcgs hold an ID: swap, kernel release, namespace
# ---------------------------------------------------------------------------------------------


def _zombie_host(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    """The real v1 capture with 1,529 zombies and 7 live memcgs, in the initial namespace."""
    return make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v1_zombies.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        dirs=V1_LIVE_DIRS,
        **kwargs,
    )


def test_ids_swap_on_but_empty_counts_live(tmp_path: Path) -> None:
    facts = memcg.collect(**_zombie_host(tmp_path, proc_swaps="proc_swaps.partition_unused.txt"))
    assert (facts["total"], facts["live"], facts["zombies"]) == (1536, 7, 1529)
    assert (facts["id_used"], facts["id_headroom"]) == (7, 65528)
    assert facts["id_headroom_basis"] == memcg.ID_BASIS_LIVE_SWAP_EMPTY


def test_ids_swap_in_use_counts_every_memcg(tmp_path: Path) -> None:
    facts = memcg.collect(**_zombie_host(tmp_path, proc_swaps="proc_swaps.in_use.txt"))
    assert facts["zombies"] == 1529
    assert (facts["id_used"], facts["id_headroom"], facts["id_headroom_pct"]) == (1536, 63999, 97.65)
    assert facts["id_headroom_basis"] == memcg.ID_BASIS_SWAP_USED
    assert "swapped-out pages keep a dying memcg's ID" in facts["id_headroom_basis"]


def test_ids_one_swapped_page_is_enough(tmp_path: Path) -> None:
    host = _zombie_host(tmp_path)
    one_page = fixture("proc_swaps.partition_unused.txt").replace("8388604\t\t0\t\t-2", "8388604\t\t4\t\t-2")
    Path(host["proc_swaps"]).write_text(one_page)
    facts = memcg.collect(**host)
    assert (facts["id_used"], facts["id_headroom_basis"]) == (1536, memcg.ID_BASIS_SWAP_USED)


def test_ids_unreadable_proc_swaps_is_the_worst_case_not_an_error(tmp_path: Path) -> None:
    host = _zombie_host(tmp_path, proc_swaps=None)
    facts = memcg.collect(**host)
    assert (facts["zombies"], facts["id_used"], facts["id_headroom"]) == (1529, 1536, 63999)
    assert facts["id_headroom_basis"] == (
        f"every memcg, dying included: worst case, swap state unknown ({host['proc_swaps']}: No such file or directory)"
    )


def test_ids_malformed_proc_swaps_is_the_worst_case(tmp_path: Path) -> None:
    host = _zombie_host(tmp_path)
    Path(host["proc_swaps"]).write_text(fixture("proc_swaps.partition_unused.txt").rstrip("\n"))
    facts = memcg.collect(**host)
    assert facts["id_used"] == 1536
    assert facts["id_headroom_basis"].startswith(
        "every memcg, dying included: worst case, swap state unknown "
        f"(Failed to parse {host['proc_swaps']}: line 2: truncated"
    )


@pytest.mark.parametrize(
    ("release", "basis"),
    [
        (
            "4.4.0-210-generic",
            "every memcg, dying included: before Linux 4.7 (this is 4.4.0-210-generic) "
            "a dying memcg keeps its ID until it is freed",
        ),
        (
            "3.10.0-1160.el7.x86_64",
            "every memcg, dying included: before Linux 4.7 (this is 3.10.0-1160.el7.x86_64) "
            "a dying memcg keeps its ID until it is freed",
        ),
        (
            "4.6.7",
            "every memcg, dying included: before Linux 4.7 (this is 4.6.7) a dying memcg keeps its ID until it is freed",
        ),
        ("garbage", "every memcg, dying included: worst case, kernel release 'garbage' not understood"),
    ],
)
def test_ids_old_or_unknown_kernel_counts_every_memcg(tmp_path: Path, release: str, basis: str) -> None:
    facts = memcg.collect(**_zombie_host(tmp_path, kernel_release=release))
    assert (facts["zombies"], facts["id_used"], facts["id_headroom"]) == (1529, 1536, 63999)
    assert facts["id_headroom_basis"] == basis


def test_ids_first_kernel_that_releases_ids(tmp_path: Path) -> None:
    facts = memcg.collect(**_zombie_host(tmp_path, kernel_release="4.7.0"))
    assert (facts["id_used"], facts["id_headroom_basis"]) == (7, memcg.ID_BASIS_LIVE_NO_SWAP)


def test_ids_pinterest_count_is_not_id_exhaustion_without_swap(tmp_path: Path) -> None:
    # 68,680 memcgs counted, more than there are IDs: only possible because dying ones hold none
    proc_cgroups = fixture("proc_cgroups.v1_zombies.txt").replace("memory\t4\t1536\t1", "memory\t4\t68680\t1")
    host = make_host(
        tmp_path, proc_cgroups=proc_cgroups, mountinfo=fixture("mountinfo.v1_host.txt"), dirs=V1_LIVE_DIRS
    )
    facts = memcg.collect(**host)
    assert (facts["total"], facts["zombies"], facts["id_used"], facts["id_headroom"]) == (
        68680,
        68673,
        7,
        65528,
    )
    (finding,) = memcg.evaluate(facts)
    assert finding["severity"] == "critical"  # by zombie_critical, not by the IDs
    assert finding["summary"] == (
        "68,673 zombie memory cgroups (critical at 20,000); 65,528 of 65,535 memcg IDs free"
    )
    Path(host["proc_swaps"]).write_text(fixture("proc_swaps.in_use.txt"))
    (swapping,) = memcg.evaluate(memcg.collect(**host))
    assert swapping["summary"] == (
        "68,673 zombie memory cgroups (critical at 20,000); only 0 of 65,535 memcg IDs free (0%, critical under "
        "20%); counted against every memcg, dying included: swap is in use, and swapped-out pages keep a dying "
        "memcg's ID"
    )


def test_collect_no_memory_controller_anywhere(tmp_path: Path) -> None:
    # the real hybrid host's unified hierarchy, without the v1 memory mount and line
    mountinfo = "".join(
        line + "\n" for line in fixture("mountinfo.v1_host.txt").splitlines() if "memory" not in line
    )
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.12_no_memory.txt"),
        mountinfo=mountinfo,
        files={
            "sys/fs/cgroup/unified/cgroup.stat": fixture("cgroup_stat.hybrid_unified_6.18.txt"),
            "sys/fs/cgroup/unified/cgroup.controllers": fixture("cgroup_controllers.hybrid_unified.txt"),
        },
    )
    facts = memcg.collect(**host)
    assert facts["cgroup_version"] is None
    assert facts["total"] is None and facts["zombies"] is None
    assert facts["reason"] == (
        "no memory cgroup controller here: /proc/cgroups has no memory line and memory is not in "
        "/sys/fs/cgroup/unified/cgroup.controllers"
    )
    assert memcg.evaluate(facts) == []


def test_collect_missing_proc_cgroups_and_no_cgroup2(tmp_path: Path) -> None:
    host = make_host(tmp_path, proc_cgroups=None, mountinfo="27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
    facts = memcg.collect(**host)
    assert facts["cgroup_version"] is None
    assert facts["reason"].endswith("no memory line and no cgroup2 hierarchy is mounted")


def test_collect_v1_mount_without_memory_line_is_an_error(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        proc_cgroups=fixture("proc_cgroups.v2_6.12_no_memory.txt"),
        mountinfo=fixture("mountinfo.v1_host.txt"),
        dirs=V1_LIVE_DIRS,
    )
    with pytest.raises(
        memcg.MemcgError, match="no memory line although a cgroup v1 memory hierarchy is mounted"
    ):
        memcg.collect(**host)


def test_add_growth() -> None:
    first = {"cgroup_version": 1, "total": 1000, "live": 10, "zombies": 990}
    second = {"cgroup_version": 1, "total": 1060, "live": 10, "zombies": 1050}
    facts = memcg.add_growth(first, second, 30.0)
    assert facts["growth"] == {
        "seconds": 30.0,
        "total_per_min": 120.0,
        "live_per_min": 0.0,
        "zombies_per_min": 120.0,
    }
    assert "growth" not in second
    ns = memcg.add_growth({**first, "zombies": None}, {**second, "zombies": None}, 60.0)
    assert ns["growth"]["zombies_per_min"] is None and ns["growth"]["total_per_min"] == 60.0
    assert "growth" not in memcg.add_growth({"cgroup_version": None}, {"cgroup_version": None}, 5.0)


# ---------------------------------------------------------------------------------------------
# The real host (read-only)
# ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/cgroups").exists(), reason="needs Linux /proc")
def test_collect_on_this_host() -> None:
    facts = memcg.collect()
    assert set(facts) == {
        "cgroup_version",
        "scope",
        "total",
        "live",
        "zombies",
        "id_used",
        "id_headroom",
        "id_headroom_pct",
        "id_headroom_basis",
        "basis",
        "scope_reason",
        "hierarchy",
        "reason",
    }
    if facts["cgroup_version"] == 1 and facts["scope"] == "host":
        assert facts["total"] >= 1 and facts["live"] >= 1
        assert facts["zombies"] == max(0, facts["total"] - facts["live"])
    if facts["cgroup_version"] is not None:
        swap_used = sum(a["used_kib"] for a in memcg.parse_proc_swaps(Path("/proc/swaps").read_text()))
        version = memcg.parse_kernel_release(os.uname().release)
        releases = facts["scope"] == "host" and version is not None and version >= (4, 7)
        if releases and swap_used == 0:
            assert facts["id_used"] == min(facts["live"], facts["total"])
            assert facts["id_headroom_basis"].startswith("live memcgs: ")
        else:
            assert facts["id_used"] == facts["total"]
            assert facts["id_headroom_basis"].startswith("every memcg, dying included: ")
        assert facts["id_headroom"] == max(0, 65535 - facts["id_used"])
