"""memory.reclaim against drop_caches on a real cgroup v2 kernel (a VM lab host), on the same fault.

For each reclaim method of ``fleetops.node.reclaim_memcg`` (drop_caches, the baseline; memory_reclaim;
both) and each placement of the zombies, the same fault is made afresh inside one VM lab host (its own
6.1 kernel, cgroup v2): N real zombie memory cgroups pinned by page cache (one page each), and a
"workload" service whose hot set of files (``--workload-mib``, read once through its own cgroup) sits in
the page cache. Then the module runs through ansible (the real module, ``min_zombies`` N/2: ``both``
drops the caches only when memory.reclaim left that many) and the bench reads back:

- zombies freed: the drop of ``nr_dying_descendants`` in the root ``cgroup.stat``;
- page cache freed: the drop of ``Cached`` in ``/proc/meminfo``;
- workload cache lost: pages of the workload's files no longer resident (``fincore``), the cost that
  every process on the host pays after a drop_caches as re-reads from disk;
- time: the module's ``reclaim_seconds`` (sync and the writes, not the settle time);

and prints each method's ratios against drop_caches measured in the same run.

Placements: ``apart``: the zombies under a cgroup of their own (a container runtime's parent, as the
crash-looping ECS agent's tasks are); ``beside``: directly under ``system.slice``, next to the workload
(systemd's own dying service cgroups are there). Needs root and QEMU (the lab boots one VM, about a
minute under TCG, and tears it down unless ``--keep``). Run it under the lab lock:

    flock /tmp/fleetops-lab.lock .venv/bin/python bench/reclaim_methods.py [--zombies 1000] [--workload-mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleetops_lab import Lab, host_faults

REPO = Path(__file__).resolve().parents[1]
HOST = "lab-01"
METHODS = ("drop_caches", "memory_reclaim", "both")
PLACEMENTS = {"apart": None, "beside": "system.slice"}
WORKLOAD = "bench-workload"
WORKLOAD_DIR = "/var/lib/bench-workload"

_WORKLOAD_UNIT = f"""[Unit]
Description=fleetops bench: a workload with a hot set of cached files

[Service]
ExecStartPre=/bin/sh -c 'cat {WORKLOAD_DIR}/* > /dev/null'
ExecStart=/bin/sleep infinity
"""


def _run(lab: Lab, cmd: str, timeout: float = 120) -> str:
    return lab.run(HOST, cmd, check=True, timeout=timeout).stdout


def _setup_workload(lab: Lab, mib: int) -> None:
    files = max(1, mib // 8)
    _run(
        lab,
        f"mkdir -p {WORKLOAD_DIR} && for i in $(seq 1 {files}); do "
        f"[ -s {WORKLOAD_DIR}/f$i ] || head -c {8 << 20} /dev/urandom > {WORKLOAD_DIR}/f$i; done; sync",
        timeout=300,
    )
    lab.run(HOST, f"cat > /etc/systemd/system/{WORKLOAD}.service && systemctl daemon-reload",
            input=_WORKLOAD_UNIT, check=True)  # fmt: skip


def _warm_workload(lab: Lab) -> None:
    """Read the hot set through the workload's own (live) cgroup, so its page cache is charged there.

    The caches are dropped first: pages still cached from an earlier read stay charged to whoever read
    them (an ssh session, the workload's previous cgroup) and a re-read would charge nothing.
    """
    _run(lab, f"systemctl stop {WORKLOAD}.service; sync; echo 1 > /proc/sys/vm/drop_caches; "
              f"systemctl start {WORKLOAD}.service", timeout=300)  # fmt: skip


def _measure(lab: Lab) -> dict[str, int]:
    out = _run(
        lab,
        "grep nr_dying_descendants /sys/fs/cgroup/cgroup.stat; grep '^Cached:' /proc/meminfo; "
        f"fincore -b -n -o RES {WORKLOAD_DIR}/* | awk '{{s += $1}} END {{print \"workload\", s}}'",
    )
    values = {}
    for line in out.splitlines():
        key, value = line.split()[:2]
        values[key.rstrip(":")] = int(value)
    return {
        "zombies": values["nr_dying_descendants"],
        "cached": values["Cached"] * 1024,
        "workload": values["workload"],
    }


def _reclaim(lab: Lab, method: str, min_zombies: int) -> dict[str, Any]:
    """The real module on the VM through ansible; its result as ansible's tree callback saved it."""
    with tempfile.TemporaryDirectory() as tree:
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
            "ANSIBLE_CALLBACK_TREE_DIR": tree,
        }
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "-i", str(lab.inventory_path()), HOST,
             "-m", "fleetops.node.reclaim_memcg", "-a", f"method={method} min_zombies={min_zombies} settle_seconds=10"],
            capture_output=True, text=True, timeout=300, env=env, check=False,
        )  # fmt: skip
        try:
            result: dict[str, Any] = json.loads((Path(tree) / HOST).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(
                f"reclaim_memcg {method} gave no result ({err}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            ) from err
    if proc.returncode != 0 or result.get("failed"):
        raise SystemExit(f"reclaim_memcg {method} failed: {result.get('msg')}")
    return result


def _one(lab: Lab, method: str, placement: str, zombies: int) -> dict[str, Any]:
    tag = f"bench-{placement}"
    _warm_workload(lab)
    host_faults.make_zombie_memcgs(lab, HOST, zombies, tag=tag, parent=PLACEMENTS[placement])
    before = _measure(lab)
    result = _reclaim(lab, method, zombies // 2)
    after = _measure(lab)
    host_faults.release_zombie_memcgs(lab, HOST, tag=tag)  # also drops caches: the next run starts even
    steps = [f"{s['method']}:{s['target']}:{s['result']}" for s in result["steps"]]
    return {
        "method": method,
        "placement": placement,
        "zombies_before": before["zombies"],
        "zombies_freed": before["zombies"] - after["zombies"],
        "cache_freed": before["cached"] - after["cached"],
        "workload_cached": before["workload"],
        "workload_lost": before["workload"] - after["workload"],
        "seconds": float(result["reclaim_seconds"]),
        "steps": steps,
    }


def _ratio(value: float, base: float) -> str:
    if base == 0:
        return "-" if value == 0 else "inf"
    return f"{value / base:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zombies", type=int, default=1000)
    parser.add_argument("--workload-mib", type=int, default=64)
    parser.add_argument("--placements", default="apart,beside")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    lab = Lab()
    started = time.monotonic()
    lab.up(1, vm=1, progress=lambda line: print(line, file=sys.stderr))
    print(f"VM lab host up in {time.monotonic() - started:.0f} s", file=sys.stderr)
    rows = []
    try:
        print(
            f"kernel {_run(lab, 'uname -r').strip()}, cgroup {_run(lab, 'stat -fc %T /sys/fs/cgroup').strip()}"
        )
        _setup_workload(lab, args.workload_mib)
        for placement in args.placements.split(","):
            for method in METHODS:
                rows.append(_one(lab, method, placement, args.zombies))
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        if not args.keep:
            lab.down()
    mib = 1 << 20
    print(f"{args.zombies} zombies, one page of page cache each; workload hot set {args.workload_mib} MiB")
    print(f"{'placement':9} {'method':15} {'zombies freed':>14} {'cache freed MiB':>16} "
          f"{'workload lost MiB':>18} {'seconds':>8}   ratios vs drop_caches (freed, cache, lost, time)")  # fmt: skip
    for row in rows:
        base = next(r for r in rows if r["placement"] == row["placement"] and r["method"] == "drop_caches")
        print(
            f"{row['placement']:9} {row['method']:15} {row['zombies_freed']:>6}/{row['zombies_before']:<7} "
            f"{row['cache_freed'] / mib:>16.1f} {row['workload_lost'] / mib:>9.1f}/{row['workload_cached'] / mib:<8.1f} "
            f"{row['seconds']:>8.3f}   {_ratio(row['zombies_freed'], base['zombies_freed'])}, "
            f"{_ratio(row['cache_freed'], base['cache_freed'])}, {_ratio(row['workload_lost'], base['workload_lost'])}, "
            f"{_ratio(row['seconds'], base['seconds'])}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
