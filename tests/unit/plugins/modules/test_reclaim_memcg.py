"""fleetops.node.reclaim_memcg's method option.

On this machine (cgroup v1 memory, a real kernel) through ``ansible localhost``: memory_reclaim and both
are refused before anything changes, naming the cgroup version; drop_caches below min_zombies changes
nothing and says which method. A cgroup v2 kernel without memory.reclaim (before 5.19) cannot be booted
here: that refusal is checked with a stand-in module object over a temporary hierarchy. The real v2 runs
(memory.reclaim at the parents of the dying cgroups, side by side with drop_caches) are in
tests/integration/test_vm_lab.py and bench/reclaim_methods.py, on a VM lab host's own 6.1 kernel.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.fleetops.node.plugins.modules import reclaim_memcg

from tests.helpers import run_module

V1_HERE = os.path.isdir("/sys/fs/cgroup/memory") and os.geteuid() == 0


@pytest.mark.skipif(not V1_HERE, reason="needs root and this machine's cgroup v1 memory hierarchy")
@pytest.mark.parametrize("method", ["memory_reclaim", "both"])
def test_memory_reclaim_is_refused_on_cgroup_v1(tmp_path: Path, method: str) -> None:
    rc, result = run_module(tmp_path, "fleetops.node.reclaim_memcg", f"method={method} min_zombies=0")
    assert rc != 0
    assert result["msg"] == (
        f"Failed to reclaim memory cgroups: method {method} needs cgroup v2, and this host's memory "
        "controller is on cgroup v1; use method drop_caches"
    )
    assert result["before"]["cgroup_version"] == 1


@pytest.mark.skipif(not V1_HERE, reason="needs root and this machine's cgroup v1 memory hierarchy")
def test_drop_caches_below_min_zombies_changes_nothing_and_names_the_method(tmp_path: Path) -> None:
    rc, result = run_module(
        tmp_path, "fleetops.node.reclaim_memcg", "min_zombies=100000000", "--check", "--diff"
    )
    assert rc == 0, result
    assert result["changed"] is False and result["reclaimed"] is False
    assert result["method"] == "drop_caches"
    assert result["steps"] == [] and result["reclaim_seconds"] == 0.0


class _Failed(Exception):
    pass


class _Module:
    """Stands in for AnsibleModule: only fail_json, the one call _check_method makes."""

    def fail_json(self, **kwargs: Any) -> None:
        raise _Failed(kwargs["msg"])


def test_memory_reclaim_is_refused_on_a_v2_kernel_without_memory_reclaim(tmp_path: Path) -> None:
    (tmp_path / "cgroup.stat").write_text("nr_descendants 0\nnr_dying_descendants 0\n")
    before = {"cgroup_version": 2, "hierarchy": str(tmp_path)}
    with pytest.raises(
        _Failed, match=r"needs .*/memory\.reclaim, which kernel .* does not have \(Linux >= 5\.19\)"
    ):
        reclaim_memcg._check_method(_Module(), before, "memory_reclaim")
    (tmp_path / "memory.reclaim").write_text("")
    reclaim_memcg._check_method(_Module(), before, "memory_reclaim")  # no error
    reclaim_memcg._check_method(_Module(), {"cgroup_version": 1}, "drop_caches")  # drop_caches: anywhere


def test_plan_text_says_what_each_method_would_write() -> None:
    targets = [{"cgroup": "/system.slice", "dying": 3, "bytes": 12288}]
    assert reclaim_memcg._plan_text("drop_caches", targets) == "sync; echo 1 > /proc/sys/vm/drop_caches"
    assert (
        reclaim_memcg._plan_text("memory_reclaim", targets)
        == "sync; 12288 bytes > /system.slice/memory.reclaim"
    )
    assert reclaim_memcg._plan_text("both", targets).endswith(
        "if still pending: echo 1 > /proc/sys/vm/drop_caches"
    )
