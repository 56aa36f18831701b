#!/usr/bin/python3
"""Make COUNT real zombie memory cgroups on a cgroup v1 host (or nspawn lab host), as faults.py does.

For each: mkdir a memory cgroup under PARENT, move this process in, write one page of PIN (a file
created beforehand, on disk: its page cache pins the cgroup after rmdir), move back, rmdir. Inside a
lab host the memory hierarchy is read-only until remounted: then it is remounted read-write and the
file MARK records that, so cleanup can put it back. Prints one JSON line:
{"created": N, "total_before": T0, "total_after": T1, "seconds": S, "remounted": bool}.
"""

import json
import os
import subprocess
import sys
import time

MEM = "/sys/fs/cgroup/memory"
PAGE = b"z" * 4096


def total():
    with open("/proc/cgroups") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) == 4 and fields[0] == "memory":
                return int(fields[2])
    raise SystemExit("no memory line in /proc/cgroups (no cgroup v1 memory controller)")


def read_only():
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            if fields[4] == MEM:
                return "ro" in fields[5].split(",")
    raise SystemExit(f"no cgroup v1 memory hierarchy mounted at {MEM}")


def write_pid(path):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def origin():
    """This process's memory cgroup as a path under MEM (the mount may be a subtree: fall back to its root)."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                path = MEM + parts[2].rstrip("/")
                if os.path.exists(path + "/cgroup.procs"):
                    return path + "/cgroup.procs"
    return MEM + "/cgroup.procs"


def main():
    count, parent, pin, mark = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    remounted = False
    if read_only():
        if subprocess.run(["mount", "-o", "remount,bind,rw", MEM], check=False).returncode != 0:
            raise SystemExit(f"could not remount {MEM} read-write")
        remounted = True
        with open(mark, "w") as handle:
            handle.write("remounted\n")
    back = origin()
    cgroup = os.path.join(MEM, parent)
    os.makedirs(cgroup, exist_ok=True)
    before = total()
    started = time.monotonic()
    made = 0
    fd = os.open(pin, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(count):
            child = os.path.join(cgroup, f"z{i}")
            os.mkdir(child)
            try:
                write_pid(child + "/cgroup.procs")
                try:
                    os.pwrite(fd, PAGE, i * len(PAGE))
                finally:
                    write_pid(back)
            finally:
                os.rmdir(child)
            made += 1
    finally:
        os.close(fd)
    print(
        json.dumps(
            {
                "created": made,
                "total_before": before,
                "total_after": total(),
                "seconds": round(time.monotonic() - started, 3),
                "remounted": remounted,
            }
        )
    )


if __name__ == "__main__":
    main()
