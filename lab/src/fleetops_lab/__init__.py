"""The test-host lab: real systemd hosts on this machine (systemd-nspawn), reachable over ssh.

``Lab().up(3)`` boots lab-01 .. lab-03 and returns them, ``Lab().run("lab-01", "uptime")`` runs a
command on one over ssh, ``Lab().down()`` removes everything. See ``fleetops_lab.core``.

The names are imported on first use, so the per-host supervisor (``python -m
fleetops_lab.supervisor``, one resident process per host) does not load the controller's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetops_lab.core import Lab, LabHost
    from fleetops_lab.errors import LabError

__all__ = ["Lab", "LabError", "LabHost"]


def __getattr__(name: str) -> Any:
    if name in ("Lab", "LabHost"):
        from fleetops_lab import core

        return getattr(core, name)
    if name == "LabError":
        from fleetops_lab.errors import LabError

        return LabError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
