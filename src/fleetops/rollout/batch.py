"""The production batch runner and scanner the engine is given: ansible-runner and the scan."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook
from fleetops.scan import ScanOptions, run_scan


@dataclass(frozen=True)
class PlaybookBatchRunner:
    """One batch = one ansible-runner invocation of ``playbook``, limited to exactly the batch's hosts."""

    playbook: str
    inventory: Sequence[Path]

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        return run_playbook(
            RunnerOptions(
                playbook=self.playbook,
                inventory=list(self.inventory),
                limit=",".join(hosts),
                extravars=extravars,
                check=check,
                diff=True,
            ),
            on_result=on_result,
            cancel=cancel,
        )


@dataclass(frozen=True)
class InventoryScanner:
    """The gate's scan: one node_health call per host of ``hosts``, through the rollout's inventory."""

    inventory: Sequence[Path]

    def __call__(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        report = run_scan(ScanOptions(inventory=list(self.inventory), limit=",".join(hosts)))
        hosts_out: dict[str, dict[str, Any]] = report["hosts"]
        return hosts_out
