"""The production batch runner and scanner the engine is given: ansible-runner and the scan."""

from __future__ import annotations

import math
import tempfile
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.ansible import batch_inventory
from fleetops.ansible.runner import PlaybookRun, RunnerOptions, TaskResult, run_playbook
from fleetops.rollout import guards
from fleetops.scan import ScanOptions, run_scan

HOST_TIMEOUT_VAR = "fleetops_host_timeout"
RUNNER_MARGIN_S = 120  # on top of the host timeout: ssh connects, the boot id reads, the probes
MAX_BATCH_FORKS = 50  # a batch's hosts run at once up to this many (each within its host timeout)


def runner_timeout(hosts: int, extravars: dict[str, Any]) -> int | None:
    """The whole batch run's limit: the host timeout (per round of at most MAX_BATCH_FORKS hosts)
    plus RUNNER_MARGIN_S; None when the rollout has no host timeout."""
    value = extravars.get(HOST_TIMEOUT_VAR)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    rounds = max(1, math.ceil(hosts / MAX_BATCH_FORKS))
    return value * rounds + RUNNER_MARGIN_S


@dataclass(frozen=True)
class PlaybookBatchRunner:
    """One batch = one ansible-runner invocation of ``playbook``, limited to exactly the batch's hosts
    (names ``guards.check_target_names`` accepted at plan time), all at once (forks), bounded in
    time (``runner_timeout``).

    ansible-playbook reads the batch's hosts only (``batch_inventory``: as the rollout's inventory lists
    them; the whole inventory where that could differ), not the whole inventory each batch: 8.5 CPU s a
    batch over 7,500 hosts (bench/rollout_batch.py). ``whole_inventory``: the playbook reads other hosts of
    the inventory than its batch's (``groups['all']``), so it always gets the whole inventory."""

    playbook: str
    inventory: Sequence[Path]
    whole_inventory: bool = False

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        with tempfile.TemporaryDirectory(prefix="fleetops-batch-") as folder:  # 0700
            own = None if self.whole_inventory else batch_inventory.write(self.inventory, hosts, Path(folder))
            return run_playbook(
                RunnerOptions(
                    playbook=self.playbook,
                    inventory=list(self.inventory),
                    limit=",".join(hosts),
                    extravars=extravars,
                    forks=min(max(len(hosts), 1), MAX_BATCH_FORKS),
                    check=check,
                    diff=True,
                    timeout=runner_timeout(len(hosts), extravars),
                    batch_inventory=own,
                ),
                on_result=on_result,
                cancel=cancel,
            )


NOT_IN_INVENTORY = "not in the inventory now (stopped or terminated, or left out by an inventory filter)"


@dataclass(frozen=True)
class InventoryScanner:
    """The gate's scan: one node_health call per host of ``hosts``, through the rollout's inventory.

    The hosts reach ansible as a limit: their names are checked against the inventory's ``groups``
    first (``guards.check_target_names``), as at plan time."""

    inventory: Sequence[Path]
    groups: Collection[str] = field(default_factory=frozenset)
    # The inventory's hosts when the rollout (re)started (None: not known). A host not among them is
    # "missing" without asking ansible: a limit naming only such hosts matches nothing, and
    # ansible-playbook fails the whole scan.
    present: Collection[str] | None = None

    def __call__(self, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
        guards.require_targets(hosts, "the gate's rescan")
        out: dict[str, dict[str, Any]] = {
            h: {"status": "missing", "msg": NOT_IN_INVENTORY, "findings": [], "facts": {}}
            for h in hosts
            if self.present is not None and h not in self.present
        }
        scan = [h for h in hosts if h not in out]
        if scan:
            guards.check_target_names(scan, self.groups)
            report = run_scan(ScanOptions(inventory=list(self.inventory), limit=",".join(scan)))
            out.update(report["hosts"])
        return out
