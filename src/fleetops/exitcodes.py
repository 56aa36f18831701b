"""The exit codes of every fleetops command (one list, used by the CLI and the library's results)."""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # clean / done
    FINDINGS = 1  # warning or critical findings (scan), drift found (drift)
    USAGE = 2  # bad command line, configuration or input file
    FAILED = 3  # a host unreachable or failed, a detector could not run, the rollout stopped
    LOCKED = 4  # hosts locked (lock file, EC2 lease or the shared store's lease) by another rollout or pass
    PAUSED = 5  # automation paused (fleetops pause): nothing acted
    HANGUP = 129  # SIGHUP: a rollout aborted at once (state saved, lock released)
    INTERRUPTED = 130  # Ctrl-C / SIGINT
    TERMINATED = 143  # SIGTERM: a rollout aborted at once (state saved, lock released)


def signal_exit_code(signum: int | None) -> ExitCode:
    """The exit code of a command a signal stopped: TERMINATED (SIGTERM), HANGUP (SIGHUP), else
    INTERRUPTED (SIGINT, or no signal recorded: a Ctrl-C that let the batch finish)."""
    if signum == signal.SIGTERM:
        return ExitCode.TERMINATED
    if signum == signal.SIGHUP:
        return ExitCode.HANGUP
    return ExitCode.INTERRUPTED
