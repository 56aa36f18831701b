#!/usr/bin/python3
"""Make COUNT real zombie memory cgroups on a cgroup v2 host (a VM lab host: its own kernel).

For each: mkdir a memory cgroup under /sys/fs/cgroup/PARENT (the memory controller switched on for
the root's and PARENT's children), move this process in, write one page of PIN (a file created
beforehand, on disk: its page cache pins the cgroup after rmdir), move back, rmdir. Prints one JSON
line: {"created": N, "dying_before": D0, "dying_after": D1, "seconds": S}, the dying counts from the
root cgroup.stat (nr_dying_descendants: this kernel's, the host's own).
"""

import json
import os
import sys
import time

ROOT = "/sys/fs/cgroup"
PAGE = b"z" * 4096


def dying():
    with open(ROOT + "/cgroup.stat") as handle:
        for line in handle:
            if line.startswith("nr_dying_descendants "):
                return int(line.split()[1])
    raise SystemExit(f"no nr_dying_descendants in {ROOT}/cgroup.stat (not cgroup v2?)")


def enable_memory(cgroup):
    with open(cgroup + "/cgroup.subtree_control") as handle:
        if "memory" in handle.read().split():
            return
    with open(cgroup + "/cgroup.subtree_control", "w") as handle:
        handle.write("+memory\n")


def main():
    count, parent, pin = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if not os.path.exists(ROOT + "/cgroup.controllers"):
        raise SystemExit(f"{ROOT} is not a cgroup v2 hierarchy (no cgroup.controllers)")
    with open(ROOT + "/cgroup.controllers") as handle:
        if "memory" not in handle.read().split():
            raise SystemExit(f"the memory controller is not available in {ROOT} (cgroup v1 host?)")
    with open("/proc/self/cgroup") as handle:
        own = next(line.split(":", 2)[2].strip() for line in handle if line.startswith("0::"))
    home = ROOT + own + "/cgroup.procs"
    parent_dir = ROOT + "/" + parent
    os.makedirs(parent_dir, exist_ok=True)
    enable_memory(ROOT)
    enable_memory(parent_dir)
    before = dying()
    started = time.monotonic()
    pid = str(os.getpid()).encode()
    fd = os.open(pin, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for i in range(count):
            cgroup = f"{parent_dir}/z{i}"
            os.mkdir(cgroup)
            with open(cgroup + "/cgroup.procs", "wb") as handle:
                handle.write(pid)
            os.pwrite(fd, PAGE, i * len(PAGE))
            with open(home, "wb") as handle:
                handle.write(pid)
            os.rmdir(cgroup)
    finally:
        os.close(fd)
    seconds = round(time.monotonic() - started, 2)
    print(json.dumps({"created": count, "dying_before": before, "dying_after": dying(), "seconds": seconds}))


main()
