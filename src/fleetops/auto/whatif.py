"""``remediate auto --from scan.json``: what a pass would decide against a saved scan report, and do
nothing (a what-if).

The decision is the pass's own (:meth:`fleetops.auto.passes._Pass.decide_and_act` with ``act``
off): the policy's rules, each host's ladder and the budgets spent as this controller's state
directory records them (read, never locked or written; none yet: every ladder at its first rung),
the storm brakes and the capacity floors. No host is contacted (no scan, no ansible run, no EC2 tag
read), no shared store is opened, nothing is recorded. The scan report names no groups: every host
is of one group (per-group budgets and floors count the whole report). Every decision that would
act is marked ``what_if`` in the document, and the document says ``what_if: {from: FILE}``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetops.auto.context import PassInputs
from fleetops.auto.passes import _Pass
from fleetops.auto.result import ActionRun, PassResult, Say
from fleetops.auto.state import BRAKES_FILE, LADDER_FILE, LEDGER_FILE, load_brakes, load_state
from fleetops.errors import UsageError
from fleetops.policy import Policy


def _no_action(action: str, hosts: Sequence[str], params: Mapping[str, Any]) -> ActionRun:
    raise UsageError(
        f"a what-if runs nothing: {action} on {' '.join(hosts)} was asked for"
    )  # pragma: no cover


def what_if(
    policy: Policy,
    policy_source: str,
    scan_report: Mapping[str, Any],
    source: str,
    state_dir: Path,
    say: Say,
    clock: Callable[[], float] = time.time,
) -> PassResult:
    """The pass's decisions for ``scan_report`` (read from ``source``), acting on nothing."""
    hosts = sorted(scan_report.get("hosts") or {})
    inputs = PassInputs(
        policy=policy,
        policy_source=policy_source,
        scan_report=scan_report,
        group_of=dict.fromkeys(hosts),
        state_dir=state_dir,
        apply=False,
    )
    result = PassResult([], [], False, policy_source, what_if=source)
    ctx = _Pass(inputs, result, _no_action, say, clock, contextlib.nullcontext)
    ladder, ledger = load_state(state_dir / LADDER_FILE, state_dir / LEDGER_FILE)
    ctx.brakes = load_brakes(state_dir / BRAKES_FILE)
    ctx.decide_and_act(ladder, ledger, clock(), set(), act=False)
    return result
