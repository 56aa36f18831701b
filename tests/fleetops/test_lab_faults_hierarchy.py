"""fleetops_lab.faults.memory_hierarchy: cgroup v1 or v2, or a clear error when neither is usable.

On temporary trees laid out as the kernel's (v1: cgroup.procs + memory.usage_in_bytes; v2:
cgroup.controllers). That the v2 injector really makes zombies is proven inside a VM lab host's own
cgroup v2 kernel (tests/integration/test_vm_lab.py); this machine's kernel is v1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.errors import FleetopsError
from fleetops_lab import faults


def _v1(path: Path) -> Path:
    path.mkdir()
    (path / "cgroup.procs").write_text("")
    (path / "memory.usage_in_bytes").write_text("0\n")
    return path


def _v2(path: Path, controllers: str) -> Path:
    path.mkdir()
    (path / "cgroup.controllers").write_text(controllers + "\n")
    return path


def test_v1_memory_hierarchy_wins_when_mounted(tmp_path: Path) -> None:
    v1, v2 = _v1(tmp_path / "memory"), _v2(tmp_path / "unified", "cpu io memory pids")
    assert faults.memory_hierarchy(v1, v2) == faults.MemoryHierarchy(1, v1)


def test_v2_when_memory_is_in_the_unified_controllers(tmp_path: Path) -> None:
    v2 = _v2(tmp_path / "unified", "cpuset cpu io memory hugetlb pids rdma misc")
    assert faults.memory_hierarchy(tmp_path / "no-v1", v2) == faults.MemoryHierarchy(2, v2)


def test_neither_is_a_clear_error(tmp_path: Path) -> None:
    v2 = _v2(tmp_path / "unified", "cpu io pids")  # memory bound to a v1 hierarchy that is not mounted
    with pytest.raises(FleetopsError, match=r"no usable memory cgroup controller: neither a cgroup v1 .*"
                       r"nor cgroup v2 .* \(.*cgroup.controllers lists cpu io pids\)"):  # fmt: skip
        faults.memory_hierarchy(tmp_path / "no-v1", v2)
    with pytest.raises(FleetopsError, match=r"\(no .*/nothing/cgroup.controllers\)"):
        faults.memory_hierarchy(tmp_path / "no-v1", tmp_path / "nothing")


def test_this_machine_has_one() -> None:
    hierarchy = faults.memory_hierarchy()  # this machine: v1 (design §7); a CI machine may be v2
    assert hierarchy.version in (1, 2) and (hierarchy.root / "cgroup.procs").exists()
