"""Errors the CLI turns into one clear line and an exit code (only the CLI formats them)."""

from __future__ import annotations

from fleetops.exitcodes import signal_exit_code


class FleetopsError(Exception):
    """A user-facing error: bad input, missing file, a lab or runner failure."""

    exit_code: int = 2


class UsageError(FleetopsError):
    """Bad command line, configuration or input file: exit 2."""

    exit_code = 2


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP outside a rollout's own handler (e.g. between the actions of a
    ``remediate auto`` pass): unwinds like Ctrl-C, so ``finally`` blocks save state, and ends
    the command with ``exit_code`` (143 / 129)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return int(signal_exit_code(self.signum))
