"""The rollout engine's pieces that need no host: state, locks, gates, failure budgets, outcomes."""

from __future__ import annotations

import base64
import io
import json
import os
import re
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


# ---- issue 14: the guards wired into the engine and the API (fake runner and scanner where a host
# would be needed; ansible-inventory, ansible-playbook and ansible-runner are real where they run here).


def _inventory(
    tmp_path: Path, hosts: dict[str, dict[str, Any]], groups: dict[str, list[str]] | None = None
) -> Path:
    import yaml

    children = {g: {"hosts": {h: {} for h in members}} for g, members in (groups or {}).items()}
    data = {
        "all": {
            "hosts": {h: {"ansible_connection": "local", **v} for h, v in hosts.items()},
            "children": children,
        }
    }
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("FLEETOPS_STATE_DIR", str(home))
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    return home


def _no_runs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record any attempt to run a playbook, scan or preflight (none must happen when a guard refuses)."""
    import fleetops.api as api_mod

    calls: list[Any] = []
    monkeypatch.setattr(api_mod, "preflight", lambda *a, **k: calls.append(("preflight", a)) or {})
    monkeypatch.setattr(api_mod, "run_scan", lambda *a, **k: calls.append(("scan", a)) or {})
    monkeypatch.setattr(api_mod, "PlaybookBatchRunner", lambda *a, **k: calls.append(("runner", a)))
    return calls


@pytest.mark.parametrize("name", ["!spare", "gpu-*", "a,b", "~web.*", "-x", "@hosts"])
def test_hostile_names_are_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path, name: str
) -> None:
    from fleetops import api
    from fleetops.errors import UsageError

    inv = _inventory(tmp_path, {"ok-1": {}, name: {}})
    calls = _no_runs(monkeypatch)
    with pytest.raises(UsageError, match=rf"host name {re.escape(repr(name))} "):
        api.plan(api.PlanRequest(action="reboot", inventory=[inv]))
    with pytest.raises(UsageError, match="host name"):
        api.remediate(api.RemediationRequest(action="reboot", inventory=[inv], apply=True))
    with pytest.raises(UsageError, match="host name"):
        api.scan(api.ScanRequest(inventory=[inv]))
    assert calls == []
    assert not (state_home / "locks").exists() and not (state_home / "rollouts").exists()


def test_a_host_named_like_a_group_is_refused(tmp_path: Path, state_home: Path) -> None:
    from fleetops import api
    from fleetops.errors import UsageError

    # "spare" is a group (without hosts of its own: only a child of another group) and a host
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    spare: {ansible_connection: local}\n    ok-1: {ansible_connection: local}\n"
        "  children:\n    pool:\n      children:\n        spares: {}\n"
    )
    assert api.plan(api.PlanRequest(action="reboot", inventory=[inv], limit="ok-1")).plan.hosts == 1
    inv.write_text(inv.read_text().replace("spares: {}", "spare: {}"))
    with pytest.raises(UsageError, match="is also the name of the inventory group 'spare'"):
        api.plan(api.PlanRequest(action="reboot", inventory=[inv], limit="ok-1:spare"))


def test_empty_never_means_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path) -> None:
    from fleetops import api
    from fleetops.errors import UsageError

    calls = _no_runs(monkeypatch)
    inv = _inventory(tmp_path, {"a": {}})
    with pytest.raises(UsageError, match="--limit 'nothing' matches no host: nothing to do"):
        api.remediate(api.RemediationRequest(action="reboot", inventory=[inv], limit="nothing", apply=True))
    empty = tmp_path / "empty.yml"
    empty.write_text("all:\n  hosts: {}\n")
    with pytest.raises(UsageError, match=rf"the inventory {re.escape(str(empty))} matches no host"):
        api.remediate(api.RemediationRequest(action="reboot", inventory=[empty], apply=True))
    with pytest.raises(UsageError, match="matches no host"):
        api.scan(api.ScanRequest(inventory=[empty]))
    assert calls == []


def test_kube_drain_refuses_a_bad_node_name_at_plan_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path
) -> None:
    from fleetops import api
    from fleetops.errors import UsageError

    calls = _no_runs(monkeypatch)
    inv = _inventory(tmp_path, {"n1": {"k8s_node_name": "--all-namespaces"}, "n2": {}})
    request = api.RemediationRequest(
        action="reboot", inventory=[inv], apply=True, params={"kube_drain": True}
    )
    with pytest.raises(UsageError, match=r"Kubernetes node name '--all-namespaces' \(of host 'n1'\)"):
        api.remediate(request)
    assert calls == []


class ScriptedRunner(FakeRunner):
    """FakeRunner whose hosts' results come from ``script`` ({host: TaskResult status or a callable})."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, str] = {}  # host -> message (failed)
        self.timeout_hosts: dict[str, int] = {}  # host -> task timeout period
        self.extra: list[str] = []  # hosts outside the batch that "ran"
        self.run_status = "successful"

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        run = super().__call__(hosts, extravars, check=check, on_result=on_result, cancel=cancel)
        run.status = self.run_status
        for host in hosts:
            if host in self.fail:
                run.tasks[host] = [TaskResult(host, "failed", "x", "x", {"msg": self.fail[host]})]
            if host in self.timeout_hosts:
                period = self.timeout_hosts[host]
                result = {
                    "msg": f"Task failed: Timed out after {period} second(s).",
                    "timedout": {"period": period},
                }
                run.tasks[host] = [TaskResult(host, "failed", "x", "x", result)]
            if self.run_status == "timeout":
                run.tasks.pop(host, None)
        for host in self.extra:
            run.tasks[host] = [TaskResult(host, "ok", "x", "x", {"changed": True})]
        return run


def _scripted(
    tmp_path: Path, batches: list[list[str]], max_failures: int = 0
) -> tuple[Engine, ScriptedRunner]:
    rollout = _rollout(tmp_path, batches)
    rollout.max_failures = max_failures
    runner = ScriptedRunner()
    runner.rollout = rollout
    return Engine(rollout=rollout, actions=("x",), runner=runner, scanner=fake_scanner), runner


def test_hosts_outside_the_batch_stop_the_rollout_and_are_audited(tmp_path: Path, state_home: Path) -> None:
    from fleetops.api import rollout_exit_code

    engine, runner = _scripted(tmp_path, [["a"], ["b"], ["c"]])
    runner.on_batch = lambda n: runner.extra.append("spare-9") if n == 2 else None
    rollout = engine.run()
    assert rollout.status == "stopped" and rollout_exit_code(rollout) == 3
    assert rollout.stopped is not None
    assert rollout.stopped["reason"].startswith("1 host(s) outside the batch ran the playbook: spare-9")
    assert rollout.hosts == {"a": "done", "b": "running", "c": "pending"}  # b in doubt, c untouched
    assert runner.batches == [["a"], ["b"]]
    lines = [json.loads(ln) for ln in (tmp_path / "audit.jsonl").read_text().splitlines()]
    extra = [e for e in lines if e["host"] == "spare-9"]
    assert len(extra) == 1 and extra[0]["result"]["msg"].startswith("ran outside its batch: 1 host(s)")


def test_failed_hosts_make_the_exit_code_3_and_resume_runs_them_again(
    tmp_path: Path, state_home: Path
) -> None:
    from fleetops.api import rollout_exit_code

    engine, runner = _scripted(tmp_path, [["a", "b"], ["c"]], max_failures=1)
    runner.fail["b"] = "boom"
    rollout = engine.run()
    assert rollout.status == "done" and rollout.hosts == {"a": "done", "b": "failed", "c": "done"}
    assert rollout_exit_code(rollout) == 3
    saved = Rollout.load(tmp_path / "state.json")
    resumed, again = _scripted(tmp_path, [])
    resumed.rollout = again.rollout = saved
    again.fail["b"] = "still broken"
    assert resumed.run().hosts["b"] == "failed"
    assert again.batches == [["b"]]  # run again, not judged done by a rescan
    assert rollout_exit_code(saved) == 3
    resumed, again = _scripted(tmp_path, [])
    resumed.rollout = again.rollout = saved
    assert resumed.run().hosts == {"a": "done", "b": "done", "c": "done"}
    assert again.batches == [["b"]] and rollout_exit_code(saved) == 0


def test_preflight_skipped_and_in_doubt_hosts_are_not_ok(tmp_path: Path) -> None:
    from fleetops.api import rollout_exit_code

    r = _rollout(tmp_path, [["a"]])
    r.hosts = {"a": "done", "z": "skipped"}
    r.status = "done"
    assert rollout_exit_code(r) == 3
    r.hosts = {"a": "done"}
    assert rollout_exit_code(r) == 0
    r.hosts = {"a": "running"}
    assert rollout_exit_code(r) == 3
