"""The exit codes of every fleetops command (one list, used by the CLI and the library's results), what
each means and what to do about it (``MEANINGS``). Which command uses which, in its own words, is
``fleetops.cli.exits``; both are the one declaration every ``--help`` and the docs' table are made from."""

from __future__ import annotations

import signal
from dataclasses import dataclass
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


# remediate auto --fail-on: what besides a failed pass makes it exit non-zero. never: hosts that wait for a
# person (a ladder at `human` or run out, a storm brake) leave the exit code 0 (a scheduled job stays green;
# the JSON, the audit log and the alerts name them); human: they make it FINDINGS (1), as every pass did before
AUTO_FAIL_ON = ("never", "human")
AUTO_FAIL_ON_DEFAULT = "never"


@dataclass(frozen=True)
class Meaning:
    """What an exit code says happened, and what a person does about it."""

    happened: str
    todo: str


MEANINGS: dict[ExitCode, Meaning] = {
    ExitCode.OK: Meaning(
        "clean (scan), done and verified (remediate), no host waits for a person unless --fail-on human "
        "(remediate auto)",
        "nothing",
    ),
    ExitCode.FINDINGS: Meaning(
        "findings at or above --fail-on (scan, merge; with --fail-on partial also a host a check could not "
        "fully look at), drift (drift), hosts that wait for a person with --fail-on human (remediate auto)",
        "read the report: each finding names its check, what was seen and the next step; fix one thing as "
        "in Fixing one thing safely; a host that waits for a person is named in the pass's JSON and by the "
        "FleetopsAutoHumanNeeded alert",
    ),
    ExitCode.USAGE: Meaning(
        "bad command line, configuration or input file; nothing was run and no host was contacted",
        "read the one line on stderr: it names the option, file or field and what is wrong "
        "(`fleetops COMMAND --help`)",
    ),
    ExitCode.FAILED: Meaning(
        "a host unreachable or failed, a detector that could not run, a rollout that stopped (breaker, kill "
        "switch, deadline, capacity floor), a pass whose action failed or whose store failed",
        "the report names the hosts and why; a stopped rollout prints its `fleetops remediate --resume STATE` "
        "command; `fleetops report ROLLOUT` (its id or its state file) says what it did",
    ),
    ExitCode.LOCKED: Meaning(
        "hosts locked by another rollout or pass (the lock file, the EC2 lease or the shared store's lease)",
        "wait for it, or find it: `fleetops rollouts` lists this controller's (a holder whose process is gone "
        "shows as running (no process)), `fleetops report ROLLOUT` says what it did; resume a dead one with "
        "`fleetops remediate --resume STATE --break-lock`",
    ),
    ExitCode.PAUSED: Meaning(
        "automation paused (`fleetops pause`): nothing acted",
        "`fleetops unpause` when the reason has passed (The ladder left running)",
    ),
    ExitCode.HANGUP: Meaning(
        "stopped by SIGHUP; a rollout saved its state and released its locks",
        "`fleetops remediate --resume STATE` continues it",
    ),
    ExitCode.INTERRUPTED: Meaning(
        "stopped by Ctrl-C (SIGINT); a rollout saved its state and released its locks, a scan kept what "
        "arrived",
        "`fleetops remediate --resume STATE` continues a rollout; run a scan again",
    ),
    ExitCode.TERMINATED: Meaning(
        "stopped by SIGTERM; a rollout saved its state and released its locks",
        "`fleetops remediate --resume STATE` continues it",
    ),
}


def signal_exit_code(signum: int | None) -> ExitCode:
    """The exit code of a command a signal stopped: TERMINATED (SIGTERM), HANGUP (SIGHUP), else
    INTERRUPTED (SIGINT, or no signal recorded: a Ctrl-C that let the batch finish)."""
    if signum == signal.SIGTERM:
        return ExitCode.TERMINATED
    if signum == signal.SIGHUP:
        return ExitCode.HANGUP
    return ExitCode.INTERRUPTED
