"""One lab host's supervisor: runs systemd-nspawn, and runs it again when the guest reboots.

A guest reboot makes systemd-nspawn exit with 133; anything else (a poweroff, SIGTERM from
``fleetops-lab down``, a crash) ends the supervisor. Started detached by the lab controller::

    python -m fleetops_lab.supervisor --machine fleetops-lab-01 --directory MERGED \\
        --netns-path /run/netns/fleetops-lab-01 --cgroup fleetops-lab/lab-01 \\
        --pid-file SUP.pid --nspawn-pid-file NSPAWN.pid --console-log console.log

It forks once: the first process writes the second one's PID to --pid-file and exits, so the
supervisor is nobody's child (the controller never has to reap it). Before each start it puts
systemd-nspawn into the host's own cgroups (the host's PID 1 is not systemd, so nobody else will),
and removes the empty sub-cgroups the previous boot's systemd left there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from fleetops_lab import _system as system

REBOOT_EXIT = 133
# A guest that reboots more often than this is broken: stop instead of spinning.
MAX_RESTARTS = 20
RESTART_WINDOW_S = 60.0


def nspawn_argv(machine: str, directory: str, netns_path: str) -> list[str]:
    return [
        "systemd-nspawn",
        "--boot",
        f"--directory={directory}",
        f"--machine={machine}",
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path={netns_path}",
        "--console=read-only",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
    ]


def nspawn_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_SOCKET", "LISTEN_"))}
    # /proc/sys writable in the guest, as on a real host (drop_caches then acts on the whole machine).
    env["SYSTEMD_NSPAWN_API_VFS_WRITABLE"] = "yes"
    env["SYSTEMD_LOG_COLOR"] = "0"
    return env


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor[{os.getpid()}]: {message}", flush=True)


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        child = self.child
        if child is not None and child.poll() is None:
            # SIGTERM makes systemd-nspawn power the guest off in order.
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    def start_child(self) -> subprocess.Popen[bytes]:
        args = self.args
        system.cgroup_create(args.cgroup)
        system.cgroup_prune(args.cgroup, keep_top=True)
        with Path(args.console_log).open("ab") as console:
            return subprocess.Popen(
                nspawn_argv(args.machine, args.directory, args.netns_path),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=nspawn_env(),
                cwd="/",
                # Runs in the child between fork and exec: the supervisor has no threads.
                preexec_fn=lambda: system.cgroup_join_self(args.cgroup),
            )

    def run(self) -> int:
        args = self.args
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        restarts: list[float] = []
        rc = 0
        while not self.stopping:
            try:
                self.child = self.start_child()
            except OSError as exc:
                _log(f"cannot start systemd-nspawn: {exc}")
                return 1
            system.write_text_atomic(Path(args.nspawn_pid_file), f"{self.child.pid}\n")
            _log(f"started systemd-nspawn pid {self.child.pid}")
            if self.stopping:  # a signal arrived while we were starting it
                self.on_signal(signal.SIGTERM, None)
            rc = self.child.wait()
            _log(f"systemd-nspawn exited with {rc}")
            with contextlib.suppress(OSError):
                Path(args.nspawn_pid_file).unlink()
            if rc != REBOOT_EXIT or self.stopping:
                break
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(restarts) > MAX_RESTARTS:
                _log(f"guest rebooted {len(restarts)} times in {RESTART_WINDOW_S:g} s: giving up")
                break
            _log("guest rebooted: starting it again")
        system.cgroup_prune(args.cgroup, keep_top=True)
        return 0 if rc in (0, REBOOT_EXIT) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetops_lab.supervisor")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--directory", required=True)
    parser.add_argument("--netns-path", required=True)
    parser.add_argument("--cgroup", required=True)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--nspawn-pid-file", required=True)
    parser.add_argument("--console-log", required=True)
    parser.add_argument("--foreground", action="store_true", help="do not fork (for debugging)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.foreground:
        pid = os.fork()
        if pid > 0:
            system.write_text_atomic(Path(args.pid_file), f"{pid}\n")
            os._exit(0)
        os.setsid()
    else:
        system.write_text_atomic(Path(args.pid_file), f"{os.getpid()}\n")
    me = os.getpid()
    try:
        return Supervisor(args).run()
    finally:
        if system.read_pid_file(Path(args.pid_file)) == me:
            with contextlib.suppress(OSError):
                Path(args.pid_file).unlink()
        _log("exiting")


if __name__ == "__main__":
    sys.exit(main())
