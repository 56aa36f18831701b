"""The one error wrapper of every command line entry point (fleetops, fleetops-lab, the demo)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from fleetops.errors import FleetopsError, Signalled
from fleetops.exitcodes import ExitCode


def run_main(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn``; a FleetopsError becomes ``PROG: error: MESSAGE`` on stderr and its exit code,
    Ctrl-C ``PROG: interrupted`` and 130, a
    ``Signalled`` its own code (143 SIGTERM, 129 SIGHUP). Anything else is a bug: its traceback stays."""
    try:
        return int(fn())
    except FleetopsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except Signalled as exc:
        print(f"{prog}: terminated ({signal.Signals(exc.signum).name}); the state is saved", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
