"""Where the zombies hang on cgroup v2 (memcg.dying_parents, pinned_file_bytes, reclaim_targets).

The pure functions on counts shaped like a real VM lab host's (6.1 kernel, a crash-looping ecs.service:
dying cgroups under /ecs-tasks and /system.slice); reclaim_targets on a temporary tree laid out as
/sys/fs/cgroup is (cgroup.stat, cgroup.subtree_control, memory.stat per cgroup). The real kernel run is
tests/integration/test_vm_lab.py and bench/reclaim_methods.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.fleetops.node.plugins.module_utils import memcg


def test_dying_parents_subtracts_live_childrens_counts() -> None:
    # root 39 = ecs-tasks 19 + system.slice 20; system.slice's live children hold none of them.
    counts = {"": 39, "ecs-tasks": 19, "system.slice": 20, "system.slice/ssh.service": 0, "init.scope": 0}
    assert memcg.dying_parents(counts) == {"ecs-tasks": 19, "system.slice": 20}


def test_dying_parents_counts_the_first_live_ancestor_and_nested_levels() -> None:
    counts = {"": 10, "a": 10, "a/b": 7, "a/b/c": 3}
    assert memcg.dying_parents(counts) == {"a": 3, "a/b": 4, "a/b/c": 3}


def test_dying_parents_never_negative_when_counts_move_during_the_walk() -> None:
    # the root was read before a zombie under "a" appeared
    assert memcg.dying_parents({"": 1, "a": 2}) == {"a": 2}
    assert memcg.dying_parents({"": 0}) == {}


def test_pinned_file_bytes_is_the_parents_file_less_its_live_childrens() -> None:
    parent = {"anon": 0, "file": 10 * 4096}
    assert memcg.pinned_file_bytes(parent, [{"file": 4096}, {"file": 2 * 4096}, {}]) == 7 * 4096
    assert memcg.pinned_file_bytes(parent, [{"file": 11 * 4096}]) == 0
    assert memcg.pinned_file_bytes({}, []) == 0


def _cgroup(root: Path, rel: str, *, dying: int, file: int | None, memory_for_children: bool) -> None:
    path = root / rel if rel else root
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.stat").write_text(f"nr_descendants 0\nnr_dying_descendants {dying}\n")
    (path / "cgroup.subtree_control").write_text("memory pids\n" if memory_for_children else "pids\n")
    if file is not None:
        (path / "memory.stat").write_text(f"anon 0\nfile {file}\nkernel 0\n")


def test_reclaim_targets_on_a_tree_laid_out_as_sys_fs_cgroup(tmp_path: Path) -> None:
    _cgroup(tmp_path, "", dying=1503, file=900 * 4096, memory_for_children=True)
    _cgroup(tmp_path, "system.slice", dying=3, file=300 * 4096, memory_for_children=True)
    _cgroup(tmp_path, "system.slice/workload.service", dying=0, file=290 * 4096, memory_for_children=False)
    _cgroup(tmp_path, "fleetops-zombies", dying=1500, file=1500 * 4096, memory_for_children=True)
    _cgroup(tmp_path, "init.scope", dying=0, file=4096, memory_for_children=False)
    # no memory controller for its children: its dying children are not memory cgroups
    _cgroup(tmp_path, "plain", dying=0, file=None, memory_for_children=False)
    targets = memcg.reclaim_targets(str(tmp_path))
    assert targets == [
        {"cgroup": "/fleetops-zombies", "dying": 1500, "bytes": 1500 * 4096},
        {"cgroup": "/system.slice", "dying": 3, "bytes": 10 * 4096},
    ]


def test_reclaim_targets_skips_parents_without_memory_for_children_and_floors_bytes(tmp_path: Path) -> None:
    _cgroup(tmp_path, "", dying=5, file=0, memory_for_children=True)
    _cgroup(tmp_path, "nomem", dying=2, file=0, memory_for_children=False)
    _cgroup(tmp_path, "mem", dying=3, file=0, memory_for_children=True)  # page cache gone already
    assert memcg.reclaim_targets(str(tmp_path)) == [{"cgroup": "/mem", "dying": 3, "bytes": 3 * 4096}]


def test_reclaim_targets_without_a_cgroup_stat_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(memcg.MemcgError, match=r"cgroup.stat"):
        memcg.reclaim_targets(str(tmp_path))


def test_pick_targets_takes_the_fewest_that_bring_the_count_under_min_zombies() -> None:
    targets = [
        {"cgroup": "/fleetops-zombies", "dying": 1000, "bytes": 1},
        {"cgroup": "/system.slice", "dying": 6, "bytes": 1},
        {"cgroup": "/user.slice", "dying": 2, "bytes": 1},
    ]
    # 1,008 dying, reclaim under 500: the big parent alone; system.slice's services are left alone.
    assert memcg.pick_targets(targets, 1008, 500) == targets[:1]
    # under 5: the big one and system.slice (1,008 - 1,006 = 2 < 5)
    assert memcg.pick_targets(targets, 1008, 5) == targets[:2]
    # min_zombies 0 (or a count the targets cannot reach): every target
    assert memcg.pick_targets(targets, 1008, 0) == targets
    assert memcg.pick_targets(targets, 5000, 100) == targets
    assert memcg.pick_targets([], 10, 5) == []
