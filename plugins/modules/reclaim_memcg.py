#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: (c) 2025, fleetops maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: reclaim_memcg
short_description: Free zombie memory cgroups without a reboot by dropping the page cache that pins them
version_added: "0.1.0"
description:
  - Measures memory cgroups, reclaims, measures again, and reports what was freed.
  - How it reclaims is O(method). C(drop_caches) (the default) is C(sync) then
    C(echo 1 > /proc/sys/vm/drop_caches), so every clean page cache page on the host goes, every workload's
    cached files with it; on cgroup v2 it also writes the root C(memory.reclaim) when O(v2_reclaim_bytes)
    is set.
  - C(memory_reclaim) (cgroup v2, Linux >= 5.19) is the gentler rung, C(sync) then a write to
    C(memory.reclaim) of the live cgroups whose own children include dying memory cgroups (found from
    the C(nr_dying_descendants) of each C(cgroup.stat) on the way to them; the fewest, most dying first,
    that hold enough of them to bring the count under O(min_zombies)), asking for the page cache
    charged beneath it but to none of its live children (its C(memory.stat) C(file) less theirs). Page
    cache elsewhere on the host stays; the live siblings of the zombies can lose some, as the kernel
    reclaims across the subtree. A kernel that cannot reclaim the whole amount answers EAGAIN; that
    target is reported C(partial), not an error.
  - C(both) tries C(memory_reclaim) first and drops the caches only when the count is still at or above
    O(min_zombies) after it has settled.
  - It cannot free zombies pinned by mapped, dirty, shmem, swap or socket memory; those need a
    reboot. RV(needs_reboot) says whether zombies at or above O(reboot_threshold) remain.
  - Fix the cause first (for example M(fleetops.node.disable_unit) on the crash-looping unit), or the
    zombies come back.
  - C(changed) means the reclaim ran. It drops the page cache (in check mode, would) exactly when the
    zombie count is at or above O(min_zombies), so check mode predicts the real run from the same
    reading, and a run that brought the count under O(min_zombies) leaves the next one nothing to do
    (C(changed=false)). RV(freed) says what the kernel's count fell by; it is evidence, not the
    change, because the count is machine-wide and other activity can move it either way.
  - Pick O(min_zombies) above the floor that C(drop_caches) cannot free on the host (zombies pinned by
    mapped, shmem or swap memory); while that floor is at or above it, every run reclaims again and
    reports a change, and RV(needs_reboot) says whether a reboot is due.
options:
  min_zombies:
    description:
      - Reclaim only when at least this many zombies exist (RV(pending)); below it do nothing and
        report no change.
      - The default is the zombie count at which M(fleetops.node.node_health) warns, the default of its
        O(fleetops.node.node_health#module:zombie_warning). Dropping the page cache costs every workload on
        the host its cached files, so a host with a few zombies is left alone.
      - In a cgroup namespace (a container, an nspawn guest), where zombies cannot be counted, the
        host-wide total of memory cgroups (live and dying, every container's) is compared instead;
        set it above that total's normal level.
    type: int
    default: 1000
  settle_seconds:
    description: How long to wait for the kernel to free the dying cgroups after the reclaim (they go asynchronously).
    type: float
    default: 5
  reboot_threshold:
    description:
      - Zombies still present at or above this count after the reclaim set RV(needs_reboot).
      - The default is the zombie count at which M(fleetops.node.node_health) warns.
    type: int
    default: 1000
  v2_reclaim_bytes:
    description:
      - With O(method=drop_caches) on cgroup v2, also write this many bytes to the root C(memory.reclaim).
      - With O(method=memory_reclaim) or O(method=both), the bytes asked of each target instead of the
        estimate of what its zombies pin.
      - 0 disables it (drop_caches) or uses the estimate (memory_reclaim).
    type: int
    default: 0
  method:
    description:
      - How to reclaim (see the description). C(memory_reclaim) and C(both) fail on cgroup v1 and on a
        kernel without C(memory.reclaim) (before 5.19), before anything changes, in check mode too.
    type: str
    choices: [drop_caches, memory_reclaim, both]
    default: drop_caches
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
notes:
  - C(drop_caches) acts on the whole machine; inside a container it needs a writable C(/proc/sys).
author:
  - fleetops maintainers (@fleetops)
"""

EXAMPLES = r"""
- name: Reclaim zombie memory cgroups after the culprit unit is off
  fleetops.node.reclaim_memcg:
  register: reclaim

- name: Inside a container (zombies not countable), reclaim only when the host-wide memcg total is high
  fleetops.node.reclaim_memcg:
    min_zombies: 5000

- name: Reboot only hosts where reclaim was not enough
  ansible.builtin.reboot:
  when: reclaim.needs_reboot
"""

RETURN = r"""
before:
  description: The zombie_memcg facts before the reclaim (see M(fleetops.node.node_health)).
  returned: always
  type: dict
after:
  description: The zombie_memcg facts after the reclaim and the settle time (equal to before in check mode).
  returned: always
  type: dict
pending:
  description: The count compared with O(min_zombies) before the reclaim (see RV(pending_basis)).
  returned: always
  type: int
  sample: 1512
pending_basis:
  description: What RV(pending) counts, C(zombies), or C(host-wide total) in a cgroup namespace.
  returned: always
  type: str
  sample: zombies
reclaimed:
  description: The page cache was dropped (in check mode, would be); the same as C(changed).
  returned: always
  type: bool
freed:
  description: Memory cgroups freed (the drop of the kernel's total count; 0 in check mode or when nothing was reclaimed).
  returned: always
  type: int
  sample: 1493
needs_reboot:
  description: Zombies at or above reboot_threshold remain (or, where zombies cannot be counted, null).
  returned: always
  type: bool
method:
  description: The O(method) asked for.
  returned: always
  type: str
  sample: memory_reclaim
steps:
  description:
    - What ran, in order (empty when nothing did; in check mode, what would run, with C(result) C(would)).
    - Each has C(method) (C(memory_reclaim) or C(drop_caches)), C(target) (the cgroup, or
      C(/proc/sys/vm/drop_caches)), C(bytes) (asked of memory.reclaim; null for drop_caches), C(dying)
      (dying memory cgroups under that target; null for drop_caches), C(seconds) and C(result)
      (C(done), C(partial) when the kernel reclaimed less than asked, C(skipped) when O(method=both)
      needed no drop_caches).
  returned: always
  type: list
  elements: dict
  sample: [{"method": "memory_reclaim", "target": "/system.slice", "bytes": 4194304, "dying": 1500,
            "seconds": 0.02, "result": "done"}]
reclaim_seconds:
  description: Seconds the reclaim itself took (sync and the writes; not the settle time).
  returned: always
  type: float
"""

import errno
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.node.plugins.module_utils import memcg
from ansible_collections.fleetops.node.plugins.module_utils.findings import DetectorError

DROP_CACHES = "/proc/sys/vm/drop_caches"


def _measure(module):
    try:
        return memcg.collect()
    except DetectorError as err:
        module.fail_json(msg=str(err))


def _pending(facts):
    """(count compared with min_zombies, what it counts): zombies, or in a namespace the host-wide total."""
    if facts["zombies"] is not None:
        return facts["zombies"], "zombies"
    return facts["total"], "host-wide total"


def _text(facts, pending, basis):
    return "memcg total %d, %s %d\n" % (facts["total"], basis, pending)


def _plan_text(method, targets):
    parts = ["sync"]
    if method != "drop_caches":
        parts.extend("%s bytes > %s/memory.reclaim" % (t["bytes"], t["cgroup"].rstrip("/")) for t in targets)
    if method == "both":
        parts.append("if still %s: echo 1 > %s" % ("pending", DROP_CACHES))
    elif method == "drop_caches":
        parts.append("echo 1 > %s" % DROP_CACHES)
    return "; ".join(parts)


def _needs_reboot(facts, threshold):
    if facts.get("zombies") is None:
        return None
    return facts["zombies"] >= threshold


def _check_method(module, before, method):
    """memory_reclaim needs cgroup v2 and a kernel with memory.reclaim: fail before any change."""
    if method == "drop_caches":
        return
    if before["cgroup_version"] != 2:
        module.fail_json(
            msg="Failed to reclaim memory cgroups: method %s needs cgroup v2, and this host's memory "
            "controller is on cgroup v%s; use method drop_caches" % (method, before["cgroup_version"]),
            before=before,
        )
    root = before.get("hierarchy") or "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(root, memcg.MEMORY_RECLAIM)):
        module.fail_json(
            msg="Failed to reclaim memory cgroups: method %s needs %s/%s, which kernel %s does not have "
            "(Linux >= %d.%d); use method drop_caches"
            % ((method, root, memcg.MEMORY_RECLAIM, os.uname()[2]) + memcg.MEMORY_RECLAIM_SINCE),
            before=before,
        )


def _targets(module, before, bytes_override, min_zombies):
    root = before.get("hierarchy") or "/sys/fs/cgroup"
    try:
        targets = memcg.reclaim_targets(root)
    except DetectorError as err:
        module.fail_json(msg="Failed to find the zombie memory cgroups: %s" % err, before=before)
    if before.get("zombies") is not None:
        targets = memcg.pick_targets(targets, before["zombies"], min_zombies)
    for target in targets:
        if bytes_override:
            target["bytes"] = bytes_override
    return root, targets


def _memory_reclaim(root, targets):
    """Write memory.reclaim of each target; the steps that ran. EAGAIN: reclaimed less than asked."""
    steps = []
    for target in targets:
        started = time.monotonic()
        path = os.path.join(root, target["cgroup"].lstrip("/"), memcg.MEMORY_RECLAIM)
        result = "done"
        try:
            with open(path, "w") as handle:
                handle.write("%d\n" % target["bytes"])
        except (IOError, OSError) as err:
            if err.errno != errno.EAGAIN:
                raise
            result = "partial"
        steps.append(
            dict(
                method="memory_reclaim",
                target=target["cgroup"],
                bytes=target["bytes"],
                dying=target["dying"],
                seconds=round(time.monotonic() - started, 3),
                result=result,
            )
        )
    return steps


def _drop_caches(before, v2_reclaim_bytes):
    started = time.monotonic()
    with open(DROP_CACHES, "w") as handle:
        handle.write("1\n")
    if before["cgroup_version"] == 2 and v2_reclaim_bytes:
        root = before.get("hierarchy") or "/sys/fs/cgroup"
        with open(os.path.join(root, memcg.MEMORY_RECLAIM), "w") as handle:
            handle.write("%d\n" % v2_reclaim_bytes)
    return dict(
        method="drop_caches",
        target=DROP_CACHES,
        bytes=None,
        dying=None,
        seconds=round(time.monotonic() - started, 3),
        result="done",
    )


def _settle(module, before, seconds):
    """Dying cgroups are freed asynchronously (css_free_rwork_fn): poll until the count settles."""
    deadline = time.monotonic() + seconds
    after = _measure(module)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        latest = _measure(module)
        if latest["total"] >= after["total"]:
            after = latest
            break
        after = latest
    return after


def main():
    module = AnsibleModule(
        argument_spec=dict(
            # the scan's warning level, defined once (memcg.DEFAULT_THRESHOLDS)
            min_zombies=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_warning"]),
            settle_seconds=dict(type="float", default=5),
            reboot_threshold=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_warning"]),
            v2_reclaim_bytes=dict(type="int", default=0),
            method=dict(type="str", default="drop_caches", choices=["drop_caches", "memory_reclaim", "both"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for key in ("min_zombies", "settle_seconds", "reboot_threshold", "v2_reclaim_bytes"):
        if p[key] < 0:
            module.fail_json(msg="Failed to reclaim memory cgroups: %s must not be negative" % key)
    before = _measure(module)
    if before.get("cgroup_version") is None:
        module.fail_json(msg="Failed to reclaim memory cgroups: %s" % before.get("reason"), before=before)
    method = p["method"]
    _check_method(module, before, method)
    pending, basis = _pending(before)
    reclaim = pending >= p["min_zombies"]
    result = dict(
        changed=reclaim,
        reclaimed=reclaim,
        pending=pending,
        pending_basis=basis,
        before=before,
        after=before,
        freed=0,
        needs_reboot=_needs_reboot(before, p["reboot_threshold"]),
        method=method,
        steps=[],
        reclaim_seconds=0.0,
    )
    targets = []
    if reclaim and method != "drop_caches":
        root, targets = _targets(module, before, p["v2_reclaim_bytes"], p["min_zombies"])
    if not reclaim or module.check_mode:
        if reclaim:
            would = [
                dict(method="memory_reclaim", target=t["cgroup"], bytes=t["bytes"], dying=t["dying"],
                     seconds=0.0, result="would")
                for t in targets
            ]  # fmt: skip
            if method != "memory_reclaim":
                would.append(dict(method="drop_caches", target=DROP_CACHES, bytes=None, dying=None, seconds=0.0,
                                  result="would"))  # fmt: skip
            result["steps"] = would
        if module._diff:
            text = _text(before, pending, basis)
            # check mode: what the reclaim would do; nothing to reclaim: no difference
            after = "%s; then %s" % (_plan_text(method, targets), text) if reclaim else text
            result["diff"] = dict(before=text, after=after)
        module.exit_json(**result)

    steps = []
    after = None
    try:
        started = time.monotonic()
        os.sync()  # dirty page cache cannot be reclaimed until written back
        synced = time.monotonic() - started
        if method != "drop_caches":
            steps.extend(_memory_reclaim(root, targets))
            after = _settle(module, before, p["settle_seconds"])
        if method == "both" and _pending(after)[0] < p["min_zombies"]:
            steps.append(
                dict(
                    method="drop_caches",
                    target=DROP_CACHES,
                    bytes=None,
                    dying=None,
                    seconds=0.0,
                    result="skipped",
                )
            )
        elif method != "memory_reclaim":
            steps.append(_drop_caches(before, p["v2_reclaim_bytes"] if method == "drop_caches" else 0))
            after = _settle(module, before, p["settle_seconds"])
    except (IOError, OSError) as err:
        module.fail_json(
            msg="Failed to reclaim memory cgroups: %s (%s)"
            % (err.strerror or err, getattr(err, "filename", "")),
            before=before,
            steps=steps,
        )
    reclaim_seconds = round(synced + sum(step["seconds"] for step in steps), 3)
    freed = max(0, before["total"] - after["total"])
    result.update(
        after=after,
        freed=freed,
        needs_reboot=_needs_reboot(after, p["reboot_threshold"]),
        steps=steps,
        reclaim_seconds=reclaim_seconds,
    )
    if module._diff:
        result["diff"] = dict(before=_text(before, pending, basis), after=_text(after, *_pending(after)))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
