"""Host locks (one lock file per host) and, for EC2 targets, the instances' tag lease, held together.

A lock file records the rollout id, its operator, the controller (hostname), the PID, where that PID
means the process (``space``: the boot and PID namespace, ``fleetops.util.pid_space``) and a random
token. Rules (issue 14, issue 38):

- **A live holder is never overridden**: a lock whose holder process is alive on this controller is
  not taken, not by another rollout, not by ``--break-lock``, not even by a resume of the same
  rollout (two processes driving one rollout would act twice): ``LockError``, exit 4, naming the
  holder (pid, rollout, operator).
- A lock whose holder is gone (a dead PID on this controller, in this PID namespace) is taken back by a
  resume of the same rollout; another rollout takes it only with ``--break-lock`` (any, or that
  rollout's). A lock from another controller, or from another PID namespace with this host name (a
  hostNetwork pod, a container that keeps the host's name), cannot be checked from here: only
  ``--break-lock`` takes it. So does a lock of an older fleetops (no ``space``), though one whose PID
  is alive here is taken to be live (it may be that process).
- Locks are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` in a 0700 directory opened without
  following a link: two rollouts racing for a host cannot both win, and a planted link is never
  written through.
- **Release removes only our own**: each lock is read (without following links), compared with our
  token and only then unlinked; a lock someone broke and retook stays theirs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetops.errors import FleetopsError, UsageError
from fleetops.exitcodes import ExitCode
from fleetops.paths import state_home
from fleetops.rollout import killswitch
from fleetops.rollout.state import Rollout
from fleetops.util import pid_alive, pid_space, same_pid_space

MAX_LOCK_BYTES = 64 * 1024


class LockError(FleetopsError):
    """Another rollout (or a live process of the same one) holds a lock on some of the hosts."""

    exit_code = ExitCode.LOCKED


def _who(holder: dict[str, Any]) -> str:
    return (
        f"rollout {holder.get('rollout')} by {holder.get('operator')}, pid {holder.get('pid')} "
        f"on {holder.get('machine')}"
    )


class HostLocks:
    """One lock file per host: a rollout takes all its hosts' locks before it acts, or none."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or state_home() / "locks"
        self.held: list[str] = []  # file names in self.dir
        self.token = secrets.token_hex(16)

    @staticmethod
    def _name(host: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
        return f"{safe}.lock"

    def _path(self, host: str) -> Path:
        return self.dir / self._name(host)

    def _open_dir(self) -> int:
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.dir, 0o700)
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise LockError(
                f"Failed to open the lock directory {self.dir}: {exc.strerror} (a link?)"
            ) from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise LockError(f"Failed to use the lock directory {self.dir}: it belongs to uid {st.st_uid}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
        return fd

    @staticmethod
    def _here(holder: dict[str, Any]) -> bool:
        """The holder's PID can be checked here: this controller, this PID namespace (util.same_pid_space)."""
        return same_pid_space(holder.get("machine"), holder.get("space"))

    def live_rollouts(self) -> set[str]:
        """The rollouts whose locks a live process of this controller holds now (reads only; an absent
        lock directory holds none)."""
        if not self.dir.is_dir():
            return set()
        dir_fd = self._open_dir()
        try:
            holders = (_read_lock(dir_fd, name) for name in os.listdir(dir_fd) if name.endswith(".lock"))
            return {str(h.get("rollout")) for h in holders if h is not None and self._alive_here(h)}
        finally:
            os.close(dir_fd)

    def _alive_here(self, holder: dict[str, Any]) -> bool:
        """The holder's process is alive on this controller (and is not this very lock set). A lock of an
        older fleetops (no ``space``) with this host name and a PID alive here counts as alive too."""
        if holder.get("machine") != socket.gethostname():
            return False
        try:
            pid = int(holder.get("pid", 0))
        except (TypeError, ValueError):
            return False
        if not self._here(holder):
            return "space" not in holder and pid_alive(pid)  # another PID namespace: not checkable here
        if pid == os.getpid():
            return holder.get("token") != self.token  # this process, another lock set: live
        return pid_alive(pid)

    def acquire(self, hosts: Sequence[str], rollout: Rollout, break_lock: bool | str = False) -> None:
        """Take every host's lock or none; ``break_lock``: True breaks any stale holder, a rollout id
        only that one's. A live holder on this controller is never broken."""
        dir_fd = self._open_dir()
        try:
            self._acquire(dir_fd, hosts, rollout, break_lock)
        finally:
            os.close(dir_fd)

    def _acquire(self, dir_fd: int, hosts: Sequence[str], rollout: Rollout, break_lock: bool | str) -> None:
        live: list[str] = []
        conflicts: list[str] = []
        stale: list[tuple[str, dict[str, Any]]] = []
        for host in hosts:
            name = self._name(host)
            holder = _read_lock(dir_fd, name)
            if holder is None:
                continue
            if self._alive_here(holder):
                live.append(f"{host} ({_who(holder)}, running)")
            elif holder.get("rollout") == rollout.id and self._here(holder):
                stale.append((name, holder))  # our own rollout's lock from before a kill
            elif break_lock is True or (break_lock and break_lock == holder.get("rollout")):
                stale.append((name, holder))
            else:
                if self._here(holder):
                    where = "not running: stale?"
                elif holder.get("machine") == socket.gethostname():
                    where = "another PID namespace or an older fleetops: not checkable here"
                else:
                    where = "another controller"
                conflicts.append(f"{host} ({_who(holder)}, {where}, state {holder.get('state')})")
        if live:
            raise LockError(
                f"Failed to lock {len(live)} host(s) held by a running rollout: {'; '.join(live[:5])}"
                + (f" and {len(live) - 5} more" if len(live) > 5 else "")
                + ". A live holder is never broken (not by --break-lock, not by a resume): "
                "wait for it, or stop it (fleetops stop ROLLOUT)"
            )
        if conflicts:
            raise LockError(
                f"Failed to lock {len(conflicts)} host(s) held by another rollout: {'; '.join(conflicts[:5])}"
                + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
                + ". Wait for it, resume it, or pass --break-lock [ROLLOUT] if it is stale"
            )
        for name, holder in stale:
            _unlink_if(dir_fd, name, holder.get("token"), holder)
        record = {
            "rollout": rollout.id,
            "operator": rollout.operator,
            "pid": os.getpid(),
            "machine": socket.gethostname(),
            "space": pid_space(),
            "token": self.token,
            "state": rollout.state_path,
            "since": time.time(),
        }
        data = (json.dumps(record) + "\n").encode()
        for host in hosts:
            name = self._name(host)
            try:
                fd = os.open(
                    name,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                    dir_fd=dir_fd,
                )
            except FileExistsError:
                holder = _read_lock(dir_fd, name) or {}
                self._release(dir_fd)
                raise LockError(f"Failed to lock {host}: {_who(holder)} took it just now") from None
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            self.held.append(name)

    def release(self) -> None:
        """Remove the locks this set took, each only while it still carries our token."""
        if not self.held:
            return
        try:
            dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self.held = []
            return
        try:
            self._release(dir_fd)
        finally:
            os.close(dir_fd)

    def _release(self, dir_fd: int) -> None:
        for name in self.held:
            _unlink_if(dir_fd, name, self.token)
        self.held = []


def _read_lock(dir_fd: int, name: str) -> dict[str, Any] | None:
    """The lock's record (None: no lock); a lock that is a link, not a file or not JSON is an unknown holder."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:
        return {"rollout": "unknown (not a readable lock file)", "pid": 0}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"rollout": "unknown (not a regular file)", "pid": 0}
        raw = os.read(fd, MAX_LOCK_BYTES)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {"rollout": "unknown (unreadable lock file)", "pid": 0}
    return data if isinstance(data, dict) else {"rollout": "unknown", "pid": 0}


def _unlink_if(dir_fd: int, name: str, token: Any, expected: dict[str, Any] | None = None) -> bool:
    """Unlink ``name`` if it still is the lock we read (same token; for a tokenless one, same record)."""
    current = _read_lock(dir_fd, name)
    if current is None:
        return False
    same = current.get("token") == token if token else current == expected
    if not same:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    return True


@dataclass
class Held:
    """What ``locked`` gives the engine: the lease's guard and the kill switch's EC2 channel (None: no lease)."""

    guard: Callable[[], str | None] | None = None
    ec2_stop: Callable[[float], killswitch.StopRequest | None] | None = None


@contextlib.contextmanager
def locked(
    rollout: Rollout, hosts: Sequence[str], break_lock: bool | str, say: Callable[[str], None] | None = None
) -> Iterator[Held]:
    """Hold every host's lock (and the EC2 lease, when the hosts are EC2 instances) for the rollout's
    lifetime; yields what the engine asks before each batch.

    Apply only: a dry run changes nothing. Released however the block ends (a signal included).
    """
    if not rollout.apply:
        yield Held()
        return
    locks = HostLocks()
    locks.acquire(hosts, rollout, break_lock)
    lease = None
    try:
        lease = _ec2_lease(rollout, hosts, say)
        if lease is not None:
            lease.acquire(break_lock)
            lease.start()
        yield Held(lease.check, _ec2_stop(lease, rollout.id)) if lease is not None else Held()
    finally:
        try:
            if lease is not None:
                lease.release()
        finally:
            locks.release()


def _ec2_stop(lease: Any, rollout_id: str) -> Callable[[float], killswitch.StopRequest | None]:
    """The kill switch's EC2 channel for the lease's instances: a ``fleetops:stop`` tag that applies
    to this run (read in each region through the lease's client and retries); honoured, our own
    rollout's tag is removed (only while it has the value we read)."""

    def check(running_since: float) -> killswitch.StopRequest | None:
        for region, ids in lease._by_region().items():
            client = lease._client(region)

            def call(op: str, func: Callable[[], Any], region: str = region) -> Any:
                return lease._call(op, region, func)

            request = killswitch.pending_stop_ec2(client, ids, rollout_id, running_since, call=call)
            if request is not None:
                if request.rollout == rollout_id:
                    killswitch.clear_stop_ec2(client, ids, request, call=call)
                return request
        return None

    return check


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
    from fleetops.ansible.collection import module_utils
    from fleetops.ansible.runner import ec2_sources

    # the store the same source names (store_table; its region and endpoint default to the source's)
    source = next(ec2_sources([Path(p) for p in rollout.inventory]), None)
    try:
        store = module_utils("store").open_backend(
            source[1] if source else {},
            connection.settings(),
            connection.regions,
            user_agent="fleetops.rollout.lease",
        )
    except ValueError as exc:
        raise UsageError(f"{connection.source}: {exc}") from None
    return Ec2Lease(
        store=store,
        connection=connection,
        instances=instances,
        rollout=rollout.id,
        operator=rollout.operator,
        ttl=float(rollout.lease.get("ttl") or 900),
        settle=float(rollout.lease.get("settle", DEFAULT_SETTLE_S)),
        say=tell,
    )
