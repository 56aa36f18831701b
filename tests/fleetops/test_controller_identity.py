"""Who holds a lease or a lock, and when this controller may judge the holder dead (issue 38 item 7).

Two controllers with the same host name in different PID namespaces (hostNetwork pods, containers that keep
the host's name) each judged the other's live lease dead when its PID was free in their own namespace, and
took it over. A holder now names its boot and PID namespace (``fleetops.util.pid_space``): it is judged
dead here only when it is this machine AND this PID namespace, and its PID is gone.

Real processes: ``unshare --pid --fork --mount-proc`` (root) makes a real second PID namespace on this
machine, with this host name; in it, ns_last_pid gives the holder a PID that is dead in ours. The holder
stays alive in its namespace while this one judges it: the pass's store lease, the rollouts' store lease
and their host locks must all wait for it (expiry or --break-lock), never take it over. A holder of our own
namespace whose PID is gone is still taken over at once, as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetops import store
from fleetops.ansible.collection import module_utils
from fleetops.rollout.locks import HostLocks, LockError
from fleetops.rollout.state import Rollout, new_rollout
from fleetops.util import dead_here, pid_alive, pid_space, process_id

mu = module_utils("store")
lp = module_utils("lease")
T0 = 1.8e9

# pid 1 of the new namespace: makes the next PID there the one asked for, then starts the holder (INNER)
OUTER = """
import subprocess, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(sys.argv[1])
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[2], *sys.argv[3:]]).returncode)
"""
# the holder: takes a real host lock, says who it is, and lives until its stdin closes
INNER = """
import json, os, sys, types
from pathlib import Path
from fleetops.rollout.locks import HostLocks
from fleetops.util import pid_space, process_id
lockdir, rollout_id, operator, state = sys.argv[1:5]
HostLocks(Path(lockdir)).acquire(["a"], types.SimpleNamespace(id=rollout_id, operator=operator, state_path=state))
print(json.dumps({"pid": os.getpid(), "controller": process_id(), "space": pid_space(),
                  "host": os.uname().nodename}), flush=True)
sys.stdin.read()
os._exit(0)  # the lock stays, as a live holder's does
"""
SAY_WHO = "from fleetops.util import process_id; print(process_id())"


@dataclass
class Holder:
    pid: int  # its PID in its own namespace; dead in ours
    controller: str  # its process_id()
    space: str | None
    host: str
    rollout: Rollout  # the rollout whose lock on host "a" it holds
    locks: Path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _rollout(tmp: Path) -> Rollout:
    return new_rollout(action="reboot", apply=True, inventory=[tmp / "inv.yml"], extravars={},
                       plan={"batches": [["a"]], "hosts": 1}, max_failures=0, cooldown=0, gate=True,
                       state_path=tmp / "state.json")  # fmt: skip


@pytest.fixture(scope="module")
def other_namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Holder]:
    """A live holder in a second PID namespace of this machine, with this host name and a PID dead here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a second PID namespace")
    tmp = tmp_path_factory.mktemp("identity")
    rollout = _rollout(tmp)
    locks = tmp / "locks"
    dead = _dead_pid()
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", OUTER, str(dead - 1), INNER,
         str(locks), rollout.id, rollout.operator, str(rollout.state_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line:
        err = proc.communicate(timeout=30)[1]
        if "Operation not permitted" in err:
            pytest.skip(f"no second PID namespace here: {err.strip()[-200:]}")
        pytest.fail(f"the holder in the other namespace did not start: {err[-2000:]}")
    said = json.loads(line)
    try:
        yield Holder(said["pid"], said["controller"], said["space"], said["host"], rollout, locks)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_holder_in_another_pid_namespace_is_not_judged_dead_here_one_in_ours_still_is(
    other_namespace: Holder,
) -> None:
    theirs = other_namespace
    assert theirs.host == os.uname().nodename  # the same host name
    assert not pid_alive(theirs.pid)  # its PID is free in our namespace
    assert theirs.space is not None and theirs.space != pid_space()
    assert theirs.space.split("/")[0] == pid_space().split("/")[0]  # type: ignore[union-attr]  # same boot
    assert theirs.controller == f"{theirs.host}:{theirs.pid}:{theirs.space}"
    assert dead_here(theirs.controller) is False  # alive in its namespace: never taken over from here
    # written in our namespace by a process that is gone: dead here, as before
    gone = _ours_dead()
    assert gone.startswith(f"{theirs.host}:") and gone.endswith(f":{pid_space()}")
    assert dead_here(gone) is True
    assert dead_here(process_id()) is False  # this very process
    # an older fleetops' holder (host:pid) names no namespace: not judged dead here (expiry, --break-lock)
    assert dead_here(f"{theirs.host}:{theirs.pid}") is False
    assert dead_here(f"{theirs.host}:{theirs.pid}:-") is False  # its namespace unknown where it ran


def _ours_dead() -> str:
    return subprocess.run(
        [sys.executable, "-c", SAY_WHO], capture_output=True, text=True, check=True
    ).stdout.strip()


def _pass_lease_item(shared: store.Store, controller: str) -> None:
    doc = {"pass": "auto-theirs", "operator": "ops@pod-b", "controller": controller, "since": T0,
           "expires": T0 + store.PASS_LEASE_TTL_S}  # fmt: skip
    shared.backend.data.clear()
    shared.call(shared.backend.put, store.LEASE_KEY, doc, None)


def test_the_auto_pass_lease_of_another_namespace_is_waited_out(other_namespace: Holder) -> None:
    clock = lambda: T0 + 1  # noqa: E731
    shared = store.Store(mu.MemoryStore(clock=clock), clock=clock)
    _pass_lease_item(shared, other_namespace.controller)
    with pytest.raises(store.StoreLockedError, match="pass auto-theirs by ops@pod-b"):
        store.PassLease(shared, "auto-mine", "ops@pod-a").take()
    _pass_lease_item(shared, _ours_dead())
    mine = store.PassLease(shared, "auto-mine", "ops@pod-a")
    mine.take()  # a pass of our namespace that is gone: taken over at once
    try:
        assert mine.took_over is not None and "of this controller" in mine.took_over
        assert shared.backend.get(store.LEASE_KEY).doc["controller"] == process_id()
    finally:
        mine.release()


def test_a_rollouts_store_lease_of_another_namespace_is_waited_out(other_namespace: Holder) -> None:
    clock = lambda: T0  # noqa: E731
    backend = mu.MemoryStore(clock=clock)
    for controller, taken in ((other_namespace.controller, False), (_ours_dead(), True)):
        backend.data.clear()
        a = lp.StoreLease(backend, "20260101T000000Z-aaaaaa", {"i-1": "h"}, "op@pod-b", 600, clock=clock,
                          controller=controller)  # fmt: skip
        a.acquire()
        b = lp.StoreLease(backend, "20260101T000000Z-bbbbbb", {"i-1": "h"}, "op@pod-a", 600, clock=clock,
                          controller=process_id(), dead=dead_here)  # fmt: skip
        if taken:
            b.acquire()
            assert b.broken == ["rollout 20260101T000000Z-aaaaaa: its process on this controller is gone"]
        else:
            with pytest.raises(lp.StoreLeaseError, match="held by another rollout"):
                b.acquire()


def test_a_host_lock_of_another_namespace_is_taken_only_with_break_lock(
    other_namespace: Holder, tmp_path: Path
) -> None:
    theirs = other_namespace
    held: dict[str, Any] = json.loads((theirs.locks / "a.lock").read_text())
    assert (held["pid"], held["machine"], held["space"]) == (theirs.pid, theirs.host, theirs.space)
    # not even a resume of the same rollout takes it back: its process may well run (it does)
    for rollout in (theirs.rollout, _rollout(tmp_path)):
        with pytest.raises(LockError, match="another PID namespace or an older fleetops: not checkable here"):
            HostLocks(theirs.locks).acquire(["a"], rollout)
    assert json.loads((theirs.locks / "a.lock").read_text()) == held
    # an older fleetops' lock (no space) with a dead PID: not taken back either, only broken
    old = {k: v for k, v in held.items() if k != "space"}
    (tmp_path / "old").mkdir(mode=0o700)
    (tmp_path / "old" / "a.lock").write_text(json.dumps(old))
    with pytest.raises(LockError, match="not checkable here"):
        HostLocks(tmp_path / "old").acquire(["a"], theirs.rollout)
    # --break-lock (ROLLOUT, or any) frees either
    (tmp_path / "new").mkdir(mode=0o700)
    (tmp_path / "new" / "a.lock").write_text(json.dumps(held))
    for directory, break_lock in ((tmp_path / "old", theirs.rollout.id), (tmp_path / "new", True)):
        mine = HostLocks(directory)
        mine.acquire(["a"], _rollout(tmp_path), break_lock=break_lock)
        assert json.loads((directory / "a.lock").read_text())["token"] == mine.token
        mine.release()
