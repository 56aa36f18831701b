"""The rollout engine's pieces that need no host: state, locks, gates, failure budgets, outcomes."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetops.ansible.inventory import InventoryHost
from fleetops.ansible.runner import PlaybookRun, TaskResult
from fleetops.cli.observer import ConsoleObserver
from fleetops.cli.remediate import _failure_budget
from fleetops.documents import DocumentError
from fleetops.rollout.budget import FailureBudget
from fleetops.rollout.engine import Engine
from fleetops.rollout.gate import generic_gate
from fleetops.rollout.outcome import HostOutcome, host_outcome
from fleetops.rollout.preflight import _ssh_params
from fleetops.rollout.state import Rollout, new_rollout
from tests.paths import KUBECTL_STANDIN


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
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a background job of a non-interactive shell
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
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is restored
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
    assert [s.rsplit(" · ", 1)[0] for s in seen] == [
        "batches 0/2 · in flight 1 (a) · failed 0",
        "batches 1/2 · in flight 1 (b) · failed 0",
    ]
    # the rate and time left: unknown until a host is done (test_scan_output checks the numbers)
    assert seen[0].endswith(" · ETA ?")
    assert re.search(r" · [\d,.]+ hosts/(s|min), ETA \d+(s|m\d\ds|h\d\dm)$", seen[1]), seen[1]
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
    import fleetops.api.verbs as api_mod
    from fleetops.api import launch

    calls: list[Any] = []
    monkeypatch.setattr(launch, "preflight", lambda *a, **k: calls.append(("preflight", a)) or {})
    monkeypatch.setattr(api_mod, "run_scan", lambda *a, **k: calls.append(("scan", a)) or {})
    monkeypatch.setattr(launch, "PlaybookBatchRunner", lambda *a, **k: calls.append(("runner", a)))
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


def test_kubectl_gets_the_node_name_after_double_dash_with_a_request_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rolling_reboot.yml run by real ansible-playbook on this controller (local connection) with the
    kubectl stand-in (tests/kubectl_standin/kubectl), whose drain of the node fails: the host is not
    rebooted, the node is uncordoned again, and every kubectl argv has its options first,
    ``--request-timeout``, then ``--`` and the node name (here a name that looks like an option, as a
    playbook run without fleetops may meet)."""
    from fleetops.ansible.runner import RunnerOptions, run_playbook

    kube_state = tmp_path / "kubectl.json"
    kube_state.write_text(json.dumps({"nodes": {"--all": {}}}))
    monkeypatch.setenv("FLEETOPS_KUBECTL_STATE", str(kube_state))
    monkeypatch.setenv("FLEETOPS_KUBECTL_FAIL_DRAIN", "--all")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    inv = _inventory(
        tmp_path, {"node-a": {"k8s_node_name": "--all", "ansible_python_interpreter": sys.executable}}
    )
    run = run_playbook(
        RunnerOptions(
            playbook="fleetops.node.rolling_reboot",
            inventory=[inv],
            extravars={
                "fleetops_kube_drain": True,
                "fleetops_kubectl": str(KUBECTL_STANDIN),
                "fleetops_kubeconfig": str(kubeconfig),
                "fleetops_host_timeout": 60,
                "fleetops_kube_request_timeout": 7,
            },
        )
    )
    results = run.results_for("node-a")
    assert [r.task for r in results if r.status == "failed"][-1] == "Fail the host (not rebooted)"
    assert not any(r.action == "ansible.builtin.reboot" and r.status == "ok" for r in results)
    calls = json.loads(kube_state.read_text())["calls"]
    verbs = [
        next(a for a in c if a in ("version", "get", "cordon", "annotate", "drain", "uncordon"))
        for c in calls
    ]
    assert verbs == ["version", "get", "cordon", "annotate", "drain", "uncordon", "annotate"]
    for call in calls[1:]:
        assert call[-1] == "--all" or call[-2] == "--all", call
        dash = call.index("--")
        assert call[dash + 1] == "--all", call
        assert "--request-timeout=7s" in call[:dash], call
        assert not [a for a in call[dash + 2 :] if a.startswith("-")], call  # no option after the name
    assert calls[4][calls[4].index("--") - 1].startswith("--timeout="), calls[4]  # drain's options before


def _timeout_playbook(tmp_path: Path) -> Path:
    playbook = tmp_path / "slow.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Slow remediation\n"
        '      timeout: "{{ fleetops_host_timeout | default(0) | int }}"\n'
        "      ansible.builtin.command: sleep {{ fleetops_sleep | default(30) }}\n"
    )
    return playbook


def _real_engine(tmp_path: Path, hosts: list[list[str]], extravars: dict[str, Any]) -> Engine:
    from fleetops.rollout.batch import PlaybookBatchRunner

    inv = _inventory(tmp_path, {h: {"ansible_python_interpreter": sys.executable} for b in hosts for h in b})
    rollout = _rollout(tmp_path, hosts)
    rollout.extravars = extravars
    rollout.gate = False
    runner = PlaybookBatchRunner(str(_timeout_playbook(tmp_path)), [inv])
    return Engine(rollout=rollout, actions=("ansible.builtin.command",), runner=runner, scanner=fake_scanner)


def _sleepers(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", marker.encode()]:
                out.append(int(entry))
    return out


def _left_running(marker: str, within: float = 5.0) -> list[int]:
    """The ``sleep MARKER`` processes still alive once the kernel has had ``within`` seconds to end those
    the run killed: a SIGKILL is delivered, not waited for, and on a loaded machine the process may show in
    /proc for a moment after ``kill`` returned. One that lives on past that was never stopped."""
    deadline = time.monotonic() + within
    while (left := _sleepers(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_host_past_its_task_timeout_fails_timed_out_and_the_breaker_counts_it(
    tmp_path: Path, state_home: Path
) -> None:
    from fleetops.api import rollout_exit_code

    engine = _real_engine(tmp_path, [["h1"], ["h2"]], {"fleetops_host_timeout": 2, "fleetops_sleep": 31})
    started = time.monotonic()
    rollout = engine.run()
    assert time.monotonic() - started < 25
    assert rollout.hosts == {"h1": "failed", "h2": "pending"}  # the breaker (0 tolerated) stopped it
    assert rollout.results["h1"].msg == "timed out after 2 s: Task failed: Timed out after 2 second(s)."
    assert rollout.status == "stopped" and rollout_exit_code(rollout) == 3
    assert _left_running("31") == []


def test_the_batch_run_is_bounded_by_the_host_timeout_plus_a_margin(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetops.rollout import batch

    assert batch.runner_timeout(3, {"fleetops_host_timeout": 600}) == 600 + batch.RUNNER_MARGIN_S
    assert batch.runner_timeout(120, {"fleetops_host_timeout": 600}) == 3 * 600 + batch.RUNNER_MARGIN_S
    assert batch.runner_timeout(3, {}) is None
    monkeypatch.setattr(batch, "RUNNER_MARGIN_S", 2)
    # a playbook whose task ignores the knob (sleep 32): the runner's own limit ends the run
    engine = _real_engine(tmp_path, [["h1", "h2"]], {"fleetops_host_timeout": 1, "fleetops_sleep": "32"})
    engine.rollout.max_failures = 5
    engine.runner = batch.PlaybookBatchRunner(str(tmp_path / "slow2.yml"), engine.runner.inventory)  # type: ignore[attr-defined]
    (tmp_path / "slow2.yml").write_text(
        _timeout_playbook(tmp_path)
        .read_text()
        .replace('      timeout: "{{ fleetops_host_timeout | default(0) | int }}"\n', "")
    )
    started = time.monotonic()
    rollout = engine.run()
    assert time.monotonic() - started < 20
    assert rollout.hosts == {"h1": "failed", "h2": "failed"}
    assert (
        rollout.results["h1"].msg
        == "timed out after 1 s: the batch's ansible run was ended at its time limit"
    )
    time.sleep(1)
    assert _left_running("32") == []


def test_host_timeout_is_checked_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetops.cli.app import main
    from fleetops.errors import UsageError
    from fleetops.remediations import REMEDIATIONS

    for bad, why in (
        ("0", "must be between 1 and 86400"),
        ("x", "must be whole seconds"),
        ("90000", "must be between 1 and 86400"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["remediate", "reclaim", "--host-timeout", bad])
        assert exc.value.code == 2
        assert f"argument --host-timeout: {why}" in capsys.readouterr().err
    reboot = REMEDIATIONS["reboot"]
    assert reboot.host_timeout == 1800 and REMEDIATIONS["reclaim"].host_timeout == 600
    with pytest.raises(
        UsageError, match="--host-timeout 700 must be more than --reboot-timeout 600 \\+ --drain-timeout 600"
    ):
        reboot.check_host_timeout(700, {"fleetops_reboot_timeout": 600, "fleetops_drain_timeout": 600})
    assert (
        reboot.check_host_timeout(1201, {"fleetops_reboot_timeout": 600, "fleetops_drain_timeout": 600})
        == 1201
    )


def test_every_remediation_task_has_a_time_limit() -> None:
    import yaml

    from tests.paths import REPO

    def tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for t in items:
            if "block" in t:
                yield from tasks(t["block"])
                yield from tasks(t.get("rescue") or [])
            elif "ansible.builtin.import_tasks" in t:
                yield from tasks(
                    yaml.safe_load((REPO / "playbooks" / t["ansible.builtin.import_tasks"]).read_text())
                )
            else:
                yield t

    for path in sorted((REPO / "playbooks").glob("*.yml")):
        if path.name == "scan.yml":
            continue
        for play in yaml.safe_load(path.read_text()):
            for task in tasks(play["tasks"]):
                if "ansible.builtin.reboot" in task:
                    assert "timeout" not in task and "reboot_timeout" in task["ansible.builtin.reboot"]
                    continue
                assert "timeout" in task, (path.name, task["name"])


def _signal_run(tmp_path: Path, signum: int) -> tuple[Engine, FakeRunner, Rollout]:
    from fleetops.api import _ctrl_c
    from fleetops.rollout.locks import locked

    engine, runner, _ = _engine(tmp_path, [["a"], ["b", "c"], ["d"]])

    def during(n: int) -> None:
        if n == 2:
            os.kill(os.getpid(), signum)

    runner.on_batch = during
    with locked(engine.rollout, ["a", "b", "c", "d"], False) as _held, _ctrl_c(engine, engine.observer):
        assert len(list((Path(os.environ["FLEETOPS_STATE_DIR"]) / "locks").glob("*.lock"))) == 4
        rollout = engine.run()
    return engine, runner, rollout


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_abort_at_once_state_saved_lock_released(
    tmp_path: Path, state_home: Path, signum: int, code: int
) -> None:
    from fleetops.api import rollout_exit_code

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}  # SIG_IGN under nohup
    engine, _runner, rollout = _signal_run(tmp_path, signum)
    assert engine.abort_requested.is_set() and rollout.status == "interrupted"
    saved = Rollout.load(tmp_path / "state.json")
    assert saved.status == "interrupted" and saved.stopped is not None
    assert saved.hosts == {"a": "done", "b": "running", "c": "running", "d": "pending"}
    assert saved.stopped["in_doubt"] == ["b", "c"] and saved.stopped["signal"] == signum
    assert saved.stopped["reason"] == f"aborted mid-batch ({signal.Signals(signum).name})"
    assert rollout_exit_code(saved) == code
    assert list((state_home / "locks").glob("*.lock")) == []
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers it found are restored


def test_sigterm_ends_the_batch_s_ansible_workers(tmp_path: Path, state_home: Path) -> None:
    """A real ansible run (sleep 33 on two hosts) aborted by SIGTERM: back within seconds, no worker left."""
    from fleetops.api import _ctrl_c, rollout_exit_code

    engine = _real_engine(tmp_path, [["h1", "h2"]], {"fleetops_host_timeout": 120, "fleetops_sleep": "33"})

    def later() -> None:
        deadline = time.monotonic() + 20
        while not _sleepers("33") and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    with _ctrl_c(engine, engine.observer):
        rollout = engine.run()
    took = time.monotonic() - started
    assert rollout_exit_code(rollout) == 143 and rollout.hosts == {"h1": "running", "h2": "running"}
    assert took < 30
    time.sleep(0.5)
    assert _left_running("33") == []


def _guarded(tmp_path: Path, batches: list[list[str]], **settings: Any) -> tuple[Engine, ScriptedRunner]:
    engine, runner = _scripted(tmp_path, batches, max_failures=10)
    engine.rollout.plan["guards"] = settings
    return engine, runner


def test_capacity_floor_stops_before_a_batch_that_would_take_more_from_its_group(
    tmp_path: Path, state_home: Path
) -> None:
    from fleetops.api import rollout_exit_code

    group_of = {"a1": "az1", "a2": "az1", "a3": "az1", "b1": "az2", "b2": "az2", "z": "az1"}
    engine, runner = _guarded(
        tmp_path, [["a1", "b1"], ["a2", "b2"], ["a3"]], max_unhealthy="1", group_of=group_of
    )
    engine.rollout.hosts["z"] = "skipped"  # unreachable at preflight: unhealthy already
    runner.fail["a1"] = "boom"
    rollout = engine.run()
    # az1's hosts are held back (pending); az2's host of the same batch still runs: a degraded AZ
    # never blocks a healthy one
    assert runner.batches == [["a1", "b1"], ["b2"]]
    assert rollout.status == "stopped" and rollout_exit_code(rollout) == 3
    assert rollout.stopped is not None and rollout.stopped["reason"].startswith(
        "group az1: 2 of its 4 hosts are unhealthy (a1 z), more than the 1 that --max-unhealthy 1 allows"
    )
    assert rollout.stopped["pending"] == ["a2", "a3"]


def test_capacity_floor_lets_other_groups_and_healthy_groups_go(tmp_path: Path, state_home: Path) -> None:
    group_of = {"a1": "az1", "a2": "az1", "b1": "az2", "b2": "az2"}
    engine, runner = _guarded(
        tmp_path, [["a1"], ["b1"], ["b2"], ["a2"]], max_unhealthy="0", group_of=group_of
    )
    runner.fail["a1"] = "boom"
    rollout = engine.run()
    assert runner.batches == [["a1"], ["b1"], ["b2"]]  # az2 unaffected; a2 waits: az1 has a1 down
    assert rollout.stopped is not None and rollout.stopped["reason"].startswith("group az1: 1 of its 2 hosts")


def test_deadline_stops_before_the_next_batch(tmp_path: Path, state_home: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from fleetops.api import rollout_exit_code

    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    now = [start]
    engine, runner = _guarded(
        tmp_path, [["a"], ["b"], ["c"]], not_after=(start + timedelta(minutes=30)).isoformat()
    )
    engine.clock = lambda: now[0]
    runner.on_batch = lambda n: now.__setitem__(0, start + timedelta(minutes=30)) if n == 2 else None
    rollout = engine.run()
    assert runner.batches == [["a"], ["b"]]
    assert rollout.stopped is not None
    assert rollout.stopped["reason"] == (
        "the deadline --not-after 2026-12-01T12:30:00+00:00 has passed: no further batch starts"
    )
    assert rollout.stopped["pending"] == ["c"] and rollout_exit_code(rollout) == 3


def test_not_after_and_max_unhealthy_are_checked_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetops.cli.app import main

    for args, why in (
        (["--not-after", "2001-01-01T00:00"], "is already past"),
        (["--not-after", "soon"], "not an ISO 8601 time"),
        (["--max-unhealthy", "lots"], "'lots' is not a host count or a percentage"),
        (["--max-unhealthy", "120%"], "must be between 0% and 100%"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["remediate", "reboot", *args])
        assert exc.value.code == 2
        assert why in capsys.readouterr().err


def test_the_kill_switch_stops_after_the_current_batch_saying_who_and_why(
    tmp_path: Path, state_home: Path
) -> None:
    from fleetops.api import rollout_exit_code
    from fleetops.rollout import killswitch

    # a stop of every rollout issued before this run started does not stop it
    killswitch.request_stop(None, "yesterday's incident", "carol@ctl", now=time.time() - 60)
    engine, runner = _scripted(tmp_path, [["a"], ["b"], ["c"]])
    rid = engine.rollout.id
    runner.on_batch = lambda n: killswitch.request_stop(rid, "wrong AMI", "alice@bastion") if n == 2 else None
    rollout = engine.run()
    assert runner.batches == [["a"], ["b"]]  # batch 2 finished, batch 3 never started
    assert rollout.hosts == {"a": "done", "b": "done", "c": "pending"}
    assert rollout.stopped is not None and rollout_exit_code(rollout) == 3
    assert re.fullmatch(
        rf"stopped by alice@bastion at \S+Z \(fleetops stop {rid}; \S+stop-{rid}\.json\): wrong AMI",
        rollout.stopped["reason"],
    )
    assert not (state_home / "stops" / f"stop-{rid}.json").exists()  # honoured: removed
    # --all reaches a running rollout too
    engine, runner = _scripted(tmp_path, [["a"], ["b"]])
    engine.rollout.state_path = str(tmp_path / "state2.json")
    runner.on_batch = lambda n: killswitch.request_stop(None, "freeze", "bob@ctl")
    rollout = engine.run()
    assert runner.batches == [["a"]] and "fleetops stop --all" in str(rollout.stopped)


def test_a_pause_on_this_controller_stops_a_running_rollout_before_its_next_batch_and_holds_the_next(
    tmp_path: Path, state_home: Path
) -> None:
    """No shared store: ``fleetops pause`` writes this controller's pause, and the engine's before-batch
    check (``launch.with_pause``, as api.remediate builds it) stops a running rollout after its batch and
    one started while paused before its first; an unreadable pause file holds too; unpause lifts it."""
    from fleetops.api import rollout_exit_code
    from fleetops.api.launch import with_pause
    from fleetops.rollout.engine import STOP_KILL_SWITCH
    from fleetops.rollout.pause import pause_here, pause_path, unpause_here

    engine, runner = _scripted(tmp_path, [["a"], ["b"], ["c"]])
    engine.ec2_stop = with_pause(None, None)
    runner.on_batch = lambda n: pause_here("alice@bastion", "bad AMI") if n == 2 else None
    rollout = engine.run()
    assert runner.batches == [["a"], ["b"]] and rollout.hosts["c"] == "pending"
    assert rollout.stopped is not None and rollout_exit_code(rollout) == 3
    assert rollout.stopped.get("kind") == STOP_KILL_SWITCH  # asked for by a person: an auto pass ends too
    assert re.fullmatch(
        rf"stopped by alice@bastion at \S+Z \(fleetops pause; {re.escape(str(pause_path()))}\): bad AMI",
        rollout.stopped["reason"],
    )
    # a rollout started while paused does not start its first batch
    engine, runner = _scripted(tmp_path, [["a"], ["b"]])
    engine.rollout.state_path = str(tmp_path / "state2.json")
    engine.ec2_stop = with_pause(None, None)
    assert engine.run().stopped is not None and runner.batches == []
    # a pause file that does not parse still holds (fail safe), and says so
    unpause_here()
    pause_path().write_text("{not json")
    engine, runner = _scripted(tmp_path, [["a"]])
    engine.rollout.state_path = str(tmp_path / "state3.json")
    engine.ec2_stop = with_pause(None, None)
    stopped = engine.run().stopped
    assert stopped is not None and runner.batches == [] and "unreadable pause file" in stopped["reason"]
    assert unpause_here() is not None and not pause_path().exists()
    engine, runner = _scripted(tmp_path, [["a"]])
    engine.rollout.state_path = str(tmp_path / "state4.json")
    engine.ec2_stop = with_pause(None, None)
    assert engine.run().status == "done" and runner.batches == [["a"]]


def test_a_kill_switch_stop_is_marked_as_asked_for_and_a_breaker_stop_is_not(
    tmp_path: Path, state_home: Path
) -> None:
    """An auto pass ends when a person stopped one of its rollouts (rollout.stopped["kind"]), and
    goes on after a breaker or a deadline: the mark is what tells them apart."""
    from fleetops.rollout import killswitch
    from fleetops.rollout.engine import STOP_KILL_SWITCH

    engine, runner = _scripted(tmp_path, [["a"], ["b"]])
    runner.on_batch = lambda n: killswitch.request_stop(None, "freeze", "bob@ctl")
    rollout = engine.run()
    assert rollout.stopped is not None and rollout.stopped.get("kind") == STOP_KILL_SWITCH
    assert json.loads(Path(str(rollout.state_path)).read_text())["stopped"]["kind"] == STOP_KILL_SWITCH
    killswitch.clear_stop(None)
    engine, runner = _scripted(tmp_path, [["a"], ["b"]])
    engine.rollout.state_path = str(tmp_path / "state2.json")
    runner.fail["a"] = "exploded"
    rollout = engine.run()
    assert rollout.status == "stopped" and rollout.stopped is not None and "kind" not in rollout.stopped


def test_report_says_which_hosts_keep_the_exit_code_non_zero_and_why(
    tmp_path: Path, state_home: Path
) -> None:
    from tests.helpers import fleetops

    engine, runner = _scripted(tmp_path, [["a", "b"], ["c"], ["d"]], max_failures=5)
    runner.timeout_hosts["b"] = 30
    runner.on_batch = lambda n: os.kill(os.getpid(), signal.SIGTERM) if n == 2 else None
    engine.rollout.hosts["z"] = "skipped"
    engine.rollout.results["z"] = HostOutcome(status="skipped", msg="preflight: ssh: connection refused")
    from fleetops.api import _ctrl_c

    with _ctrl_c(engine, engine.observer):
        engine.run()
    result = fleetops("report", str(tmp_path / "state.json"), env={"FLEETOPS_STATE_DIR": str(state_home)})
    assert result.rc == 3, result.stderr
    out = result.stdout
    assert "b: failed: timed out after 30 s: Task failed: Timed out after 30 second(s)." in out
    assert "z: skipped: preflight: ssh: connection refused" in out
    assert "c: in doubt (caught mid-batch; --resume probes it before acting)" in out
    assert "aborted mid-batch (SIGTERM)" in out


def test_fix_checks_names_before_its_scan_and_narrows_by_exact_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path
) -> None:
    import dataclasses

    import fleetops.scan
    from fleetops import api
    from fleetops.errors import UsageError
    from fleetops.remediations import REMEDIATIONS
    from fleetops.rollout.engine import NullObserver

    scans: list[Any] = []
    monkeypatch.setattr(fleetops.scan, "run_scan", lambda *a, **k: scans.append(a))
    hostile = _inventory(tmp_path, {"ok-1": {}, "!spare": {}})
    with pytest.raises(UsageError, match="host name '!spare'"):
        api.remediate(api.RemediationRequest(action="fix", inventory=[hostile]))
    assert scans == []  # refused before the fix's scan

    inv = _inventory(tmp_path, {"ok-1": {}, "ok-2": {}, "ok-3": {}})
    for targets, expect in ((["ok-2"], {"ok-2": "pending"}), (["ok-2", "ghost"], None)):
        narrowing = dataclasses.replace(
            REMEDIATIONS["reclaim"], prepare=lambda p, i, lim, say, t=targets: ({}, t)
        )
        request = api.RemediationRequest(action="reclaim", inventory=[inv])
        if expect is None:
            with pytest.raises(UsageError, match="its plan names host\\(s\\) outside the selection: ghost"):
                api._start(request, narrowing, NullObserver())
        else:
            rollout = api._start(request, narrowing, NullObserver())
            assert rollout is not None and rollout.hosts == expect


def test_resume_can_set_a_new_deadline_and_capacity_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime, timedelta

    import fleetops.api.verbs as api_mod
    from fleetops.cli.app import main

    engine, runner = _guarded(
        tmp_path, [["a"], ["b"]], not_after="2001-01-01T00:00:00+00:00", max_unhealthy="0"
    )
    rollout = engine.run()
    assert runner.batches == [] and "deadline" in str(rollout.stopped)  # stopped before batch 1
    seen: list[Rollout] = []
    monkeypatch.setattr(api_mod, "_execute", lambda r, *a: seen.append(r) or r)
    later = datetime.now(UTC) + timedelta(hours=2)
    api_mod.resume(
        api_mod.ResumeRequest(state=tmp_path / "state.json", not_after=later, max_unhealthy="2,10%")
    )
    assert seen[0].plan["guards"]["not_after"] == later.isoformat()
    assert seen[0].plan["guards"]["max_unhealthy"] == "2,10%"
    with pytest.raises(SystemExit) as exc:
        main(["remediate", "--resume", str(tmp_path / "state.json"), "--not-after", "2001-01-01T00:00"])
    assert exc.value.code == 2 and "is already past" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("not_after", "ran"),
    [
        ("2001-01-01T00:00Z", []),
        ("2001-01-01T00:00:00+05:00", []),
        ("2099-01-01T00:00", ["h1", "h2", "h3"]),
        ("2099-01-01T00:00:00-03:00", ["h1", "h2", "h3"]),
        ("1s", ["h1"]),  # batch 1 takes 2 s: batch 2 would start past the deadline
        ("1h", ["h1", "h2", "h3"]),
        ("", ["h1", "h2", "h3"]),
        ("tomorrow", []),
    ],
)
def test_the_playbooks_start_no_batch_after_fleetops_not_after(
    tmp_path: Path, not_after: str, ran: list[str]
) -> None:
    """playbooks/tasks/not_after.yml (what a plain or AWX run of each remediation playbook imports
    first), run by real ansible-playbook with serial 1 over three local hosts.

    Only the relative deadline "1s" needs a batch that outlasts it (sleep 2); for the others the
    remediation's length does not matter, and sleeping there would only make the test slow."""
    from fleetops.ansible.runner import RunnerOptions, run_playbook
    from tests.paths import REPO

    playbook = tmp_path / "deadline.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  serial: 1\n  tasks:\n"
        f"    - ansible.builtin.import_tasks: {REPO / 'playbooks' / 'tasks' / 'not_after.yml'}\n"
        f"    - name: Remediate\n      ansible.builtin.command: sleep {2 if not_after == '1s' else 0}\n"
    )
    inv = _inventory(
        tmp_path, {h: {"ansible_python_interpreter": sys.executable} for h in ("h1", "h2", "h3")}
    )
    run = run_playbook(
        RunnerOptions(playbook=str(playbook), inventory=[inv], extravars={"fleetops_not_after": not_after})
    )
    done = [
        h
        for h in ("h1", "h2", "h3")
        if any(t.task == "Remediate" and t.status == "ok" for t in run.results_for(h))
    ]
    assert done == ran
    refused = [t for h in run.tasks for t in run.tasks[h] if t.status == "failed"]
    if ran == ["h1", "h2", "h3"]:
        assert refused == [] and run.rc == 0
    else:
        assert run.rc != 0 and len(refused) == 1
        expected = (
            "is not an ISO 8601 time"
            if not_after == "tomorrow"
            else f"the deadline fleetops_not_after {not_after} has passed"
        )
        assert expected in refused[0].msg


def test_a_stop_reason_is_shown_as_given_not_as_markup(tmp_path: Path, state_home: Path) -> None:
    """The kill switch's reason is anyone's text: the console shows it as is (rich markup in it neither
    styles nor breaks the rollout's output)."""
    from fleetops.rollout import killswitch

    engine, runner, out = _engine(tmp_path, [["a"], ["b"]])
    rid = engine.rollout.id
    runner.on_batch = lambda n: killswitch.request_stop(rid, "[/] wrong [bold]AMI", "eve@ctl")
    rollout = engine.run()
    assert rollout.status == "stopped"
    assert "wrong [bold]AMI" in out.getvalue() and "[/]" in out.getvalue()


class ProbeRunner(ScriptedRunner):
    """Answers the reboot's probe (fleetops_probe_only) with each host's boot id (``boots``) or unreachable."""

    def __init__(self, boots: dict[str, str | None]) -> None:
        super().__init__()
        self.boots = boots
        self.probes: list[list[str]] = []

    def __call__(
        self,
        hosts: Sequence[str],
        extravars: dict[str, Any],
        *,
        check: bool,
        on_result: Callable[[TaskResult], None] | None,
        cancel: threading.Event | None,
    ) -> PlaybookRun:
        if not extravars.get("fleetops_probe_only"):
            return super().__call__(hosts, extravars, check=check, on_result=on_result, cancel=cancel)
        self.probes.append(list(hosts))
        run = PlaybookRun(status="successful", rc=0)
        for host in hosts:
            boot = self.boots.get(host)
            run.tasks[host] = (
                [_slurp(host, boot), TaskResult(host, "skipped", "Reboot", "x", {"skipped": True})]
                if boot is not None
                else [
                    TaskResult(
                        host, "unreachable", "Read the boot id", "ansible.builtin.slurp", {"msg": "no route"}
                    )
                ]
            )
        return run


def test_resume_probes_in_doubt_and_failed_reboots_and_never_reboots_twice(
    tmp_path: Path, state_home: Path
) -> None:
    from fleetops.api import rollout_exit_code
    from fleetops.remediations import REMEDIATIONS

    reboot = REMEDIATIONS["reboot"]
    rollout = _rollout(tmp_path, [["a"], ["b", "c", "d"], ["e"]])
    rollout.max_failures = 5
    rollout.hosts.update(a="done", b="running", c="failed", d="failed")
    for host in ("b", "c", "d"):
        rollout.results[host] = HostOutcome(
            status="failed", before={"boot_id": f"{host}1"}, msg="was cut short"
        )
    runner = ProbeRunner({"b": "b2", "c": "c1", "d": None, "e": "e1"})
    runner.rollout = rollout
    engine = Engine(rollout=rollout, actions=("x",), runner=runner, scanner=fake_scanner,
                    gate_check=reboot.gate, probe_vars=reboot.probe_vars)  # fmt: skip
    result = engine.run()
    assert runner.probes[0] == ["b", "c", "d"]  # the in-doubt and the failed hosts probed first
    # b rebooted already (boot id changed): verified by its gate, not rebooted again; c did not: run
    # again; d does not answer: stays failed (it may be mid-reboot)
    assert [b for b in runner.batches if b] == [["c"], ["e"]]
    assert result.hosts["b"] == "done" and result.results["b"].after == {"boot_id": "b2"}
    assert result.hosts["d"] == "failed" and "not answering on resume" in str(result.results["d"].msg)
    assert rollout_exit_code(result) == 3  # d is not done


def test_a_resume_leaves_out_hosts_gone_from_the_inventory_and_keeps_done_ones(tmp_path: Path) -> None:
    """Pending, caught (running) and failed hosts the inventory no longer lists are skipped with the
    reason (their earlier "before" kept); a done host that is gone (a replaced instance) stays done."""
    from fleetops.api import _leave_out_gone
    from fleetops.rollout.engine import NullObserver

    r = _rollout(tmp_path, [["a", "b"], ["c", "d", "e"]])
    r.hosts.update(a="done", b="running", c="failed", d="pending", e="pending")
    r.results["b"] = HostOutcome(status="running", before={"boot_id": "x"})
    _leave_out_gone(r, frozenset({"e"}), NullObserver())
    assert r.hosts == {"a": "done", "b": "skipped", "c": "skipped", "d": "skipped", "e": "pending"}
    assert r.results["b"].before == {"boot_id": "x"}
    assert r.results["d"].msg == (
        "resume: not in the inventory now (stopped or terminated, or left out by an inventory filter): "
        "left out, not touched"
    )
    assert Rollout.load(tmp_path / "state.json").hosts == r.hosts  # saved before anything runs


def test_the_gate_scanner_never_asks_ansible_for_a_host_the_inventory_lacks(tmp_path: Path) -> None:
    """Only gone hosts: "missing" at once, no ansible run (the inventory file does not even exist: a
    scan would fail on it); a limit of only such hosts would make ansible-playbook fail the scan."""
    from fleetops.rollout.batch import NOT_IN_INVENTORY, InventoryScanner

    scanner = InventoryScanner([tmp_path / "absent.yml"], frozenset({"all"}), frozenset({"kept"}))
    assert scanner(["gone-1", "gone-2"]) == {
        h: {"status": "missing", "msg": NOT_IN_INVENTORY, "findings": [], "facts": {}}
        for h in ("gone-1", "gone-2")
    }
