"""`make demo`: a local lab fleet with real faults injected, scanned and (as remediations land) fixed.

Runs as root on a machine with cgroup v1 memory. Every step is real: real zombie memory cgroups on
this kernel, real systemd-nspawn hosts scanned over ssh through ansible-runner.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.rule import Rule

from fleetops import paths
from fleetops.cli import main as cli_main
from fleetops.cli.render import render_scan
from fleetops.errors import FleetopsError
from fleetops.scan import ScanOptions, exit_code, run_scan
from fleetops_lab import Lab
from fleetops_lab.faults import create_zombie_memcgs
from fleetops_lab.host_faults import (
    UCX_UNFIXED_VERSION,
    UCX_WHEEL_VERSION,
    install_crashloop_unit,
    install_worker_service,
    worker_pid,
)

console = Console(highlight=False)
ZOMBIES = 1500
LAB_HOSTS = 3


def _scan(title: str, opts: ScanOptions) -> dict[str, Any]:
    console.print(Rule(title))
    started = time.monotonic()
    report = run_scan(opts)
    render_scan(report, console)
    console.print(
        f"[dim]scan took {time.monotonic() - started:.1f}s; exit code would be {exit_code(report)}[/]"
    )
    return report


def _localhost() -> list[Path]:
    inv = paths.default_inventory()
    return [inv] if inv is not None else []


def _zombies(report: dict[str, Any], host: str) -> Any:
    return report["hosts"][host]["facts"].get("memcg", {}).get("zombies")


def _ucx_incident(lab: Lab, inventory: Path) -> None:
    """Steps 12-16: the Mistral incident, found, fixed with set-env, rescanned clean; then the drift report."""
    console.print(
        Rule(
            "12. the Mistral incident: vLLM-like services run the real UCX (libucx-cu12 from PyPI) with its defaults"
        )
    )
    hosts = {"lab-02": UCX_UNFIXED_VERSION, "lab-03": UCX_WHEEL_VERSION}
    for host, version in hosts.items():
        unit = install_worker_service(lab, host, ucx_version=version)
        console.print(
            f"{host}: {unit} runs UCX {version}, pid {worker_pid(lab, host)}: a UCP context with mmap hooks on "
            "(UCX_MEM_MMAP_HOOK_MODE=bistro) and an unbounded registration cache (UCX_RCACHE_MAX_UNRELEASED=inf)"
        )
    _scan(
        "13. scan: the leaking setup is a warning on UCX 1.19, only info on 1.22 (fixed upstream in 1.21)",
        ScanOptions(inventory=[inventory]),
    )
    console.print(
        Rule(
            "14. fleetops remediate set-env --env UCX_MEM_MMAP_HOOK_MODE=none --restart --apply: drop-in, restart"
        )
    )
    rc = cli_main(
        ["remediate", "set-env", "--unit", "ucx-worker", "--env", "UCX_MEM_MMAP_HOOK_MODE=none", "--restart",
         "-i", str(inventory), "--limit", ",".join(hosts), "--max-parallel", "1", "--apply"]
    )  # fmt: skip
    console.print(f"[dim]remediate exit code {rc}[/]")
    _scan("15. rescan: no UCX process runs with the leaking setup", ScanOptions(inventory=[inventory]))
    console.print(
        Rule("16. fleetops drift: the hosts are meant to be identical; what differs now, and on which host")
    )
    rc = cli_main(["drift", "-q", "-i", str(inventory)])
    console.print(f"[dim]drift exit code {rc} (1: drift found)[/]")


def run_demo() -> int:
    if os.geteuid() != 0:
        raise FleetopsError("make demo needs root: it creates memory cgroups and boots lab hosts")
    before = _scan("1. this machine, as it is", ScanOptions())
    console.print(Rule(f"2. inject {ZOMBIES:,} real zombie memory cgroups (mkdir, charge page cache, rmdir)"))
    with create_zombie_memcgs(ZOMBIES) as batch:
        console.print(f"created {batch.count:,} dying memory cgroups, pinned by their page cache")
        during = _scan("3. scan finds them", ScanOptions())
        console.print(
            f"zombies: {_zombies(before, 'localhost')} -> {_zombies(during, 'localhost')} "
            f"(expected about {ZOMBIES:,} more)"
        )
    console.print(Rule("4. release: delete the files that pin them, so the kernel can free them"))
    time.sleep(2)
    _scan("5. rescan after the release", ScanOptions())

    lab = Lab()
    console.print(Rule(f"6. boot a lab fleet of {LAB_HOSTS} systemd-nspawn hosts"))
    try:
        lab.up(LAB_HOSTS, progress=lambda line: console.print(f"[dim]{line}[/]"))
        inventory = lab.inventory_path()
        _scan(
            "7. scan the lab fleet and this machine over ssh (lab hosts see a cgroup namespace)",
            ScanOptions(inventory=[inventory, *_localhost()]),
        )
        console.print(
            Rule("8. the Pinterest incident: the image enabled ecs.service on lab-01; it crash loops")
        )
        unit = install_crashloop_unit(lab, "lab-01", restart_sec=0.5)
        console.print(f"installed and enabled {unit} (Restart=always; every start leaves a zombie memcg)")
        time.sleep(8)
        _scan(
            "9. scan with two samples 10 s apart: the loop, its rate, the memcgs piling up, the culprit",
            ScanOptions(inventory=[inventory], sample_seconds=10),
        )
        console.print(Rule("10. fleetops remediate fix --apply: turn the culprit off for good, then reclaim"))
        rc = cli_main(["remediate", "fix", "-i", str(inventory), "--sample-seconds", "5", "--apply"])
        console.print(f"[dim]remediate exit code {rc}[/]")
        _scan("11. rescan: no crash loop left", ScanOptions(inventory=[inventory], sample_seconds=5))
        _ucx_incident(lab, inventory)
    finally:
        console.print(Rule("17. tear the lab down"))
        lab.down()
    console.print("[bold green]demo complete[/]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_demo()
    except FleetopsError as exc:
        print(f"fleetops demo: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
