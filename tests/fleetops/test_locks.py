"""Host locks under concurrency (issue 14): owned (rollout, controller, pid, token), a live holder is
never overridden, release removes only our own, no link is followed. Real processes, real files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.rollout.locks import HostLocks, LockError
from fleetops.rollout.state import Rollout, new_rollout
from fleetops.util import pid_space


def _rollout(tmp_path: Path, hosts: list[str]) -> Rollout:
    return new_rollout(
        action="reboot",
        apply=True,
        inventory=[tmp_path / "inv.yml"],
        extravars={},
        plan={"batches": [hosts], "hosts": len(hosts)},
        max_failures=0,
        cooldown=0,
        gate=True,
        state_path=tmp_path / "state.json",
    )


@pytest.fixture
def live_pid() -> Iterator[int]:
    """A live process of this controller that is not us (another fleetops, as far as a lock can tell)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(path: Path, rollout: Rollout, pid: int, machine: str | None = None, token: str = "t0") -> None:
    """A lock of ``pid`` on ``machine`` (default: this controller, this PID namespace)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    record = {"rollout": rollout.id, "operator": "bob@ctl", "pid": pid, "token": token,
              "machine": machine or socket.gethostname(), "space": pid_space(),
              "state": rollout.state_path}  # fmt: skip
    path.write_text(json.dumps(record))


def test_a_lock_records_its_owner_and_is_created_private(tmp_path: Path) -> None:
    r = _rollout(tmp_path, ["a"])
    locks = HostLocks(tmp_path / "locks")
    locks.acquire(["a"], r)
    held = json.loads((tmp_path / "locks" / "a.lock").read_text())
    assert held["rollout"] == r.id and held["pid"] == os.getpid() and held["machine"] == socket.gethostname()
    assert held["space"] == pid_space()  # where that pid is this process (test_controller_identity.py)
    assert held["token"] == locks.token and len(held["token"]) == 32
    assert (tmp_path / "locks" / "a.lock").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "locks").stat().st_mode & 0o777 == 0o700
    locks.release()
    assert not (tmp_path / "locks" / "a.lock").exists()


def test_another_rollout_is_refused_all_or_nothing(tmp_path: Path) -> None:
    first, second = _rollout(tmp_path, ["a", "b"]), _rollout(tmp_path, ["b", "c"])
    HostLocks(tmp_path / "locks").acquire(["a", "b"], first)
    with pytest.raises(
        LockError, match=r"Failed to lock 1 host\(s\) held by a running rollout: b \(rollout"
    ) as exc:
        HostLocks(tmp_path / "locks").acquire(["b", "c"], second)
    assert exc.value.exit_code == 4
    assert not (tmp_path / "locks" / "c.lock").exists()


def test_a_live_holder_is_never_taken_not_by_resume_nor_break_lock(tmp_path: Path, live_pid: int) -> None:
    r = _rollout(tmp_path, ["a"])
    _plant(tmp_path / "locks" / "a.lock", r, live_pid)
    for break_lock in (False, True, r.id):
        with pytest.raises(
            LockError, match=rf"held by a running rollout: a \(rollout {r.id} by bob@ctl, pid {live_pid} on "
        ) as exc:
            HostLocks(tmp_path / "locks").acquire(["a"], r, break_lock=break_lock)  # the same rollout too
        assert "A live holder is never broken (not by --break-lock, not by a resume)" in str(exc.value)
    assert json.loads((tmp_path / "locks" / "a.lock").read_text())["pid"] == live_pid


def test_a_dead_holder_of_the_same_rollout_is_taken_back(tmp_path: Path, dead_pid: int) -> None:
    r, other = _rollout(tmp_path, ["a"]), _rollout(tmp_path, ["a"])
    _plant(tmp_path / "locks" / "a.lock", r, dead_pid)
    with pytest.raises(LockError, match=r"held by another rollout: a .*not running: stale\?"):
        HostLocks(tmp_path / "locks").acquire(["a"], other)  # another rollout: only with --break-lock
    with pytest.raises(LockError):
        HostLocks(tmp_path / "locks").acquire(["a"], other, break_lock="20000101T000000Z-000000")
    locks = HostLocks(tmp_path / "locks")
    locks.acquire(["a"], r)  # the resume after a kill
    assert json.loads((tmp_path / "locks" / "a.lock").read_text())["token"] == locks.token


def test_break_lock_takes_a_stale_or_remote_holder_named_or_any(tmp_path: Path, dead_pid: int) -> None:
    r, other = _rollout(tmp_path, ["a", "b"]), _rollout(tmp_path, ["a", "b"])
    _plant(tmp_path / "locks" / "a.lock", r, dead_pid)
    _plant(tmp_path / "locks" / "b.lock", r, os.getpid(), machine="other-controller")
    with pytest.raises(LockError, match="another controller"):
        HostLocks(tmp_path / "locks").acquire(["b"], other)
    locks = HostLocks(tmp_path / "locks")
    locks.acquire(["a", "b"], other, break_lock=r.id)
    assert {json.loads(p.read_text())["rollout"] for p in (tmp_path / "locks").glob("*.lock")} == {other.id}


def test_release_removes_only_our_own(tmp_path: Path, dead_pid: int) -> None:
    r, other = _rollout(tmp_path, ["a"]), _rollout(tmp_path, ["a"])
    mine = HostLocks(tmp_path / "locks")
    mine.acquire(["a"], r)
    # while we ran, an operator broke our lock and another rollout took the host
    (tmp_path / "locks" / "a.lock").unlink()
    _plant(tmp_path / "locks" / "a.lock", other, dead_pid, token="theirs")
    mine.release()
    assert json.loads((tmp_path / "locks" / "a.lock").read_text())["token"] == "theirs"


def test_no_link_is_followed(tmp_path: Path) -> None:
    r = _rollout(tmp_path, ["a"])
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "locks").mkdir(mode=0o700)
    (tmp_path / "locks" / "a.lock").symlink_to(target)
    with pytest.raises(LockError, match=r"a \(rollout unknown \(not a readable lock file\)"):
        HostLocks(tmp_path / "locks").acquire(["a"], r)
    HostLocks(tmp_path / "locks").acquire(["a"], r, break_lock=True)  # the link goes, never written through
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "locks" / "a.lock").is_symlink()
    linked = tmp_path / "linked-locks"
    linked.symlink_to(tmp_path / "locks")
    with pytest.raises(LockError, match="Failed to open the lock directory"):
        HostLocks(linked).acquire(["b"], r)


def test_racing_rollouts_one_wins(tmp_path: Path) -> None:
    """Two processes take the same hosts at once: exactly one holds them (O_EXCL), the other is refused."""
    script = (
        "import sys; from pathlib import Path; from fleetops.rollout.locks import HostLocks, LockError\n"
        "from fleetops.rollout.state import new_rollout\n"
        "r = new_rollout(action='reboot', apply=True, inventory=[], extravars={}, plan={'batches': []},"
        " max_failures=0, cooldown=0, gate=True, state_path=Path(sys.argv[2]))\n"
        "hosts = [f'h{i}' for i in range(200)]\n"
        "try:\n    HostLocks(Path(sys.argv[1])).acquire(hosts, r)\nexcept LockError:\n    sys.exit(4)\n"
        "import time; time.sleep(3)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "locks"), str(tmp_path / f"s{i}.json")]
        )
        for i in range(2)
    ]
    codes = sorted(p.wait() for p in procs)
    assert codes == [0, 4]
