"""The lab's one error type (the CLI prints it as one line)."""

from __future__ import annotations

from fleetops.errors import FleetopsError


class LabError(FleetopsError):
    """A lab operation failed or was refused: "Failed to <verb> <object>: <cause>"."""
