"""Host locks (one lock file per host) and, for EC2 targets, the instances' tag lease, held together."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fleetops.errors import FleetopsError
from fleetops.exitcodes import ExitCode
from fleetops.rollout.state import Rollout, state_home
from fleetops.util import atomic_write, pid_alive


class LockError(FleetopsError):
    """Another rollout holds a lock on some of the hosts."""

    exit_code = ExitCode.LOCKED


class HostLocks:
    """One lock file per host: a rollout takes all its hosts' locks before it acts, or none.

    A lock names the rollout, its operator and PID. The same rollout (on --resume) takes its own
    locks back; another rollout is refused, even when the holder looks dead — breaking a stale lock
    is an explicit operator decision (``--break-lock``).
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or state_home() / "locks"
        self.held: list[Path] = []

    def _path(self, host: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
        return self.dir / f"{safe}.lock"

    def acquire(self, hosts: Sequence[str], rollout: Rollout, break_lock: bool | str = False) -> None:
        """Take every host's lock or none; ``break_lock``: True breaks any other holder, a rollout id only that one."""
        self.dir.mkdir(parents=True, exist_ok=True)
        conflicts: list[str] = []
        for host in hosts:
            path = self._path(host)
            holder = _read_lock(path)
            if holder and holder.get("rollout") != rollout.id:
                if break_lock is True or (break_lock and break_lock == holder.get("rollout")):
                    path.unlink(missing_ok=True)
                    continue
                alive = pid_alive(int(holder.get("pid", 0))) and holder.get("machine") == socket.gethostname()
                conflicts.append(
                    f"{host} (rollout {holder.get('rollout')} by {holder.get('operator')}, pid {holder.get('pid')}"
                    f"{'' if alive else ', not running: stale?'}, state {holder.get('state')})"
                )
        if conflicts:
            raise LockError(
                f"Failed to lock {len(conflicts)} host(s) held by another rollout: {'; '.join(conflicts[:5])}"
                + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
                + ". Wait for it, resume it, or pass --break-lock [ROLLOUT] if it is stale"
            )
        record = {
            "rollout": rollout.id,
            "operator": rollout.operator,
            "pid": os.getpid(),
            "machine": socket.gethostname(),
            "state": rollout.state_path,
            "since": time.time(),
        }
        for host in hosts:
            path = self._path(host)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_lock(path)
                if holder and holder.get("rollout") != rollout.id:
                    self.release()
                    raise LockError(
                        f"Failed to lock {host}: rollout {holder.get('rollout')} took it just now"
                    ) from None
                atomic_write(path, json.dumps(record) + "\n")  # our own lock from before a kill
            else:
                with os.fdopen(fd, "w") as handle:
                    handle.write(json.dumps(record) + "\n")
            self.held.append(path)

    def release(self) -> None:
        for path in self.held:
            path.unlink(missing_ok=True)
        self.held = []


def _read_lock(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"rollout": "unknown (unreadable lock file)", "pid": 0}
    return data if isinstance(data, dict) else {"rollout": "unknown", "pid": 0}


@contextlib.contextmanager
def locked(
    rollout: Rollout, hosts: Sequence[str], break_lock: bool | str, say: Callable[[str], None] | None = None
) -> Iterator[Callable[[], str | None] | None]:
    """Hold every host's lock (and the EC2 lease, when the hosts are EC2 instances) for the rollout's
    lifetime; yields the guard the engine asks before each batch (None: nothing to ask).

    Apply only: a dry run changes nothing.
    """
    if not rollout.apply:
        yield None
        return
    locks = HostLocks()
    locks.acquire(hosts, rollout, break_lock)
    lease = None
    try:
        lease = _ec2_lease(rollout, hosts, say)
        if lease is not None:
            lease.acquire(break_lock)
            lease.start()
        yield lease.check if lease is not None else None
    finally:
        try:
            if lease is not None:
                lease.release()
        finally:
            locks.release()


def _ec2_lease(rollout: Rollout, hosts: Sequence[str], say: Callable[[str], None] | None) -> Any:
    """The rollout's EC2 lease (fleetops.rollout.lease.Ec2Lease), or None when its hosts are not EC2 instances."""
    if not rollout.lease or not rollout.lease.get("instances"):
        return None
    from fleetops.rollout.lease import DEFAULT_SETTLE_S, Ec2Lease, connection_for

    wanted = set(hosts)
    instances = {h: t for h, t in rollout.lease["instances"].items() if h in wanted}
    if not instances:
        return None
    connection = connection_for([Path(p) for p in rollout.inventory])

    def tell(line: str) -> None:
        if say is not None:
            say(line)

    if connection is None:
        tell("lease: no fleetops.node.ec2 inventory source found: no EC2 lease (the local lock still holds)")
        return None
    return Ec2Lease(
        connection=connection,
        instances=instances,
        rollout=rollout.id,
        operator=rollout.operator,
        ttl=float(rollout.lease.get("ttl") or 900),
        settle=float(rollout.lease.get("settle", DEFAULT_SETTLE_S)),
        say=tell,
    )
