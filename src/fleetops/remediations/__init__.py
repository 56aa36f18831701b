"""The remediations a rollout can run, each declared once (``catalog.py``, with the types of
``declare.py`` and the gates and steps of ``behaviour.py``): its playbook, its parameters and the extra
vars they become, what its gate checks, how a resume probes a host, its place in the auto pass's order.

The library's registry: the CLI adds one argparse sub-command per entry (``fleetops.cli.remediate``)
and passes the parsed options as ``params``; the API, the demo and AWX-side code pass ``params``
directly (``fleetops.api.RemediationRequest``); the policy's actions are ``ladder_order()``.
"""

from __future__ import annotations

from fleetops.remediations import catalog as _catalog  # noqa: F401  (registers fleetops' own)
from fleetops.remediations.declare import (
    DEFAULT_HOST_TIMEOUT_S,
    MAX_HOST_TIMEOUT_S,
    REMEDIATIONS,
    REQUIRED,
    Fixes,
    Param,
    Prepare,
    Remediation,
    Say,
    check_host_timeout,
    get,
    host_waits,
    ladder_order,
    register,
)

__all__ = [
    "DEFAULT_HOST_TIMEOUT_S",
    "MAX_HOST_TIMEOUT_S",
    "REMEDIATIONS",
    "REQUIRED",
    "Fixes",
    "Param",
    "Prepare",
    "Remediation",
    "Say",
    "check_host_timeout",
    "get",
    "host_waits",
    "ladder_order",
    "register",
]
