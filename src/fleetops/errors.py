"""Errors the CLI turns into one clear line and an exit code (only the CLI formats them)."""

from __future__ import annotations


class FleetopsError(Exception):
    """A user-facing error: bad input, missing file, a lab or runner failure."""

    exit_code: int = 2


class UsageError(FleetopsError):
    """Bad command line, configuration or input file: exit 2."""

    exit_code = 2
