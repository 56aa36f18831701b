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
  - Reclaim is C(sync) then C(echo 1 > /proc/sys/vm/drop_caches) (clean page cache only), and on
    cgroup v2 a write to the root C(memory.reclaim) when O(v2_reclaim_bytes) is set.
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
    description: On cgroup v2, also write this many bytes to the root C(memory.reclaim). 0 disables it.
    type: int
    default: 0
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
"""

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


def _needs_reboot(facts, threshold):
    if facts.get("zombies") is None:
        return None
    return facts["zombies"] >= threshold


def main():
    module = AnsibleModule(
        argument_spec=dict(
            # the scan's warning level, defined once (memcg.DEFAULT_THRESHOLDS)
            min_zombies=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_warning"]),
            settle_seconds=dict(type="float", default=5),
            reboot_threshold=dict(type="int", default=memcg.DEFAULT_THRESHOLDS["zombie_warning"]),
            v2_reclaim_bytes=dict(type="int", default=0),
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
    )
    if not reclaim or module.check_mode:
        if module._diff:
            text = _text(before, pending, basis)
            # check mode: what the reclaim would do; nothing to reclaim: no difference
            after = "sync; echo 1 > %s; then %s" % (DROP_CACHES, text) if reclaim else text
            result["diff"] = dict(before=text, after=after)
        module.exit_json(**result)

    try:
        os.sync()
        with open(DROP_CACHES, "w") as handle:
            handle.write("1\n")
        if before["cgroup_version"] == 2 and p["v2_reclaim_bytes"]:
            root = before.get("hierarchy") or "/sys/fs/cgroup"
            with open(os.path.join(root, "memory.reclaim"), "w") as handle:
                handle.write("%d\n" % p["v2_reclaim_bytes"])
    except (IOError, OSError) as err:
        module.fail_json(
            msg="Failed to reclaim memory cgroups: %s (%s)"
            % (err.strerror or err, getattr(err, "filename", "")),
            before=before,
        )

    # Dying cgroups are freed asynchronously (css_free_rwork_fn): poll until the count settles.
    deadline = time.monotonic() + p["settle_seconds"]
    after = _measure(module)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        latest = _measure(module)
        if latest["total"] >= after["total"]:
            after = latest
            break
        after = latest
    freed = max(0, before["total"] - after["total"])
    result.update(after=after, freed=freed, needs_reboot=_needs_reboot(after, p["reboot_threshold"]))
    if module._diff:
        result["diff"] = dict(before=_text(before, pending, basis), after=_text(after, *_pending(after)))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
