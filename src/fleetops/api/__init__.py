"""The library API: what the CLI, the demo, AWX-side code and tests call.

Typed requests in, typed results out; nothing here parses a command line or renders anything.
Progress goes to callbacks (``on_host`` for scans) or a ``RolloutObserver`` (rollouts); errors are
``FleetopsError`` subclasses whose ``exit_code`` is an ``ExitCode``.

- ``scan(ScanRequest) -> ScanResult``: one node_health call per host, the ``fleetops.scan/v1`` report.
- ``merge(MergeRequest) -> MergeResult``: shard reports (``scan --shard I/N``) as one scan's report.
- ``plan(PlanRequest) -> PlanResult``: the batches a rollout would run (``fleetops.plan/v1``).
- ``remediate(RemediationRequest) -> RolloutResult``: a remediation, batch by batch.
- ``resume(ResumeRequest) -> RolloutResult``: continue a saved rollout.
- ``report(path) -> RolloutResult``: a saved rollout's report (``fleetops.rollout.engine/v1``).
- ``auto(AutoRequest) -> AutoResult``: one ``remediate auto`` pass of a policy (``fleetops.auto/v1``).
- ``stop(StopRolloutRequest) -> StopRolloutResult``: the kill switch.
- ``drift(DriftRequest) -> DriftResult``: the facts that differ between hosts (``fleetops.drift/v1``).

This module names them; they live where they are made: the verbs that only read the fleet (scan, merge, drift)
in ``fleetops.api.scanning`` with their requests (``fleetops.api.scan_types``), imported with this module; the
rollout verbs in ``fleetops.api.verbs``, their requests in ``fleetops.api.requests``, the kill switch, the
pause and the store in ``fleetops.api.controls``: each imported when one of its names is first asked for
(PEP 562), so that a scan does not wait for the planner, the engine, the lease and the remediations.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fleetops.api.scan_types import (
    DriftRequest,
    DriftResult,
    MergeRequest,
    MergeResult,
    ScanRequest,
    ScanResult,
)
from fleetops.api.scanning import OnHost as OnHost
from fleetops.api.scanning import OnTargets as OnTargets
from fleetops.api.scanning import default_inventories, drift, merge, scan, scan_metrics
from fleetops.exitcodes import ExitCode

if TYPE_CHECKING:
    from fleetops.api.controls import lift_brake, stop, store
    from fleetops.api.launch import start as _start  # noqa: F401  (tests plan a rollout without running it)
    from fleetops.api.requests import (
        ROLLOUT_SCHEMA,
        AutoRequest,
        AutoResult,
        LiftBrakeRequest,
        PlanRequest,
        PlanResult,
        RemediationRequest,
        ResumeRequest,
        RolloutCaps,
        RolloutLimits,
        RolloutResult,
        StopRolloutRequest,
        StopRolloutResult,
        StoreRequest,
        StoreResult,
        needs_reboot,
        plan_document,
        report_document,
        rollout_exit_code,
    )
    from fleetops.api.requests import (
        empty_document as empty_document,
    )
    from fleetops.api.requests import (
        is_empty_document as is_empty_document,
    )
    from fleetops.api.requests import (
        rollout_options as rollout_options,
    )
    from fleetops.api.requests import (
        rollout_result as rollout_result,
    )
    from fleetops.api.signals import STOP_MESSAGE
    from fleetops.api.verbs import (
        _ctrl_c as _ctrl_c,
    )
    from fleetops.api.verbs import (
        _leave_out_gone as _leave_out_gone,
    )
    from fleetops.api.verbs import (
        _PassSignals as _PassSignals,
    )
    from fleetops.api.verbs import (
        _plan_hosts as _plan_hosts,
    )
    from fleetops.api.verbs import (
        auto,
        plan,
        remediate,
        report,
        resume,
    )
    from fleetops.planner import MaxParallel
    from fleetops.remediations import REMEDIATIONS
    from fleetops.rollout.budget import FailureBudget
    from fleetops.rollout.engine import NullObserver, RolloutObserver

# Each name the rollout verbs bring, and the module it is imported from when first asked for.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("lift_brake", "stop", "store"), "fleetops.api.controls"),
    **dict.fromkeys(
        (
            "ROLLOUT_SCHEMA",
            "AutoRequest",
            "AutoResult",
            "LiftBrakeRequest",
            "PlanRequest",
            "PlanResult",
            "RemediationRequest",
            "ResumeRequest",
            "RolloutCaps",
            "RolloutLimits",
            "RolloutResult",
            "StopRolloutRequest",
            "StopRolloutResult",
            "StoreRequest",
            "StoreResult",
            "empty_document",
            "is_empty_document",
            "needs_reboot",
            "plan_document",
            "report_document",
            "rollout_exit_code",
            "rollout_options",
            "rollout_result",
        ),
        "fleetops.api.requests",
    ),
    "STOP_MESSAGE": "fleetops.api.signals",
    **dict.fromkeys(
        (
            "auto",
            "plan",
            "remediate",
            "report",
            "resume",
            "_PassSignals",
            "_ctrl_c",
            "_leave_out_gone",
            "_plan_hosts",
            "_start",
        ),
        "fleetops.api.verbs",
    ),
    "MaxParallel": "fleetops.planner",
    "REMEDIATIONS": "fleetops.remediations",
    "FailureBudget": "fleetops.rollout.budget",
    "NullObserver": "fleetops.rollout.engine",
    "RolloutObserver": "fleetops.rollout.engine",
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, imported now and kept (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "REMEDIATIONS",
    "ROLLOUT_SCHEMA",
    "STOP_MESSAGE",
    "AutoRequest",
    "AutoResult",
    "DriftRequest",
    "DriftResult",
    "ExitCode",
    "FailureBudget",
    "LiftBrakeRequest",
    "MaxParallel",
    "MergeRequest",
    "MergeResult",
    "NullObserver",
    "PlanRequest",
    "PlanResult",
    "RemediationRequest",
    "ResumeRequest",
    "RolloutCaps",
    "RolloutLimits",
    "RolloutObserver",
    "RolloutResult",
    "ScanRequest",
    "ScanResult",
    "StopRolloutRequest",
    "StopRolloutResult",
    "StoreRequest",
    "StoreResult",
    "auto",
    "default_inventories",
    "drift",
    "lift_brake",
    "merge",
    "needs_reboot",
    "plan",
    "plan_document",
    "remediate",
    "report",
    "report_document",
    "resume",
    "rollout_exit_code",
    "scan",
    "scan_metrics",
    "stop",
    "store",
]
