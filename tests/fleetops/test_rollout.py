"""The rollout engine's pieces that need no host: state, locks, gates, failure budgets, outcomes."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.cli.progress import ConsoleObserver
from fleetops.cli.remediate import _failure_budget
from fleetops.rollout.budget import FailureBudget
from fleetops.rollout.engine import Engine
from fleetops.rollout.gate import generic_gate
from fleetops.rollout.locks import HostLocks, LockError
from fleetops.rollout.outcome import HostOutcome, host_outcome
from fleetops.rollout.preflight import _ssh_params
from fleetops.rollout.state import Rollout, new_rollout
from fleetops.schemas import DocumentError


def _rollout(tmp_path: Path, hosts: list[list[str]]) -> Rollout:
    return new_rollout(
        action="reboot",
        apply=True,
        inventory=[tmp_path / "inv.yml"],
        extravars={"fleetops_reboot_timeout": 60},
        plan={"batches": hosts, "hosts": sum(len(b) for b in hosts)},
        max_failures=0,
        cooldown=0,
        gate=True,
        state_path=tmp_path / "state.json",
    )


def test_state_round_trips_and_rejects_foreign_files(tmp_path: Path) -> None:
    r = _rollout(tmp_path, [["a"], ["b", "c"]])
    r.hosts["a"] = "done"
    r.results["a"] = HostOutcome(status="ok", changed=True, before={"boot_id": "x"})
    r.save()
    assert json.loads((tmp_path / "state.json").read_text())["results"]["a"] == {
        "status": "ok",
        "changed": True,
        "before": {"boot_id": "x"},
    }
    back = Rollout.load(tmp_path / "state.json")
    assert back.hosts == {"a": "done", "b": "pending", "c": "pending"}
    assert back.results == r.results
    assert back.pending() == ["b", "c"]
    assert back.summary() == {"hosts": 3, "done": 1, "failed": 0, "pending": 2, "skipped": 0, "changed": 1}
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something/else"}))
    expected = r"other\.json: schema: Input should be 'fleetops\.rollout\.engine-state/v1'"
    with pytest.raises(DocumentError, match=expected):
        Rollout.load(tmp_path / "other.json")
    with pytest.raises(DocumentError, match=r"missing\.json: no such file"):
        Rollout.load(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(DocumentError, match=r"broken\.json: not valid JSON"):
        Rollout.load(tmp_path / "broken.json")


def test_locks_refuse_another_rollout_and_let_the_same_one_back(tmp_path: Path) -> None:
    first, second = _rollout(tmp_path, [["a", "b"]]), _rollout(tmp_path, [["b", "c"]])
    locks = HostLocks(tmp_path / "locks")
    locks.acquire(["a", "b"], first)
    with pytest.raises(LockError, match=r"Failed to lock 1 host\(s\) held by another rollout: b \(rollout"):
        HostLocks(tmp_path / "locks").acquire(["b", "c"], second)
    assert not (tmp_path / "locks" / "c.lock").exists()  # all or nothing
    # the same rollout (a resume after a kill) takes its own locks back
    HostLocks(tmp_path / "locks").acquire(["a", "b"], first)
    # a stale holder is only broken on request
    held = json.loads((tmp_path / "locks" / "b.lock").read_text())
    assert held["rollout"] == first.id and held["pid"] == os.getpid()
    other = HostLocks(tmp_path / "locks")
    other.acquire(["b", "c"], second, break_lock=True)
    assert json.loads((tmp_path / "locks" / "b.lock").read_text())["rollout"] == second.id
    other.release()
    assert list((tmp_path / "locks").glob("[bc].lock")) == []


@pytest.mark.parametrize(
    ("text", "hosts", "tolerated"),
    [("0", 50, 0), ("3", 50, 3), ("10%", 50, 5), ("10%", 9, 0), ("100%", 7, 7), ("0%", 100, 0)],
)
def test_failure_budget(text: str, hosts: int, tolerated: int) -> None:
    assert FailureBudget.parse(text).tolerated(hosts) == tolerated


@pytest.mark.parametrize("bad", ["-1", "x", "101%", "1.5"])
def test_failure_budget_rejects(bad: str) -> None:
    import argparse

    with pytest.raises(ValueError, match="not a host count >= 0 or a percentage 0-100%"):
        FailureBudget.parse(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="not a host count"):
        _failure_budget(bad)  # the CLI's --max-failures type


CRIT = {
    "check": "crashloop_unit",
    "severity": "critical",
    "summary": "x.service loops",
    "data": {"unit": "x.service"},
}


def test_generic_gate() -> None:
    ok = {"status": "ok", "findings": []}
    assert generic_gate(None, ok) is None
    assert generic_gate({"findings": [CRIT]}, {"status": "ok", "findings": [CRIT]}) is None  # not new
    assert "new critical finding: x.service loops" in str(
        generic_gate({"findings": []}, {"status": "ok", "findings": [CRIT]})
    )
    assert "host unreachable after the batch" in str(
        generic_gate(None, {"status": "unreachable", "msg": "no route"})
    )


def _slurp(host: str, boot: str) -> TaskResult:
    content = base64.b64encode(boot.encode()).decode()
    return TaskResult(host, "ok", "Read the boot id", "ansible.builtin.slurp", {"content": content})


def test_host_outcome_reads_boot_ids_even_when_the_reboot_failed() -> None:
    reboot = TaskResult("a", "ok", "Reboot", "ansible.builtin.reboot", {"changed": True, "rebooted": True})
    out = host_outcome([_slurp("a", "b1\n"), reboot, _slurp("a", "b2\n")], ("ansible.builtin.reboot",))
    assert out.status == "ok" and out.changed is True
    assert out.before == {"boot_id": "b1"} and out.after == {"boot_id": "b2"}
    timed_out = TaskResult("a", "failed", "Reboot", "ansible.builtin.reboot", {"msg": "Timed out waiting"})
    out = host_outcome([_slurp("a", "b1"), timed_out], ("ansible.builtin.reboot",))
    assert out.status == "failed" and out.msg == "Timed out waiting"
    assert out.before == {"boot_id": "b1"}  # what a resume needs to tell whether it rebooted


def test_ssh_params_from_hostvars() -> None:
    host = InventoryHost(
        "lab-01",
        "lab-1a",
        hostvars={
            "ansible_host": "10.213.0.11",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": "/var/lib/fleetops/lab/id_ed25519",
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/var/lib/fleetops/lab/known_hosts -o StrictHostKeyChecking=yes",
        },
    )
    params = _ssh_params(host)
    assert params == {
        "hostname": "10.213.0.11",
        "port": 22,
        "username": "root",
        "key_filename": "/var/lib/fleetops/lab/id_ed25519",
        "known_hosts": ["/var/lib/fleetops/lab/known_hosts"],
    }
    assert _ssh_params(InventoryHost("localhost", None, hostvars={"ansible_connection": "local"})) is None


def test_fix_reports_the_hosts_that_still_need_a_reboot(tmp_path: Path) -> None:
    from fleetops.api import needs_reboot

    r = _rollout(tmp_path, [["a", "b", "c"]])
    r.results["a"] = HostOutcome(
        status="ok", result={"tasks": [{"changed": True}, {"needs_reboot": True, "freed": 3}]}
    )
    r.results["b"] = HostOutcome(status="ok", result={"needs_reboot": False, "freed": 1500})
    r.results["c"] = HostOutcome(status="failed", msg="unreachable")
    assert needs_reboot(r) == ["a"]


# ---- Ctrl-C, progress, named --break-lock: the engine with a fake batch runner and scanner (no hosts
# here); the Ctrl-C handling is the API's (fleetops.api._ctrl_c), the progress the CLI's observer.


class FakeRunner:
    """A batch runner whose every host succeeds (the remediation task changed); ``on_batch`` runs mid-batch."""

    def __init__(self) -> None:
        self.on_batch: Callable[[int], None] | None = None
        self.batches: list[list[str]] = []
        self.rollout: Rollout | None = None

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        self.batches.append(list(hosts))
        if self.on_batch is not None and self.rollout is not None:
            self.on_batch(len(self.rollout.batches))
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            tr = TaskResult(host, "ok", "x", "x", {"changed": True})
            run.tasks[host] = [tr]
            if on_result is not None:
                on_result(tr)
        return run


def fake_scanner(hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {h: {"status": "ok", "findings": []} for h in hosts}


def _engine(
    tmp_path: Path, batches: list[list[str]], terminal: bool = False
) -> tuple[Engine, FakeRunner, io.StringIO]:
    out = io.StringIO()
    observer = ConsoleObserver(Console(file=out, force_terminal=terminal, width=200))
    rollout = _rollout(tmp_path, batches)
    runner = FakeRunner()
    runner.rollout = rollout
    engine = Engine(rollout=rollout, actions=("x",), runner=runner, scanner=fake_scanner, observer=observer)
    return engine, runner, out


def _run(engine: Engine) -> Rollout:
    from fleetops.api import _ctrl_c

    with _ctrl_c(engine, engine.observer):
        return engine.run()


def test_first_ctrl_c_finishes_the_batch_then_stops_with_the_state_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    engine, runner, out = _engine(tmp_path, [["a"], ["b", "c"], ["d"]])
    runner.on_batch = lambda n: os.kill(os.getpid(), signal.SIGINT) if n == 2 else None
    rollout = _run(engine)
    assert rollout.status == "interrupted"
    assert rollout.hosts == {"a": "done", "b": "done", "c": "done", "d": "pending"}  # batch 2 completed
    saved = Rollout.load(tmp_path / "state.json")
    assert saved.status == "interrupted" and saved.stopped is not None
    assert saved.stopped["pending"] == ["d"] and saved.stopped["in_doubt"] == []
    text = out.getvalue()
    assert "stopping after the current batch; Ctrl-C again to abort now" in text
    assert f"resume with: fleetops remediate --resume {tmp_path / 'state.json'}" in text
    assert "progress: batch 2/3 finished: batches done 2/3, hosts finished 3/4, failed 0" in text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    # --resume goes on from there
    resumed, again, _ = _engine(tmp_path, [])
    resumed.rollout = again.rollout = saved
    assert _run(resumed).status == "done" and set(saved.hosts.values()) == {"done"}
    assert again.batches == [["d"]]  # only what was left


def test_second_ctrl_c_aborts_the_batch_and_leaves_its_hosts_in_doubt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    engine, runner, _ = _engine(tmp_path, [["a"], ["b", "c"], ["d"]])

    def twice(n: int) -> None:
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    runner.on_batch = twice
    rollout = _run(engine)
    assert rollout.status == "interrupted"
    saved = Rollout.load(tmp_path / "state.json")
    # b and c were in flight: kept "running", which --resume probes before acting (as after a kill)
    assert saved.hosts == {"a": "done", "b": "running", "c": "running", "d": "pending"}
    assert saved.stopped is not None and saved.stopped["in_doubt"] == ["b", "c"]
    assert saved.pending() == ["b", "c", "d"]


def test_progress_is_a_transient_line_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    engine, runner, out = _engine(tmp_path, [["a"], ["b"]], terminal=True)
    observer = engine.observer
    assert isinstance(observer, ConsoleObserver)
    seen: list[str] = []
    runner.on_batch = lambda n: seen.append(observer.describe())
    assert _run(engine).status == "done"
    assert seen == ["batches 0/2 · in flight 1 (a) · failed 0", "batches 1/2 · in flight 1 (b) · failed 0"]
    assert "progress:" not in out.getvalue()  # no plain lines on a terminal


def test_break_lock_can_name_the_rollout_whose_locks_it_breaks(tmp_path: Path) -> None:
    first, second = _rollout(tmp_path, [["a"]]), _rollout(tmp_path, [["a"]])
    HostLocks(tmp_path / "locks").acquire(["a"], first)
    with pytest.raises(LockError):
        HostLocks(tmp_path / "locks").acquire(["a"], second, break_lock="20000101T000000Z-000000")
    HostLocks(tmp_path / "locks").acquire(["a"], second, break_lock=first.id)
    assert json.loads((tmp_path / "locks" / "a.lock").read_text())["rollout"] == second.id
