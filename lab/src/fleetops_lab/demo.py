"""`make demo`: a local lab fleet with real faults injected, scanned and (as remediations land) fixed.

Runs as root. Every step is real: real zombie memory cgroups on this kernel (cgroup v1 or v2: the
injector finds where the memory controller is mounted, fleetops_lab.faults.memory_hierarchy), real
systemd-nspawn hosts scanned over ssh through ansible-runner.
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

from fleetops import api
from fleetops.cli.errors import run_main
from fleetops.cli.observer import ConsoleObserver
from fleetops.cli.remediate import print_summary
from fleetops.cli.render import render_drift, render_scan
from fleetops.errors import FleetopsError
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
stderr = Console(stderr=True, highlight=False, soft_wrap=True)
ZOMBIES = 1500
LAB_HOSTS = 3


def _scan(title: str, request: api.ScanRequest) -> dict[str, Any]:
    console.print(Rule(title))
    started = time.monotonic()
    result = api.scan(request)
    render_scan(result.report, console)
    console.print(
        f"[dim]scan took {time.monotonic() - started:.1f}s; exit code would be {int(result.exit_code)}[/]"
    )
    return result.report


def _localhost() -> list[Path]:
    return api.default_inventories()


def _remediate(request: api.RemediationRequest) -> int:
    """A remediation through the library, shown as `fleetops remediate` shows it."""
    result = api.remediate(request, ConsoleObserver(stderr))
    if result.rollout is not None:
        print_summary(result.rollout, console)
    return int(result.exit_code)


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
        api.ScanRequest(inventory=[inventory]),
    )
    console.print(
        Rule(
            "14. fleetops remediate set-env --env UCX_MEM_MMAP_HOOK_MODE=none --restart --apply: drop-in, restart"
        )
    )
    rc = _remediate(
        api.RemediationRequest(
            action="set-env",
            params={"unit": "ucx-worker", "env": {"UCX_MEM_MMAP_HOOK_MODE": "none"}, "restart": True},
            inventory=[inventory],
            limit=",".join(hosts),
            max_parallel=1,
            apply=True,
        )
    )
    console.print(f"[dim]remediate exit code {rc}[/]")
    _scan("15. rescan: no UCX process runs with the leaking setup", api.ScanRequest(inventory=[inventory]))
    console.print(
        Rule("16. fleetops drift: the hosts are meant to be identical; what differs now, and on which host")
    )
    drift = api.drift(api.DriftRequest(inventory=[inventory]))
    render_drift(drift.document, Console(highlight=False, soft_wrap=True))
    console.print(f"[dim]drift exit code {int(drift.exit_code)} (1: drift found)[/]")


def run_demo() -> int:
    if os.geteuid() != 0:
        raise FleetopsError("make demo needs root: it creates memory cgroups and boots lab hosts")
    before = _scan("1. this machine, as it is", api.ScanRequest())
    console.print(Rule(f"2. inject {ZOMBIES:,} real zombie memory cgroups (mkdir, charge page cache, rmdir)"))
    with create_zombie_memcgs(ZOMBIES) as batch:
        console.print(
            f"created {batch.count:,} dying memory cgroups under {batch.cgroup}, pinned by their page cache"
        )
        during = _scan("3. scan finds them", api.ScanRequest())
        console.print(
            f"zombies: {_zombies(before, 'localhost')} -> {_zombies(during, 'localhost')} "
            f"(expected about {ZOMBIES:,} more)"
        )
    console.print(Rule("4. release: delete the files that pin them, so the kernel can free them"))
    time.sleep(2)
    _scan("5. rescan after the release", api.ScanRequest())

    lab = Lab()
    console.print(Rule(f"6. boot a lab fleet of {LAB_HOSTS} systemd-nspawn hosts"))
    try:
        lab.up(LAB_HOSTS, progress=lambda line: console.print(f"[dim]{line}[/]"))
        inventory = lab.inventory_path()
        _scan(
            "7. scan the lab fleet and this machine over ssh (lab hosts see a cgroup namespace)",
            api.ScanRequest(inventory=[inventory, *_localhost()]),
        )
        console.print(
            Rule("8. the Pinterest incident: the image enabled ecs.service on lab-01; it crash loops")
        )
        unit = install_crashloop_unit(lab, "lab-01", restart_sec=0.5)
        console.print(f"installed and enabled {unit} (Restart=always; every start leaves a zombie memcg)")
        time.sleep(8)
        _scan(
            "9. scan with two samples 10 s apart: the loop, its rate, the memcgs piling up, the culprit",
            api.ScanRequest(inventory=[inventory], sample_seconds=10),
        )
        console.print(Rule("10. fleetops remediate fix --apply: turn the culprit off for good, then reclaim"))
        rc = _remediate(
            api.RemediationRequest(
                action="fix", params={"sample_seconds": 5}, inventory=[inventory], apply=True
            )
        )
        console.print(f"[dim]remediate exit code {rc}[/]")
        _scan("11. rescan: no crash loop left", api.ScanRequest(inventory=[inventory], sample_seconds=5))
        _ucx_incident(lab, inventory)
    finally:
        console.print(Rule("17. tear the lab down"))
        lab.down()
    console.print("[bold green]demo complete[/]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("fleetops demo", run_demo)


if __name__ == "__main__":
    sys.exit(main())
