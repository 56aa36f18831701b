"""What a scan adds to its report beyond the hosts' results: the policy it reads once, each finding's next step
(``fleetops.next_steps``) and the fleet record it writes (``fleetops.auto.seen``), each set up before any host
is contacted (a bad policy or store: exit 2)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetops.api.scan_types import ScanRequest, auto_state_dir


def scan_policy(request: ScanRequest) -> Any:
    """The scan's policy (``--policy``, else the one fleetops ships), loaded; DocumentError: exit 2."""
    from fleetops.policy import default_policy_path, load_policy

    return load_policy(request.policy if request.policy is not None else default_policy_path())


def next_steps(request: ScanRequest, policy: Any) -> Any:
    """The scan's next steps (fleetops.next_steps.ScanSteps): a given policy checked now (exit 2);
    ``policy``: the scan's policy already loaded (None: loaded when a finding first needs it)."""
    from fleetops.next_steps import ScanSteps

    inventory = [str(p) for p in request.inventory]
    return ScanSteps(request.policy, auto_state_dir(request.state_dir), inventory, time.time(), loaded=policy)


def scan_recorder(
    request: ScanRequest, policy: Callable[[], Any] | None, shared: Any
) -> Callable[[Mapping[str, Any], Sequence[Any]], tuple[str, list[str]]] | None:
    """What writes a scan's fleet record (``fleetops.auto.seen.record_scan``) naming the rules of the scan's
    policy (``policy()`` gives it, loaded once; None: the scan records nothing, ``fleet_record`` off or this
    machine alone) to ``shared`` (the inventory's store, opened by the caller before any host is contacted;
    None: the state directory). It gives where it wrote and what it could not write."""
    if policy is None:
        return None
    state_dir = auto_state_dir(request.state_dir)

    def record(report_: Mapping[str, Any], hosts: Sequence[Any]) -> tuple[str, list[str]]:
        from fleetops.auto import seen  # the auto pass's package, and the store: once the hosts have answered
        from fleetops.store import StoreFailure

        warnings: list[str] = []
        group_of = {h.name: h.group for h in hosts}
        try:
            where = seen.record_scan(
                report_,
                policy(),
                request.checks,
                store=shared,
                state_dir=state_dir,
                group_of=group_of.get,
                now=time.time(),
                warn=warnings.append,
            )
        except (StoreFailure, OSError) as exc:
            return "", [f"the fleet record was not written: {exc}"]
        return where, warnings

    return record
