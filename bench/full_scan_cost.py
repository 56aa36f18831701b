"""Cost of the full scan (every detector) against the foundation's zombie-only scan, per host.

Issue 8's target: all detectors on, the scan still costs ONE fleetops.node.node_health call per
host. For lab hosts (systemd-nspawn guests reached over ssh, design §7) this runs the scan
playbook alternately with ``checks: [zombie_memcg]`` (the foundation's scan) and with every
detector, ``--rounds`` times each, and prints per host:

- the module calls each host received (counted from ansible-runner's events; must be 1),
- the module's own run time on the host (``duration_ms``, median over hosts and rounds),
- the wall time of the whole scan divided by the hosts,
- the result's size (what travels back over ssh and into AWX's job events),

and the ratios full / zombie-only. ``--local`` scans this machine (local connection) instead of
lab hosts. Needs root for the lab; run it under the dev lock:

    flock /run/fleetops-dev.lock python bench/full_scan_cost.py [--hosts 4] [--rounds 3] [--local]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetops.ansible.facts import SCAN_ACTIONS  # noqa: E402
from fleetops.ansible.runner import RunnerOptions, run_playbook  # noqa: E402
from fleetops.scan import SCAN_PLAYBOOK, ScanOptions  # noqa: E402
from fleetops_lab import Lab  # noqa: E402

ZOMBIE_ONLY = ["zombie_memcg"]


def scan_once(inventory: Path, checks: Sequence[str] | None) -> dict[str, Any]:
    """One scan playbook run: per-host module calls, module ms, result bytes; the run's wall time."""
    opts = ScanOptions(inventory=[inventory], checks=list(checks) if checks else None)
    started = time.perf_counter()
    run = run_playbook(
        RunnerOptions(
            playbook=SCAN_PLAYBOOK,
            inventory=opts.inventory,
            extravars=opts.playbook_vars(),
            forks=opts.runner_forks(),
        )
    )
    wall = time.perf_counter() - started
    hosts: dict[str, dict[str, Any]] = {}
    for host in run.hosts():
        calls = [r for r in run.results_for(host) if r.action in SCAN_ACTIONS]
        ok = [r for r in calls if r.status == "ok"]
        if not ok:
            raise SystemExit(f"error: {host} gave no node_health result ({[r.status for r in calls]})")
        result = ok[-1].result
        if result.get("errors"):
            raise SystemExit(f"error: detector errors on {host}: {result['errors']}")
        hosts[host] = {
            "calls": len(calls),
            "duration_ms": float(result["duration_ms"]),
            "bytes": len(json.dumps(result)),
            "checks": len(result["checks"]),
        }
    return {"wall_s": wall, "hosts": hosts}


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    per_host = [h for run in runs for h in run["hosts"].values()]
    n_hosts = len(runs[0]["hosts"])
    return {
        "calls_per_host": max(h["calls"] for h in per_host),
        "checks": per_host[0]["checks"],
        "module_ms": statistics.median(h["duration_ms"] for h in per_host),
        "wall_per_host_s": statistics.median(run["wall_s"] for run in runs) / n_hosts,
        "bytes": statistics.median(h["bytes"] for h in per_host),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=4, help="lab hosts (default: 4)")
    parser.add_argument("--rounds", type=int, default=3, help="scans of each kind, alternating (default: 3)")
    parser.add_argument("--local", action="store_true", help="scan this machine instead of lab hosts")
    args = parser.parse_args(argv)

    lab = None if args.local else Lab()
    try:
        if lab is None:
            inventory = REPO / "inventory" / "localhost.yml"
        else:
            lab.up(args.hosts, progress=print)
            inventory = lab.inventory_path()
        scan_once(inventory, None)  # warm-up: ssh masters, module cache, page cache
        zombie: list[dict[str, Any]] = []
        full: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            zombie.append(scan_once(inventory, ZOMBIE_ONLY))
            full.append(scan_once(inventory, None))
    finally:
        if lab is not None:
            lab.down()

    z, f = summarize(zombie), summarize(full)
    where = "this machine (local connection)" if args.local else f"{args.hosts} lab hosts over ssh"
    print(f"full scan vs zombie-only scan, {where}, {args.rounds} rounds each (medians)")
    print(
        f"{'':<14}{'detectors':>10}{'calls/host':>12}{'module ms':>11}{'wall s/host':>13}{'result KiB':>12}"
    )
    for label, s in (("zombie-only", z), ("full", f)):
        print(
            f"{label:<14}{s['checks']:>10.0f}{s['calls_per_host']:>12.0f}{s['module_ms']:>11.1f}"
            f"{s['wall_per_host_s']:>13.3f}{s['bytes'] / 1024:>12.1f}"
        )
    print(
        f"ratio full/zombie-only: module time {f['module_ms'] / z['module_ms']:.2f}x, "
        f"wall time per host {f['wall_per_host_s'] / z['wall_per_host_s']:.2f}x, "
        f"result size {f['bytes'] / z['bytes']:.1f}x; module calls per host: {f['calls_per_host']:.0f} "
        f"(target 1)"
    )
    return 0 if f["calls_per_host"] == 1 and z["calls_per_host"] == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
